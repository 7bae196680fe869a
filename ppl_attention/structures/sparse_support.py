"""A distribution over a few explicit structures per row — SparseMAP's q (:mod:`.sparsemap`) —
written once for both backends: the Pyro side's ``TorchDistribution`` and the NumPyro side's
``Distribution`` mix it in with their own base class and sampling signature.

q(z) = Σ_k p_k [z = z_k] over K slots ``values [K, *batch, *event]`` with probabilities
``probs [K, *batch]`` (a slot out of the active set has p_k = 0 exactly). Its support is
enumerated as it stands — ``enumerate_support()`` is the K slots, the same for every call, so
that an enumerated ELBO (Pyro's ``TraceEnum_ELBO`` with the guide site enumerated, NumPyro's
enumerated-guide loss) sums E_q[f(z)] = Σ_k p_k f(z_k) exactly over them. ``log_prob`` of the
enumerated support is each slot's log p_k (a slot with p_k = 0: the finite log 0,
``LOG_ZERO``, so that 0 · log 0 adds 0 and no gradient is NaN); of any other value, log of the
total probability of the slots holding it.
"""

from __future__ import annotations

from ..core.numerics import LOG_ZERO


class SparseSupport:
    """Mixin; ``ops`` is the backend's operation table, set by its class."""

    ops = None

    def _set_support(self, values, probs, marginals, converged, active, value_event_dims: int):
        self.values, self.probs = values, probs
        self.marginals = marginals
        self.converged, self.active = converged, active
        self.value_event_dims = value_event_dims
        batch = tuple(probs.shape[1:])
        return batch, tuple(values.shape[1 + len(batch):])

    @property
    def mean(self):
        return self.marginals

    def slot_log_probs(self):
        """log p_k ``[K, *batch]`` (``LOG_ZERO`` where p_k = 0)."""
        ops, p = self.ops, self.probs
        pos = p > 0
        return ops.where(pos, ops.log(ops.where(pos, p, ops.full_like(p, 1.0))),
                         ops.full_like(p, LOG_ZERO))

    def enumerate_support(self, expand: bool = True):
        """The K slots ``[K, *batch, *event]`` (batched whether or not ``expand``: each row has
        its own structures)."""
        return self.values

    def log_prob(self, value):
        """log q(value) ``[..., *batch]`` (module docstring)."""
        ops, ev = self.ops, self.value_event_dims
        K = self.values.shape[0]
        batch = tuple(self.probs.shape[1:])
        lead = len(value.shape) - ev - len(batch)
        aligned = self.values.reshape((K,) + (1,) * max(lead, 0) + tuple(self.values.shape[1:]))
        eq = ops.cast_like(value[None] == aligned, self.probs)
        for _ in range(ev):
            eq = eq.prod(-1)
        probs = self.probs.reshape((K,) + (1,) * max(lead, 0) + batch)
        total = (eq * probs).sum(0)
        pos = total > 0
        matched = ops.where(pos, ops.log(ops.where(pos, total, ops.full_like(total, 1.0))),
                            ops.full_like(total, LOG_ZERO))
        if lead < 1 or value.shape[0] != K or _size(value.shape) != _size(self.values.shape):
            return matched
        same = ops.cast_like(value.reshape(tuple(self.values.shape)) == self.values,
                             self.probs).prod() > 0.5  # the enumerated support itself
        slots = self.slot_log_probs().reshape(tuple(value.shape[:len(value.shape) - ev]))
        return ops.where(same, slots, matched)

    def entropy(self):
        """H(q) = −Σ_k p_k log p_k ``[*batch]``."""
        return -(self.probs * self.slot_log_probs()).sum(0)

    def kl_to(self, other):
        """KL(q ‖ other) = Σ_k p_k (log p_k − log other(z_k)) ``[*batch]`` for a distribution
        ``other`` over the same structures (the prior)."""
        return (self.probs * (self.slot_log_probs() - other.log_prob(self.values))).sum(0)


def _size(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
