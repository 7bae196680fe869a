"""Evaluation under NumPyro: the quantities of :mod:`ppl_attention.inference.evaluate` (exact
NLL/token by enumeration for soft and categorical models, an IWAE bound otherwise, ELBO/token,
MAP alignments) computed by the NumPyro twin of a run's model, jitted. ``evaluate(run, …,
backend="numpyro")`` assembles the same report from these."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers

from ...errors import UserError
from ...models.base import declared
from ..batching import to_jax
from ..nn import from_torch, sub
from .methods import enumerated_guide_loss, get_method, make_elbo

MULTIPLE = "bucket"  # S and T padded up to a few bucket lengths: few shapes, few compilations


def twin_class(model_class):
    """The NumPyro twin a model class declares (``numpyro_twin = "module:Class"``)."""
    target = declared(model_class, "numpyro_twin")
    if not target:
        raise UserError(f"{model_class.__name__} has no NumPyro twin (declare numpyro_twin = "
                        f"'module:Class' of one; docs/architecture.md): use --backend pyro")
    module, _, name = target.partition(":")
    import importlib

    return getattr(importlib.import_module(module), name)


def twin_of(torch_model, training: bool = False):
    """(twin, params): the NumPyro twin of a torch model and its weights (``training``: the twin
    that trains, which refuses what it cannot train)."""
    cls = twin_class(type(torch_model))
    if training:
        return cls.from_torch(torch_model, training=True)
    return cls.from_torch(torch_model)


class Twin:
    """A run's model under NumPyro: the twin network, its weights and jitted functions."""

    def __init__(self, run, params=None):
        self.model, p = twin_of(run.model)
        self.params = p if params is None else params
        self.method = run.method
        # the Markov family is exact and enumerable: evaluated as a categorical one
        fam = self.model.family
        self.kind = ("soft" if fam.deterministic else
                     "categorical" if self.model.markov else fam.name)
        spec = get_method(run.method) if run.method in _numpyro_methods() else None
        self.posterior = "inference"
        if spec is not None and spec.posterior != "none":
            self.posterior = spec.posterior
        self.analytic_kl = spec is not None and spec.elbo_name == "TraceMeanField_ELBO"

    @functools.cached_property
    def token_log_likelihood(self):
        m = self.model
        fn = m.soft_token_log_likelihood if self.kind == "soft" else m.exact_token_log_likelihood
        return jax.jit(fn)

    @functools.cached_property
    def exact_posterior(self):
        return jax.jit(self.model.exact_posterior)

    @functools.cached_property
    def prior_scores(self):
        m = self.model

        def scores(params, b):
            H = m.encode(params, b.src, b.src_mask)
            return m.decode(params, H, b.src_mask, b.tgt_in)[1]

        return jax.jit(scores)

    @functools.cached_property
    def guide_scores(self):
        m = self.model

        def scores(params, b):
            H = m.encode(params, b.src, b.src_mask)
            if self.posterior == "inference":
                return m.inference_scores(params, b, H)
            return m.decode(params, H, b.src_mask, b.tgt_in)[1]

        return jax.jit(scores)

    def _guide(self, b, **kw):
        return self.model.guide(b, posterior=self.posterior, **kw)

    @functools.cached_property
    def iwae(self):
        """(params, batch, keys [K]) → log (1/K) Σ_k p(y, z_k | x)/q(z_k | x, y) per pair."""
        m = self

        def log_weight(params, b, key):
            sub = {m.model.param_name: params}
            g = handlers.trace(handlers.seed(handlers.substitute(m._guide, data=sub), key)
                               ).get_trace(b)
            mt = handlers.trace(handlers.replay(handlers.substitute(m.model.model, data=sub), g)
                                ).get_trace(b)
            lw = 0.0
            for trace, sign in ((mt, 1.0), (g, -1.0)):
                for site in trace.values():
                    if site["type"] == "sample":
                        lw = lw + sign * site["fn"].log_prob(site["value"]).sum(-1)
            return lw

        def iwae(params, b, keys):
            lw = jax.vmap(lambda k: log_weight(params, b, k))(keys)
            return jax.nn.logsumexp(lw, 0) - math.log(keys.shape[0])

        return jax.jit(iwae)

    @functools.cached_property
    def elbo_loss(self):
        """(params, batch, key) → −ELBO summed over the batch, KL weight 1."""
        m = self
        if self.kind == "categorical":
            def loss(params, b, key):
                return enumerated_guide_loss(key, params, m.model.model, m._guide, b,
                                             m.model.param_name)
        else:
            elbo = make_elbo("TraceMeanField_ELBO" if self.analytic_kl else "Trace_ELBO")

            def loss(params, b, key):
                return elbo.loss(key, {m.model.param_name: params}, m.model.model, m._guide, b)
        return jax.jit(loss)


