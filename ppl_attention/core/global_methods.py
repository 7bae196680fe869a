"""Methods for models with global latent variables (a ``latents`` declaration with priors, e.g.
a Bayesian IBM Model 2's translation table and distortion tension): the alignment is summed out
exactly by enumeration inside the model, and the *globals* are inferred —

- ``nuts``, ``hmc``: Markov chain Monte Carlo (NumPyro's NUTS / HMC, several chains) — the
  reference posterior every other method is compared against;
- ``svi-normal``, ``svi-lowrank``, ``svi-delta``: stochastic variational inference with an
  autoguide over the globals (``AutoNormal``: mean-field Gaussian in the unconstrained space;
  ``AutoLowRankMultivariateNormal``; ``AutoDelta``: MAP), ``TraceEnum_ELBO``.

Both backends' registries of alignment methods (:mod:`.methods`) stay apart from these: a
model declares global latents to take them, and they run under NumPyro (its MCMC and
autoguides), on the whole training set at once. Written once here; the NumPyro side
(``ppl_attention.numpyro.inference.bayes``) runs them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError

__all__ = ["GlobalMethodSpec", "GLOBAL_METHODS", "global_method", "is_global_method"]


@dataclass(frozen=True)
class GlobalMethodSpec:
    """``kind``: ``"mcmc"`` (``kernel`` NUTS or HMC; ``warmup``, ``samples`` per chain,
    ``chains``) or ``"svi"`` (``autoguide``; ``samples`` drawn from the fitted guide)."""

    name: str
    description: str
    kind: str
    kernel: str | None = None
    autoguide: str | None = None
    warmup: int = 500
    samples: int = 1000
    chains: int = 4


GLOBAL_METHODS: dict[str, GlobalMethodSpec] = {m.name: m for m in [
    GlobalMethodSpec("nuts", "NUTS over the global latents, alignments enumerated (the "
                     "reference)", "mcmc", kernel="NUTS"),
    GlobalMethodSpec("hmc", "HMC (fixed trajectory length) over the global latents",
                     "mcmc", kernel="HMC"),
    GlobalMethodSpec("svi-normal", "SVI, AutoNormal (mean-field Gaussian) over the globals",
                     "svi", autoguide="AutoNormal"),
    GlobalMethodSpec("svi-lowrank", "SVI, AutoLowRankMultivariateNormal over the globals",
                     "svi", autoguide="AutoLowRankMultivariateNormal"),
    GlobalMethodSpec("svi-delta", "SVI, AutoDelta (MAP) over the globals", "svi",
                     autoguide="AutoDelta"),
]}


def is_global_method(name: str) -> bool:
    return name in GLOBAL_METHODS


def global_method(name: str) -> GlobalMethodSpec:
    try:
        return GLOBAL_METHODS[name]
    except KeyError:
        raise UserError(f"unknown method {name!r} for global latents; valid: "
                        f"{', '.join(GLOBAL_METHODS)}") from None
