"""Decoding under NumPyro: the stepper of a model with the ``predictive`` capability — a
NumPyro model's own members, or the twin of a Pyro model on its weights — for the search of
:mod:`ppl_attention.common.decoding` (the same search as under Pyro, so greedy output and beam
scores
agree on twin weights)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...core.errors import MissingCapability
from ...data.batching import collate
from ..jax_batches import to_jax
from .evaluate import model_and_params

__all__ = ["JaxStepper", "stepper"]


def _members(model):
    """A NumPyro model's decoding members (``start_decoding`` / ``decoding_step`` /
    ``keep_hypotheses``, reading their parameters through ``numpyro.param``) as pure functions
    of the run's parameter map, for ``jax.jit``."""
    from ..models.base import call

    if not all(callable(getattr(model, n, None)) for n in ("start_decoding", "decoding_step",
                                                           "keep_hypotheses")):
        raise MissingCapability(f"{type(model).__name__} has no predictive members "
                                f"(start_decoding / decoding_step / keep_hypotheses)")
    return (lambda p, *a: call(model.start_decoding, p, *a),
            lambda p, *a: call(model.decoding_step, p, *a),
            lambda st, rows, toks: model.keep_hypotheses(st, rows, toks))


class JaxStepper:
    """One NumPyro model's side of a search (jitted per number of live hypotheses)."""

    def __init__(self, run, source: list[str]):
        b = collate([(source, [])], [0], run.src_vocab, run.tgt_vocab, array="numpy")
        jb = to_jax(b)
        self.model, self.params = model_and_params(run, jb)
        start, step, keep = _members(self.model)
        store = self.model.__dict__.setdefault("_jitted", {})
        if "decoding" not in store:
            store["decoding"] = (jax.jit(start), jax.jit(step), jax.jit(keep))
        self._start, self._step, self._keep = store["decoding"]
        self.state = self._start(self.params, jb.src, jb.src_mask)

    def log_probs(self, prev) -> np.ndarray:
        logp, self.state = self._step(self.params, self.state, jnp.asarray(list(prev)))
        return np.asarray(logp)

    def keep(self, rows, tokens) -> None:
        self.state = self._keep(self.state, jnp.asarray(list(rows)), jnp.asarray(list(tokens)))


def stepper(run, source: list[str]) -> JaxStepper:
    """The search's NumPyro side for ``run`` on one ``source`` (a list of tokens)."""
    return JaxStepper(run, source)
