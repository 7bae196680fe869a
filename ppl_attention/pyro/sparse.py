"""Distributions with exact zeros, whose expectations are exact sums over a small support
(Correia, Niculae, Aziz & Martins 2020): ``SparsemaxCategorical`` (q = sparsemax of scores over
source positions) and ``SparseMAP`` (a sparse combination of a structure's structures, from
its MAP oracle). Under ``TraceEnum_ELBO`` with the guide site enumerated, E_q[f(z)] is summed
over the support only. The NumPyro mirror is :mod:`ppl_attention.numpyro.sparse`.
"""

from __future__ import annotations

import pyro.distributions as dist
import torch
from pyro.distributions import TorchDistribution
from torch.distributions import constraints, register_kl

from ..core.errors import UserError
from ..core.numerics import LOG_ZERO
from ..structures import torch_ops
from ..structures.sparse_support import SparseSupport
from ..structures.sparsemap import DEFAULT_MAX_ACTIVE

__all__ = ["SparsemaxCategorical", "SparseMAP"]


class SparsemaxCategorical(dist.Categorical):
    """A categorical over source positions with ``probs [..., S]`` that may be exactly 0 (a
    sparsemax): ``log_prob`` is the finite log 0 (``LOG_ZERO``) there, so that q · log q = 0
    and no gradient is NaN; ``enumerate_support`` is the positions of the largest support in
    the batch, ``[K, ...]`` (each row its own, in decreasing probability; a row with fewer
    than K positions repeats positions of probability 0)."""

    def __init__(self, probs: torch.Tensor, validate_args=None):
        super().__init__(probs=probs, validate_args=False)

    def expand(self, batch_shape, _instance=None):
        shape = torch.Size(batch_shape) + self.probs.shape[-1:]
        return SparsemaxCategorical(self.probs.expand(shape))

    @property
    def support_size(self) -> torch.Tensor:
        """The number of positions with probability above 0 ``[...]``."""
        return (self.probs > 0).sum(-1)

    def log_prob(self, value):
        value = value.long().unsqueeze(-1)
        value, probs = torch.broadcast_tensors(value, self.probs)
        p = probs.gather(-1, value[..., :1]).squeeze(-1)
        return torch.where(p > 0, torch.log(p.clamp_min(torch.finfo(p.dtype).tiny)),
                           torch.full_like(p, LOG_ZERO))

    def entropy(self):
        p = self.probs
        return -torch.where(p > 0, p * torch.log(p.clamp_min(torch.finfo(p.dtype).tiny)),
                            torch.zeros_like(p)).sum(-1)

    def enumerate_support(self, expand: bool = True):
        k = max(int(self.support_size.max()), 1) if self.probs.numel() else 1
        top = self.probs.topk(k, -1).indices  # [..., K]
        return top.movedim(-1, 0)


class SparseMAP(SparseSupport, TorchDistribution):
    """SparseMAP's distribution over the structures of ``base`` (a structure of
    :mod:`ppl_attention.pyro.crfs` or a :class:`~ppl_attention.pyro.trees.DependencyTree`) at its
    potentials (:mod:`ppl_attention.structures.sparsemap`): ``max_active`` slots; ``values
    [K, *batch, *event]`` in the base's own value (events; heads for a tree), ``probs [K,
    *batch]`` differentiable, ``marginals`` Σ_k p_k z_k over its parts (a tree's arcs);
    ``converged`` and ``active`` per row."""

    ops = torch_ops
    arg_constraints: dict = {}
    has_enumerate_support = True

    def __init__(self, base, max_active: int = DEFAULT_MAX_ACTIVE, max_iter: int | None = None,
                 validate_args=None, statistics=None):
        trainable = getattr(base, "trainable", None)
        if trainable is None or not callable(getattr(trainable, "argmax_at", None)):
            raise UserError(f"SparseMAP needs a structure with an argmax (its MAP oracle, over "
                            f"which the active set is searched): {type(base).__name__} has "
                            f"none (the structures of the structure library have)")
        events, probs, converged, active = trainable.sparsemap_support(max_active, max_iter,
                                                                         statistics)
        marginals = (probs.reshape(probs.shape + (1,) * trainable.event_dims) * events).sum(0)
        batch, event = self._set_support(base.sparse_values(events), probs, marginals, converged,
                                         active, len(base.event_shape))
        self.base, self.max_active, self.max_iter = base, max_active, max_iter
        self.statistics = statistics
        super().__init__(torch.Size(batch), torch.Size(event), validate_args=False)

    @constraints.dependent_property(is_discrete=True)
    def support(self):
        return self.base.support

    def sample(self, sample_shape=()):
        """Draws ``[*sample_shape, *batch, *event]``: a slot by its probability, its
        structure."""
        shape = torch.Size(sample_shape)
        K = self.probs.shape[0]
        flat = self.probs.reshape(K, -1).T  # [N, K]
        n = max(shape.numel(), 1)
        idx = torch.multinomial(flat, n, replacement=True).T  # [n, N]
        vals = self.values.reshape((K, flat.shape[0]) + tuple(self.event_shape))
        picked = vals[idx, torch.arange(flat.shape[0], device=idx.device)[None]]
        return picked.reshape(shape + self.batch_shape + self.event_shape)

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        if batch_shape == self.batch_shape:
            return self
        return SparseMAP(self.base.expand(batch_shape), self.max_active, self.max_iter,
                         statistics=self.statistics)


@register_kl(SparseMAP, torch.distributions.Distribution)
def _kl_sparsemap(q, p):
    """KL(q ‖ p) = Σ_k q_k (log q_k − log p(z_k)), exact over q's support, for p over the same
    structures (the prior)."""
    return q.kl_to(p)
