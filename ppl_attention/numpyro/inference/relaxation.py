"""``relax`` for NumPyro, the mirror of :mod:`ppl_attention.pyro.inference.relaxation` (same
names, arguments and maths): a guide whose structured draws are differentiable — perturbed
marginals, straight-through or implicit MLE — marked ``infer["relaxed"]`` so that the
closed-form-KL loss (:func:`~ppl_attention.numpyro.inference.methods.score_function_kl_loss`,
``ScoreFunctionKL_ELBO``) takes their pathwise gradient and no score-function term. The noise
comes from ``rng_key`` (split per site) or, without one, from ``numpyro.prng_key()`` of the
enclosing ``handlers.seed``."""

from __future__ import annotations

import jax
import numpyro
from numpyro.distributions import MaskedDistribution
from numpyro.primitives import Messenger

from ...core.errors import UserError
from ...structures.perturbation import check_relaxation

__all__ = ["relax", "relaxable"]


def relaxable(fn):
    """The distribution under masks and ``to_event`` wrappers that relaxes its draws, or None."""
    while isinstance(fn, MaskedDistribution) or hasattr(fn, "base_dist"):
        if hasattr(fn, "relaxed_sample"):
            break
        fn = fn.base_dist
    return fn if callable(getattr(fn, "relaxed_sample", None)) else None


class relax(Messenger):
    """``fn`` (a guide) with its structured draws relaxed; arguments as the Pyro side's
    :func:`~ppl_attention.pyro.inference.relaxation.relax` (``perturbation``: ``{site: ε}``),
    plus ``rng_key``."""

    def __init__(self, fn=None, kind: str = "perturbed", temperature: float = 1.0,
                 noise: str = "gumbel", noise_scale: float = 1.0, lam: float = 10.0,
                 sites=None, rng_key=None, perturbation=None):
        check_relaxation(kind, temperature, noise, noise_scale, lam)
        self.kind, self.sites, self.rng_key = kind, None if sites is None else set(sites), rng_key
        self.perturbation = dict(perturbation or {})
        self.settings = dict(temperature=temperature, noise=noise, noise_scale=noise_scale,
                             lam=lam)
        self.count = 0
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] != "sample" or msg["is_observed"] or msg.get("value") is not None:
            return
        if self.sites is not None and msg["name"] not in self.sites:
            return
        base = relaxable(msg["fn"])
        if base is None:
            if self.sites is not None:
                raise UserError(f"relax: site {msg['name']!r} has a "
                                f"{type(msg['fn']).__name__}, which has no relaxation (a "
                                f"structure of ppl_attention's structure library has)")
            return
        given = self.perturbation.get(msg["name"])
        if given is not None:
            key = None
        elif self.rng_key is not None:
            key = jax.random.fold_in(self.rng_key, self.count)
        else:
            key = numpyro.prng_key()
            if key is None:
                raise UserError("relax: the noise needs a PRNG key: give rng_key= or run the "
                                "guide under numpyro.handlers.seed")
        self.count += 1
        msg["value"] = base.relaxed_sample(self.kind, key=key, **self.settings,
                                           perturbation=given)
        msg["infer"] = dict(msg.get("infer") or {}, relaxed=self.kind)
