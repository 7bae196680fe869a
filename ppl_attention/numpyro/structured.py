"""``MonotonicAlignment`` for the NumPyro mirror: the chain of
:mod:`ppl_attention.structures.monotonic` (the same code as the Pyro side's, read its docstring)
bound to JAX — the banded recursion a ``jax.lax.scan``, the parallel path
``jax.lax.associative_scan`` over dense log-semiring matrices."""

from __future__ import annotations

import jax

from ..structures import jax_ops
from ..structures.jax_ops import logmatmulexp, maxmatmul
from ..structures.monotonic import FLOOR, Monotonic
from .trees import DependencyTree

__all__ = ["MonotonicAlignment", "DependencyTree", "FLOOR", "logmatmulexp", "maxmatmul"]


class MonotonicAlignment(Monotonic):
    """As :class:`ppl_attention.pyro.structured.MonotonicAlignment`: ``init [B, S]``,
    ``trans [B, T, S, W]``, ``emissions [B, T, S]``, ``mask [B, T]``."""

    ops = jax_ops

    def sample(self, key, num_samples: int = 1):
        """Exact draws z ~ p(z | x, y) by forward filtering, backward sampling ``[K, B, T]``."""
        T = self.shape[1]
        return self.ffbs(num_samples, jax.random.split(key, T),
                         lambda k, logits: jax.random.categorical(k, logits))
