"""Methods for models with global latent variables (a ``latents`` declaration with priors, e.g.
a Bayesian IBM Model 2's translation table and distortion tension): the alignment is summed out
exactly by enumeration inside the model, and the *globals* are inferred —

- ``nuts``, ``hmc``: Markov chain Monte Carlo (NumPyro's NUTS / HMC, several chains) — the
  reference posterior every other method is compared against;
- ``svi-normal``, ``svi-lowrank``, ``svi-delta``: stochastic variational inference with an
  autoguide over the globals (``AutoNormal``: mean-field Gaussian in the unconstrained space;
  ``AutoLowRankMultivariateNormal``; ``AutoDelta``: MAP), ``TraceEnum_ELBO``;
- ``gibbs``, ``vb``: for a model that declares ``conjugate`` (the word aligners, whose tables
  are Dirichlet given the alignments): blocked Gibbs sampling — every alignment drawn given the
  tables, then the tables from their Dirichlet posteriors — with NumPyro's ``MCMC``, and
  mean-field variational Bayes by closed-form coordinate ascent (its posterior draws from
  q(tables)).

Both backends' registries of alignment methods (:mod:`.methods`) stay apart from these: a
model declares global latents to take them, and they run under NumPyro (its MCMC and
autoguides), on the whole training set at once. Written once here; the NumPyro side
(``ppl_attention.numpyro.inference.bayes``) runs them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UserError

__all__ = ["GlobalMethodSpec", "GLOBAL_METHODS", "global_method", "is_global_method",
           "global_methods_for"]


@dataclass(frozen=True)
class GlobalMethodSpec:
    """``kind``: ``"mcmc"`` (``kernel`` NUTS, HMC or Gibbs; ``warmup``, ``samples`` per
    chain, ``chains``), ``"svi"`` (``autoguide``; ``samples`` drawn from the fitted guide) or
    ``"vb"`` (``warmup``: the most coordinate-ascent sweeps; ``samples`` drawn from q);
    ``requires``: a declaration the model must make (``conjugate`` for Gibbs and VB)."""

    name: str
    description: str
    kind: str
    kernel: str | None = None
    autoguide: str | None = None
    warmup: int = 500
    samples: int = 1000
    chains: int = 4
    requires: str | None = None


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
    GlobalMethodSpec("gibbs", "blocked Gibbs: all alignments given the tables, the tables "
                     "from their Dirichlet posteriors (conjugate aligners)", "mcmc",
                     kernel="Gibbs", warmup=200, samples=1000, requires="conjugate"),
    GlobalMethodSpec("vb", "mean-field variational Bayes, closed-form coordinate ascent "
                     "(conjugate aligners)", "vb", warmup=200, samples=1000, chains=1,
                     requires="conjugate"),
]}


def is_global_method(name: str) -> bool:
    return name in GLOBAL_METHODS


def global_method(name: str) -> GlobalMethodSpec:
    try:
        return GLOBAL_METHODS[name]
    except KeyError:
        raise UserError(f"unknown method {name!r} for global latents; valid: "
                        f"{', '.join(GLOBAL_METHODS)}") from None


def global_methods_for(model_or_cls) -> list[str]:
    """The methods for global latents a model can take: all but those requiring a declaration
    it does not make (a declaration not made is False)."""
    return [name for name, m in GLOBAL_METHODS.items()
            if m.requires is None or getattr(model_or_cls, m.requires, False)]
