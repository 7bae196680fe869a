"""Distributions with exact zeros for NumPyro, the mirror of :mod:`ppl_attention.pyro.sparse`
(same names, arguments and maths): ``SparsemaxCategorical`` (q = sparsemax of scores) and
``SparseMAP`` (a sparse combination of a structure's structures)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from numpyro.distributions import Distribution, constraints

from ..core.errors import UserError
from ..core.numerics import LOG_ZERO
from ..structures import jax_ops
from ..structures.sparse_support import SparseSupport
from ..structures.sparsemap import DEFAULT_MAX_ACTIVE

__all__ = ["SparsemaxCategorical", "SparseMAP"]


class SparsemaxCategorical(dist.CategoricalProbs):
    """As :class:`ppl_attention.pyro.sparse.SparsemaxCategorical`: ``probs [..., S]`` with exact
    zeros, ``log_prob`` the finite log 0 there. ``enumerate_support`` is every position
    (``[S, 1, …]``, the shapes fixed under ``jit``): the positions of probability 0 add exactly
    0 to an enumerated ELBO."""

    def __init__(self, probs, *, validate_args=None):
        super().__init__(probs, validate_args=False)

    @property
    def support_size(self):
        """The number of positions with probability above 0 ``[...]``."""
        return (self.probs > 0).sum(-1)

    def log_prob(self, value):
        value = jnp.asarray(value)
        shape = jnp.broadcast_shapes(value.shape, self.batch_shape)
        probs = jnp.broadcast_to(self.probs, shape + self.probs.shape[-1:])
        p = jnp.take_along_axis(probs, jnp.broadcast_to(value, shape)[..., None].astype(jnp.int32),
                                -1)[..., 0]
        pos = p > 0
        return jnp.where(pos, jnp.log(jnp.where(pos, p, 1.0)), LOG_ZERO)

    def entropy(self):
        p = self.probs
        pos = p > 0
        return -jnp.where(pos, p * jnp.log(jnp.where(pos, p, 1.0)), 0.0).sum(-1)


class SparseMAP(SparseSupport, Distribution):
    """As :class:`ppl_attention.pyro.sparse.SparseMAP`: SparseMAP's distribution over the
    structures of ``base`` (:mod:`ppl_attention.numpyro.crfs` or a
    :class:`~ppl_attention.numpyro.trees.DependencyTree`), ``max_active`` slots (fixed shapes:
    one compilation)."""

    ops = jax_ops
    arg_constraints: dict = {}
    has_enumerate_support = True
    has_rsample = False

    def __init__(self, base, max_active: int = DEFAULT_MAX_ACTIVE, max_iter: int | None = None,
                 *, validate_args=None, statistics=None):
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
        super().__init__(batch, event, validate_args=False)

    @constraints.dependent_property(is_discrete=True)
    def support(self):
        return self.base.support

    def sample(self, key, sample_shape=()):
        """Draws ``[*sample_shape, *batch, *event]``: a slot by its probability, its
        structure."""
        shape = tuple(sample_shape) + tuple(self.batch_shape)
        idx = jax.random.categorical(key, jnp.moveaxis(self.slot_log_probs(), 0, -1), -1,
                                     shape)  # [*shape]
        vals = jnp.moveaxis(self.values, 0, len(self.batch_shape))  # [*batch, K, *event]
        vals = jnp.broadcast_to(vals, shape + vals.shape[len(self.batch_shape):])
        ev = len(self.event_shape)
        index = idx.reshape(idx.shape + (1,) * (ev + 1))
        return jnp.take_along_axis(vals, index, len(shape)).squeeze(len(shape))

    def expand(self, batch_shape):
        if tuple(batch_shape) == tuple(self.batch_shape):
            return self
        return SparseMAP(self.base.expand(batch_shape), self.max_active, self.max_iter,
                         statistics=self.statistics)



def kl_sparsemap(q, p):
    """KL(q ‖ p) = Σ_k q_k (log q_k − log p(z_k)), exact over q's support, for p over the same
    structures (the prior); registered for each structure in :mod:`..crfs` and :mod:`..trees`."""
    return q.kl_to(p)
