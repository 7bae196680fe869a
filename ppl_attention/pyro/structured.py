"""``MonotonicAlignment``: exact inference over the alignment paths of a hard monotonic (HMM)
attention, marginalized inside one distribution as Pyro's ``DiscreteHMM`` does. The chain, its
two paths (the banded recursion and the parallel scan) and every operation are written once in
:mod:`ppl_attention.structures.monotonic` (read its docstring for the maths); this module binds
them to PyTorch. The other structure, a dependency tree over the source, is
:class:`DependencyTree` (:mod:`ppl_attention.pyro.trees`, re-exported here).
"""

from __future__ import annotations

import torch

from ..structures import torch_ops
from ..structures.monotonic import FLOOR, Monotonic
from ..structures.torch_ops import associative_scan, logmatmulexp, maxmatmul
from .distributions import categorical_draws
from .trees import DependencyTree

__all__ = ["MonotonicAlignment", "DependencyTree", "FLOOR", "logmatmulexp", "maxmatmul",
           "associative_scan"]


class MonotonicAlignment(Monotonic):
    """The chain of :mod:`ppl_attention.structures.monotonic` on PyTorch: ``init [B, S]``,
    ``trans [B, T, S, W]`` (step 0 unused), ``emissions [B, T, S]`` (FLOOR on masked source
    positions), ``mask [B, T]`` bool with ``mask[:, 0]`` True; ``method``: ``"auto"``,
    ``"sequential"`` or ``"parallel"``."""

    ops = torch_ops

    def sample(self, num_samples: int = 1, generator: torch.Generator | None = None
               ) -> torch.Tensor:
        """Exact draws z ~ p(z | x, y) by forward filtering, backward sampling, ``[K, B, T]``
        (0 on padded steps), from ``generator`` (torch's global one when None)."""
        def draw(_, logits):
            S = logits.shape[-1]
            flat = categorical_draws(logits.softmax(-1).reshape(-1, S), 1, generator)
            return flat.view(logits.shape[:-1])

        T = self.shape[1]
        return self.ffbs(num_samples, torch.zeros(T, device=self.emissions.device), draw)
