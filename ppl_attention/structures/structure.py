"""Every exact operation of a structured distribution from one recursion.

A structure (:class:`LinearChain`, …) provides ``value(ops, semiring, log_potentials, lengths,
key)`` — ⊕ over its structures of their scores, the dynamic program written once — and this
class derives, on either backend's operation table ``ops``:

- ``log_partition`` = value under LOG: log Z = log Σ_y exp s(y), with s(y) = ⟨event(y), θ⟩;
- ``marginals`` = ∂ log Z / ∂ θ = E_p[event] (the gradient of the LOG recursion);
- ``argmax`` = ∂ max_y s(y) / ∂ θ = the event of the best structure (MAX);
- ``sample(sample_shape)`` = ∂ value_SAMPLE / ∂ θ = the event of an exact draw (SAMPLE);
- ``top_k(k)``: the value under the k-best semiring is the k best scores; the gradient of
  the i-th is the event of the i-th best structure;
- ``log_prob(event)`` = ⟨event, θ⟩ − log Z;
- ``entropy`` H(p) = log Z − ⟨μ_p, θ⟩;
- ``cross_entropy(q)`` = −E_p[log q] = log Z_q − ⟨μ_p, θ_q⟩;  ``kl(q)`` = CE(p, q) − H(p).

and the ways to train through a structure that need only its marginals and its MAP oracle
(at any potentials: ``marginals_at``, ``argmax_at``): ``relaxed_sample`` — perturbed
marginals, straight-through, implicit MLE (:mod:`.perturbation`) — and ``sparsemap``, a sparse
distribution over a few structures (:mod:`.sparsemap`).
"""

from __future__ import annotations

import copy

import numpy as np

from ..core.errors import UserError
from ..core.numerics import LOG_ZERO
from .semirings import LOG, MAX, SAMPLE, kmax
from .trainable import Trainable


