"""KL divergences the alignment families need and torch lacks (or has only indirectly).

Importing this module registers them with ``torch.distributions.kl.register_kl``, so
``pyro.infer.TraceMeanField_ELBO`` (and any ``kl_divergence`` call) uses the closed forms.

KL(Weibull(k, λ) ‖ Gamma(α, β)), β a *rate* (Zhang et al. 2018, WHAI, eq. 28 of the arXiv
version; Fan et al. 2020 §3.3). With γ the Euler–Mascheroni constant, using
E_q[log s] = log λ − γ/k, E_q[s] = λ Γ(1 + 1/k) and the Weibull entropy γ(1 − 1/k) + log(λ/k) + 1:

    KL = γα/k − α log λ + log k + βλΓ(1 + 1/k) − γ − 1 − α log β + log Γ(α)

KL(LogNormal(μ₁, σ₁) ‖ LogNormal(μ₂, σ₂)) = KL(Normal(μ₁, σ₁) ‖ Normal(μ₂, σ₂)): the KL is
invariant under the shared bijection exp.

KL(MaskedDirichlet(a) ‖ MaskedDirichlet(b)) on the same face of the simplex (sums over unmasked u,
a₀ = Σ_u a_u, b₀ = Σ_u b_u):

    KL = log Γ(a₀) − Σ log Γ(a_u) − log Γ(b₀) + Σ log Γ(b_u) + Σ (a_u − b_u)(ψ(a_u) − ψ(a₀))
"""

from __future__ import annotations

import torch
from pyro.infer.util import is_validation_enabled
from torch.distributions import Gamma, LogNormal, Normal, Weibull, kl_divergence, register_kl

from ..core.errors import UserError
from .distributions import MaskedDirichlet

__all__ = ["kl_weibull_gamma", "kl_lognormal_lognormal", "kl_masked_dirichlet", "REGISTERED"]

EULER_GAMMA = 0.5772156649015329


@register_kl(Weibull, Gamma)
def kl_weibull_gamma(p: Weibull, q: Gamma) -> torch.Tensor:
    k, lam = p.concentration, p.scale
    alpha, beta = q.concentration, q.rate
    return (
        EULER_GAMMA * alpha / k
        - alpha * torch.log(lam)
        + torch.log(k)
        + beta * lam * torch.exp(torch.lgamma(1 + 1 / k))
        - EULER_GAMMA
        - 1
        - alpha * torch.log(beta)
        + torch.lgamma(alpha)
    )


@register_kl(LogNormal, LogNormal)
def kl_lognormal_lognormal(p: LogNormal, q: LogNormal) -> torch.Tensor:
    return kl_divergence(Normal(p.loc, p.scale), Normal(q.loc, q.scale))


@register_kl(MaskedDirichlet, MaskedDirichlet)
def kl_masked_dirichlet(p: MaskedDirichlet, q: MaskedDirichlet) -> torch.Tensor:
    if p.source_mask.shape != q.source_mask.shape or (
            is_validation_enabled() and not torch.equal(p.source_mask, q.source_mask)):
        raise UserError("KL(MaskedDirichlet ‖ MaskedDirichlet) needs the same mask on both sides")
    m = p.source_mask.to(p.concentration.dtype)
    a, b = p.concentration, q.concentration
    a0, b0 = (a * m).sum(-1), (b * m).sum(-1)
    return (
        torch.lgamma(a0)
        - (torch.lgamma(a) * m).sum(-1)
        - torch.lgamma(b0)
        + (torch.lgamma(b) * m).sum(-1)
        + ((a - b) * (torch.digamma(a) - torch.digamma(a0).unsqueeze(-1)) * m).sum(-1)
    )


#: (p type, q type) → closed form; the tests check each against Monte Carlo.
REGISTERED = {
    (Weibull, Gamma): kl_weibull_gamma,
    (LogNormal, LogNormal): kl_lognormal_lognormal,
    (MaskedDirichlet, MaskedDirichlet): kl_masked_dirichlet,
}
