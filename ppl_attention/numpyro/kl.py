"""Closed-form KLs for the NumPyro mirror (the maths of :mod:`ppl_attention.pyro.kl`).

NumPyro has KL(Weibull ‖ Gamma) already; it lacks KL(LogNormal ‖ LogNormal) and the masked
Dirichlet pair. Importing this module registers them with ``numpyro.distributions.kl``, so
``TraceMeanField_ELBO`` uses the closed forms.
"""

from __future__ import annotations

from jax.scipy.special import digamma, gammaln
from numpyro.distributions import Gamma, LogNormal, Normal, Weibull
from numpyro.distributions.kl import kl_divergence

from .distributions import MaskedDirichlet

__all__ = ["kl_lognormal_lognormal", "kl_masked_dirichlet", "kl_weibull_gamma", "REGISTERED"]


@kl_divergence.register(LogNormal, LogNormal)
def kl_lognormal_lognormal(p, q):
    """= KL(Normal(μ₁, σ₁) ‖ Normal(μ₂, σ₂)); KL is invariant under the shared bijection exp."""
    return kl_divergence(Normal(p.loc, p.scale), Normal(q.loc, q.scale))


@kl_divergence.register(MaskedDirichlet, MaskedDirichlet)
def kl_masked_dirichlet(p, q):
    """log Γ(a₀) − Σ log Γ(a_u) − log Γ(b₀) + Σ log Γ(b_u) + Σ (a_u − b_u)(ψ(a_u) − ψ(a₀))."""
    m = p.source_mask.astype(p.concentration.dtype)
    a, b = p.concentration, q.concentration
    a0, b0 = (a * m).sum(-1), (b * m).sum(-1)
    return (gammaln(a0) - (gammaln(a) * m).sum(-1) - gammaln(b0) + (gammaln(b) * m).sum(-1)
            + ((a - b) * (digamma(a) - digamma(a0)[..., None]) * m).sum(-1))


def kl_weibull_gamma(p, q):
    """NumPyro's own closed form (registered by NumPyro)."""
    return kl_divergence(p, q)


REGISTERED = {(Weibull, Gamma): kl_weibull_gamma, (LogNormal, LogNormal): kl_lognormal_lognormal,
              (MaskedDirichlet, MaskedDirichlet): kl_masked_dirichlet}