class Structure(Trainable):
    """One structured distribution over events of the shape of ``log_potentials`` (its last
    ``event_dims`` dimensions; the ones before are the batch), with ``lengths`` ``[batch]``
    (None: full). Subclasses give ``value``, ``check`` and ``size`` (the n that lengths are
    counted against)."""

    event_dims = 3
    name = "structure"
    #: whether ``value`` takes ``lengths=None`` for rows that are all full (and skips the
    #: per-position selection of the rows' ends)
    full_lengths_as_none = False
    #: every row full (``lengths`` not given)
    full = False
    #: whether evidence that factors over the parts, log p(y | z) = ⟨event(z), φ⟩, can be added
    #: to the potentials (posterior = the structure over θ + φ); None, or why not
    no_evidence_because: str | None = None

    def __init__(self, ops, log_potentials, lengths=None):
        self.ops = ops
        self.check(log_potentials, lengths)
        if ops.any_nan(log_potentials):
            raise UserError(f"{self.name}: log_potentials hold NaN or +inf")
        # −inf (a part forbidden) as a finite log 0, so that no gradient is NaN
        self.log_potentials = ops.floor_at(log_potentials, LOG_ZERO)
        self.batch_shape = tuple(log_potentials.shape[:-self.event_dims])
        self.event_shape = tuple(log_potentials.shape[-self.event_dims:])
        n = self.size(log_potentials)
        self.full = lengths is None
        self.lengths = ops.lengths_of(lengths, self.batch_shape, n, log_potentials)
        if self.lengths is None:
            raise UserError(f"{self.name}: lengths of shape {tuple(np.shape(lengths))} do not fit "
                            f"the batch shape {self.batch_shape}: log_potentials of shape "
                            f"{tuple(log_potentials.shape)} are read as batch "
                            f"{self.batch_shape} + event {self.event_shape} (the last "
                            f"{self.event_dims} axes) — is an event axis missing?")
        concrete = ops.concrete(self.lengths)
        if concrete is not None and concrete.size and (concrete.min() < 1 or concrete.max() > n):
            raise UserError(f"{self.name}: lengths must lie in 1 … {n}, got "
                            f"{int(concrete.min())} … {int(concrete.max())}")

    # --- what a structure defines ----------------------------------------------------------

    @staticmethod
    def check(log_potentials, lengths) -> None:
        raise NotImplementedError

    @staticmethod
    def value(ops, semiring, log_potentials, lengths, key=None):
        raise NotImplementedError

    @staticmethod
    def size(log_potentials) -> int:
        return log_potentials.shape[-3]

    def invalid(self, events) -> str | None:
        """Why NumPy ``events`` are not structures of this distribution (None: they are, or its
        lengths are traced — under ``jit``, where they are checked when concrete)."""
        lengths = self.ops.concrete(self.lengths)
        if lengths is None:
            return None
        lengths = np.broadcast_to(lengths, events.shape[:events.ndim - self.event_dims])
        return self.invalid_events(events, lengths)

    # --- derived ---------------------------------------------------------------------------

    def _value(self, semiring, theta, lengths=None, key=None):
        if lengths is None:
            lengths = None if self.full and self.full_lengths_as_none else self.lengths
        return self.ops.compiled(self.value)(self.ops, semiring, theta, lengths, key)

    def log_partition(self):
        """log Z ``[batch]``."""
        return self._value(LOG, self.log_potentials)

    def marginals(self):
        """E_p[event] ``[batch, *event]`` (differentiable: structured attention)."""
        return self.ops.grad(lambda th: self._value(LOG, th), self.log_potentials)

    def max_score(self):
        """max_y s(y) ``[batch]``."""
        return self._value(MAX, self.log_potentials)

    def argmax(self):
        """The event of the best structure ``[batch, *event]``."""
        return self.ops.grad(lambda th: self._value(MAX, th),
                             self.ops.stop_gradient(self.log_potentials))

    def sample(self, sample_shape=(), key=None):
        """Exact draws ``[*sample_shape, batch, *event]`` (NumPyro: ``key`` a PRNG key; torch:
        its global generator)."""
        shape = tuple(sample_shape) + tuple(self.log_potentials.shape)
        theta = self.ops.expand(self.ops.stop_gradient(self.log_potentials), shape)
        lengths = None if self.full and self.full_lengths_as_none else self.ops.expand(
            self.lengths, tuple(sample_shape) + self.batch_shape)
        return self.ops.grad(lambda th: self._value(SAMPLE, th, lengths, key), theta)

    def top_k(self, k: int):
        """The ``k`` best structures by score: ``(events [k, batch, *event], scores [k,
        batch])``, best first. Where a row has fewer than k structures, the missing ones have
        score −inf and an all-zero event."""
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise UserError(f"{self.name}.top_k: k must be a positive integer, got {k!r}")
        semiring = kmax(int(k))
        theta = self.ops.stop_gradient(self.log_potentials)
        scores = self._value(semiring, theta)  # [k, batch]
        events = self.ops.stack([self.ops.grad(lambda th, i=i: self._value(semiring, th)[i],
                                               theta) for i in range(int(k))], 0)
        real = scores > LOG_ZERO / 2
        events = self.ops.where(real.reshape(tuple(real.shape) + (1,) * self.event_dims), events,
                                self.ops.full_like(events, 0.0))
        return events, self.ops.where(real, scores, self.ops.full_like(scores, -float("inf")))

    # --- ways to train through the structure --------------------------------------------

    def aux(self) -> tuple:
        """The lengths as a tuple of arrays (what :meth:`argmax_at` takes besides θ)."""
        lengths = None if self.full and self.full_lengths_as_none else self.lengths
        if lengths is None:
            return ()
        return tuple(lengths) if isinstance(lengths, tuple) else (lengths,)

    def _lengths_of(self, aux):
        if not aux:
            return None
        return tuple(aux) if isinstance(self.lengths, tuple) else aux[0]

    def at(self, theta) -> Structure:
        """The same structure (kind, lengths) over other potentials ``theta [*batch', *event]``
        — a batch that the lengths broadcast to (draws on the left). Unchecked: for the
        estimators, whose potentials are this structure's own."""
        new = copy.copy(self)
        new.log_potentials = theta
        batch = tuple(theta.shape[:len(theta.shape) - self.event_dims])
        if batch != tuple(self.batch_shape):
            def grow(x):
                return self.ops.expand(x, batch + tuple(x.shape[len(self.batch_shape):]))
            new.lengths = tuple(grow(x) for x in self.lengths) if isinstance(
                self.lengths, tuple) else grow(self.lengths)
            new.batch_shape = batch
        return new

    def log_z(self):
        """log Z ``[batch]`` (:meth:`log_partition`)."""
        return self.log_partition()

    def sample_events(self, n: int, key=None):
        """``n`` exact draws as events ``[n, batch, *event]``."""
        return self.sample((n,), key)

    def marginals_at(self, theta):
        """∇ log Z at potentials ``theta`` of this structure's shape and lengths
        (differentiable in ``theta``)."""
        return self.ops.grad(lambda th: self._value(LOG, th), theta)

    def argmax_at(self, theta, *aux):
        """The event of the best structure under potentials ``theta`` (lengths from ``aux``,
        :meth:`aux`; no gradient)."""
        lengths = self._lengths_of(aux)
        value = self.ops.compiled(self.value)
        theta = self.ops.stop_gradient(theta)
        return self.ops.grad(lambda th: value(self.ops, MAX, th, lengths, None), theta)

    def score(self, event):
        """s(y) = ⟨event, θ⟩ ``[..., batch]``."""
        return self._dot(event, self.log_potentials)

    def log_prob(self, event):
        """log p(event) ``[..., batch]``."""
        return self.score(event) - self.log_partition()

    def entropy(self):
        """H(p) ``[batch]``."""
        return self.log_partition() - self._dot(self.marginals(), self.log_potentials)

    def cross_entropy(self, other: Structure):
        """−E_p[log q] ``[batch]`` for ``other`` = q over the same structures."""
        self._same(other)
        return other.log_partition() - self._dot(self.marginals(), other.log_potentials)

    def kl(self, other: Structure):
        """KL(p ‖ q) ``[batch]``."""
        return self.cross_entropy(other) - self.entropy()

    def _dot(self, event, theta):
        prod = event * theta
        for _ in range(self.event_dims):
            prod = prod.sum(-1)
        return prod

    def _same(self, other) -> None:
        if type(other) is not type(self) or tuple(other.log_potentials.shape) != tuple(
                self.log_potentials.shape):
            raise UserError(f"{self.name}: the other distribution must be a {self.name} of the "
                            f"same shape {tuple(self.log_potentials.shape)}, got "
                            f"{type(other).__name__} {tuple(other.log_potentials.shape)}")
