"""Simplex distributions over a *ragged* set of source positions.

``torch.distributions.Dirichlet`` and ``RelaxedOneHotCategorical`` need every category to have
positive mass, but a padded source position must get exactly zero attention. The two classes here
take a boolean ``mask [..., S]`` and are the ordinary distribution on the face of the simplex
spanned by the unmasked positions: samples are exactly 0 on masked positions and ``log_prob``
is the density over the n = Σ mask free coordinates. With an all-true mask they equal the torch
distributions (tested).
"""

from __future__ import annotations

import torch
from pyro.distributions import TorchDistribution
from torch.distributions import constraints
from torch.distributions.utils import broadcast_all

__all__ = ["MaskedDirichlet", "MaskedRelaxedCategorical", "categorical_draws",
           "position_log_probs", "safe_log"]


def categorical_draws(probs: torch.Tensor, num_samples: int,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """``num_samples`` draws with replacement from each row of ``probs [N, S]`` → ``[N, K]``
    on ``probs``' device. With a ``generator`` they are drawn where it lives (a CPU generator
    gives the same draws on every device), as ``torch.multinomial`` needs. A row with no mass
    (a padded or end-of-sequence token, where a model's ``exact_posterior`` may be all 0) draws
    position 0, which the target mask then drops (NumPyro's draws there are uniform over the
    positions — safe-log logits all equal — and dropped the same way)."""
    empty = probs.sum(-1) == 0
    first = torch.zeros_like(probs)
    first[..., 0] = 1
    probs = torch.where(empty[..., None], first, probs)  # no host sync: runs on meta too
    if generator is None or generator.device == probs.device:
        return torch.multinomial(probs, num_samples, replacement=True, generator=generator)
    on_generator = probs.to(generator.device)
    draws = torch.multinomial(on_generator, num_samples, replacement=True, generator=generator)
    return draws.to(probs.device)


def position_log_probs(fn, shape: tuple) -> torch.Tensor:
    """log q(z = s) ``[*shape, S]`` of a categorical site's distribution ``fn`` (batch shape
    ``shape``) at every one of its S categories: each category is scored, not only those of
    ``fn.enumerate_support()`` (a sparse q enumerates its support alone; a category outside it
    has the finite log 0)."""
    inner = fn  # the categorical under Pyro's wrappers (a target mask, an expand)
    while not isinstance(getattr(inner, "probs", None), torch.Tensor) and \
            getattr(inner, "base_dist", None) is not None:
        inner = inner.base_dist
    probs = getattr(inner, "probs", None)
    if isinstance(probs, torch.Tensor):
        S, device = probs.shape[-1], probs.device
    else:
        support = fn.enumerate_support(expand=False)
        S, device = support.shape[0], support.device
    positions = torch.arange(S, device=device).reshape((S,) + (1,) * len(shape))
    return fn.log_prob(positions).reshape(S, *shape).movedim(0, -1)


def _broadcast_mask(param: torch.Tensor, mask: torch.Tensor | None):
    if mask is None:
        mask = torch.ones(param.shape, dtype=torch.bool, device=param.device)
    param, maskf = broadcast_all(param, mask.to(param.dtype))
    return param, maskf > 0


def safe_log(x: torch.Tensor) -> torch.Tensor:
    """log x with 0 ↦ log of the dtype's smallest normal number (finite)."""
    return torch.log(x.clamp(min=torch.finfo(x.dtype).tiny))


class MaskedDirichlet(TorchDistribution):
    """Dirichlet(α) on the sub-simplex of unmasked positions.

    ``concentration [..., S] > 0`` (ignored where masked), ``mask [..., S]`` bool.

    log p(x) = log Γ(Σ_u α_u) − Σ_u log Γ(α_u) + Σ_u (α_u − 1) log x_u, sums over unmasked u.

    Sampling normalizes independent Gamma(α_u, 1) draws; ``rsample`` is differentiable through
    torch's implicit-reparameterization gradient of the Gamma sampler (Figurnov et al. 2018).
    """

    arg_constraints = {"concentration": constraints.positive}
    support = constraints.simplex
    has_rsample = True

    def __init__(self, concentration: torch.Tensor, mask: torch.Tensor | None = None,
                 validate_args=None):
        concentration, mask = _broadcast_mask(concentration, mask)
        self.source_mask = mask
        self.concentration = torch.where(mask, concentration, torch.ones_like(concentration))
        super().__init__(concentration.shape[:-1], concentration.shape[-1:], validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(MaskedDirichlet, _instance)
        shape = torch.Size(batch_shape) + self.event_shape
        new.concentration = self.concentration.expand(shape)
        new.source_mask = self.source_mask.expand(shape)
        super(MaskedDirichlet, new).__init__(torch.Size(batch_shape), self.event_shape, False)
        new._validate_args = self._validate_args
        return new

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(torch.Size(sample_shape))
        gammas = torch._standard_gamma(self.concentration.expand(shape))
        gammas = gammas.clamp(min=torch.finfo(gammas.dtype).tiny) * self.source_mask
        return gammas / gammas.sum(-1, keepdim=True)

    def log_prob(self, value):
        m = self.source_mask.to(value.dtype)
        a = self.concentration
        return (
            ((a - 1) * safe_log(value) * m).sum(-1)
            + torch.lgamma((a * m).sum(-1))
            - (torch.lgamma(a) * m).sum(-1)
        )

    @property
    def mean(self):
        a = self.concentration * self.source_mask
        return a / a.sum(-1, keepdim=True)

    def entropy(self):
        m = self.source_mask.to(self.concentration.dtype)
        a = self.concentration
        a0 = (a * m).sum(-1)
        n = m.sum(-1)
        return (
            (torch.lgamma(a) * m).sum(-1)
            - torch.lgamma(a0)
            + (a0 - n) * torch.digamma(a0)
            - ((a - 1) * torch.digamma(a) * m).sum(-1)
        )


class MaskedRelaxedCategorical(TorchDistribution):
    """Concrete / Gumbel-softmax distribution (Maddison et al. 2017; Jang et al. 2017).

    ``logits [..., S]``, ``temperature τ > 0``, ``mask [..., S]`` bool. A draw is
    ``x = softmax((log π + g) / τ)`` with g ~ Gumbel(0, 1) i.i.d. and log π = −∞ on masked
    positions, so those weights are exactly 0. Its density on the n-point simplex
    (Maddison et al. 2017, Definition 1 / eq. 1):

        log p(x) = log Γ(n) + (n−1) log τ + Σ_u [log π_u − (τ+1) log x_u]
                   − n · log Σ_u π_u x_u^(−τ)

    At low τ a coordinate of x can underflow to 0 in float32 while its logarithm is finite, so a
    draw carries its own log (``value._pa_log_value``) and ``log_prob`` uses it when given that
    very tensor (as Pyro's replay does); other values fall back to ``log(max(x, tiny))``.
    """

    arg_constraints = {"logits": constraints.real_vector, "temperature": constraints.positive}
    support = constraints.simplex
    has_rsample = True

    def __init__(self, temperature, logits: torch.Tensor, mask: torch.Tensor | None = None,
                 validate_args=None):
        logits, mask = _broadcast_mask(logits, mask)
        self.source_mask = mask
        self.temperature = torch.as_tensor(temperature, dtype=logits.dtype, device=logits.device)
        masked = torch.where(mask, logits, torch.full_like(logits, -torch.inf))
        self.logits = masked - masked.logsumexp(-1, keepdim=True)
        super().__init__(logits.shape[:-1], logits.shape[-1:], validate_args=False)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(MaskedRelaxedCategorical, _instance)
        shape = torch.Size(batch_shape) + self.event_shape
        new.logits = self.logits.expand(shape)
        new.source_mask = self.source_mask.expand(shape)
        new.temperature = self.temperature
        super(MaskedRelaxedCategorical, new).__init__(torch.Size(batch_shape), self.event_shape,
                                                      False)
        return new

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(torch.Size(sample_shape))
        u = torch.rand(shape, dtype=self.logits.dtype, device=self.logits.device)
        tiny = torch.finfo(u.dtype).tiny
        gumbel = -torch.log(-torch.log(u.clamp(min=tiny, max=1 - 1e-7)))
        log_x = torch.log_softmax((self.logits + gumbel) / self.temperature, dim=-1)
        x = log_x.exp()
        x._pa_log_value = log_x
        return x

    def log_prob(self, value):
        log_x = getattr(value, "_pa_log_value", None)
        if log_x is None:
            log_x = safe_log(value)
        m = self.source_mask
        tau = self.temperature
        n = m.to(value.dtype).sum(-1)
        zeros = torch.zeros((), dtype=value.dtype, device=value.device)
        log_pi = torch.where(m, self.logits, zeros)
        log_x_u = torch.where(m, log_x, zeros)
        per_pos = torch.where(m, log_pi - (tau + 1) * log_x_u, zeros).sum(-1)
        inner = torch.where(m, log_pi - tau * log_x_u, torch.full_like(log_x_u, -torch.inf))
        return torch.lgamma(n) + (n - 1) * torch.log(tau) + per_pos - n * inner.logsumexp(-1)