@functools.lru_cache(maxsize=1)
def _numpyro_methods():
    from .methods import METHODS

    return frozenset(METHODS)


def twin(run, params=None) -> Twin:
    """The run's :class:`Twin` (jitted functions cached on the run) with the weights
    ``params``, or the run's model's current weights."""
    t = getattr(run, "_numpyro_twin", None)
    if t is None or t.method != run.method:
        t = Twin(run)
        run._numpyro_twin = t
    t.params = from_torch(run.model.state_dict()) if params is None else params
    return t


def _jax_batches(batches):
    rows = max(b.size for b in batches)
    return [to_jax(b, rows, MULTIPLE) for b in batches]


def nll_per_token(run, batches, iwae_k: int = 10, seed: int = 0, params=None) -> float:
    t = twin(run, params)
    total, n = 0.0, 0
    key = jax.random.PRNGKey(seed)
    for b, jb in zip(batches, _jax_batches(batches)):
        if t.kind in ("soft", "categorical"):
            total -= float(t.token_log_likelihood(t.params, jb).sum())
        else:
            key, k = jax.random.split(key)
            total -= float(t.iwae(t.params, jb, jax.random.split(k, iwae_k))[: b.size].sum())
        n += b.n_tokens
    return total / n


def elbo_per_token(run, batches, samples: int = 5, seed: int = 0) -> float:
    t = twin(run)
    spec = get_method(run.method) if run.method in _numpyro_methods() else None
    if t.kind == "soft" or spec is None or spec.posterior == "none":
        return -nll_per_token(run, batches)
    reps = 1 if t.kind == "categorical" else samples
    key = jax.random.PRNGKey(seed)
    total, n = 0.0, 0
    for b, jb in zip(batches, _jax_batches(batches)):
        for _ in range(reps):
            key, k = jax.random.split(key)
            total += float(t.elbo_loss(t.params, jb, k)) / reps
        n += b.n_tokens
    return -total / n


def map_alignments(run, batch) -> np.ndarray:
    """argmax_j p(z_t = j | x, y) (exact) for categorical models, of the attention weights for
    soft, of q's mean weights (its scores' argmax) otherwise; ``[B, T]``."""
    t = twin(run)
    jb = to_jax(batch, None, MULTIPLE)
    B, S = batch.src.shape
    T = batch.tgt_out.shape[1]
    if t.kind == "categorical":
        a = t.exact_posterior(t.params, jb)
    elif t.kind == "soft":
        a = t.model.family.deterministic_weights(t.prior_scores(t.params, jb), jb.src_mask[:, None],
                                                 sub(t.params, "family"))
    else:
        a = jnp.where(jb.src_mask[:, None], t.guide_scores(t.params, jb), -jnp.inf)
    return np.asarray(jnp.argmax(a, -1))[:B, :T]


def alignment_links(run, batches) -> dict[int, set[tuple[int, int]]]:
    """As the Pyro side's, with this module's MAP alignments."""
    from ...inference.evaluate import alignment_links as links

    return links(run, batches, map_fn=map_alignments)
