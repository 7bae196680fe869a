"""What a structured distribution is on both backends, written once: the Pyro side's
``torch.distributions.Distribution`` and the NumPyro side's ``numpyro.distributions.Distribution``
subclass this mixin with their own base class and sampling signature, and every other member
comes from here (through :class:`~.structure.Structure` on that backend's operation table)."""

from __future__ import annotations

import numpy as np

from ..core.errors import UserError


class StructuredDistribution:
    """Mixin: ``structure_class`` (e.g. :class:`~.linear_chain.LinearChain`) and ``ops`` (the
    backend's operation table) are set by the backend's class; ``self.structure`` is made by
    :meth:`_make_structure` in its ``__init__``."""

    structure_class = None
    ops = None
    #: the backend's SparseMAP distribution (:meth:`sparsemap`)
    sparse_class = None

    def _make_structure(self, log_potentials, lengths):
        self.structure = self.structure_class(self.ops, log_potentials, lengths)
        return self.structure.batch_shape, self.structure.event_shape

    @property
    def log_potentials(self):
        return self.structure.log_potentials

    @property
    def lengths(self):
        return self.structure.lengths

    @property
    def log_partition(self):
        """log Z ``[batch]``."""
        return self.structure.log_partition()

    @property
    def marginals(self):
        """E[event] ``[batch, *event]`` (the gradient of log Z; differentiable)."""
        return self.structure.marginals()

    @property
    def mean(self):
        return self.marginals

    @property
    def mode(self):
        return self.argmax()

    def posterior(self, emission):
        """p(z | y) for evidence that factors over the parts, log p(y | z) = ⟨event(z), φ⟩ with
        ``emission`` φ of the event shape (its leading dimensions broadcast against the batch):
        the same structure over θ + φ, since p(z) p(y | z) ∝ exp⟨event(z), θ + φ⟩."""
        return self._over(self.log_potentials + self._evidence(emission, "posterior"))

    def marginal_log_likelihood(self, emission):
        """log p(y) = log Σ_z p(z) p(y | z) = log Z(θ + φ) − log Z(θ) ``[batch]`` for evidence
        that factors over the parts (:meth:`posterior`): exact and differentiable — the exact
        likelihood of a model whose latent site is this structure."""
        return self.posterior(emission).log_partition - self.log_partition

    def _evidence(self, emission, what: str):
        why = self.structure.no_evidence_because
        if why is not None:
            raise UserError(f"{self.structure.name}.{what}: not available for {self.structure.name}"
                            f": {why}")
        event = tuple(self.structure.event_shape)
        shape = tuple(getattr(emission, "shape", ()))
        if shape[len(shape) - len(event):] != event or len(shape) < len(event):
            raise UserError(f"{self.structure.name}.{what}: the emission must end in the event "
                            f"shape {event}, got shape {shape}")
        return emission

    def _over(self, log_potentials):
        """The same kind of distribution over other potentials, the same lengths."""
        batch = tuple(log_potentials.shape[:len(log_potentials.shape)
                                           - len(self.structure.event_shape)])
        return type(self)(log_potentials, self.ops.expand(self.lengths, batch))

    # --- ways to train through it (structures/trainable.py) ---------------------------------

    @property
    def trainable(self):
        """What serves the relaxations and SparseMAP: the structure."""
        return self.structure

    def sparse_values(self, events):
        """SparseMAP's slots as values of this distribution: the events themselves."""
        return events

    def relaxed_sample(self, kind: str, temperature: float = 1.0, noise: str = "gumbel",
                       noise_scale: float = 1.0, lam: float = 10.0, key=None,
                       perturbation=None):
        """A differentiable draw of the event ``[batch, *event]``: ``"perturbed"`` marginals
        at ``temperature``, ``"straight-through"`` or ``"imle"`` (implicit MLE, ``lam`` its
        λ) — :mod:`ppl_attention.structures.perturbation`; ``key``: NumPyro's PRNG key;
        ``perturbation``: the noise itself (the potentials' shape), in place of a draw."""
        return self.structure.relaxed_sample(kind, temperature, noise, noise_scale, lam, key,
                                             perturbation)

    def sparsemap(self, max_active: int | None = None, max_iter: int | None = None,
                  statistics=None):
        """SparseMAP's sparse distribution over this distribution's structures
        (:mod:`ppl_attention.structures.sparsemap`), a distribution of the same backend;
        ``statistics`` a linear function A of events: the quadratic on A μ instead of μ (the
        statistic the potentials score, where the event over-counts it)."""
        from .sparsemap import DEFAULT_MAX_ACTIVE

        return self.sparse_class(self, max_active or DEFAULT_MAX_ACTIVE, max_iter,
                                 statistics=statistics)

    def argmax(self):
        """The event of the most probable structure ``[batch, *event]``."""
        return self.structure.argmax()

    def max_score(self):
        return self.structure.max_score()

    def top_k(self, k: int):
        """The ``k`` best structures: ``(events [k, batch, *event], scores [k, batch])``, best
        first, by unnormalized score (the k-best semiring); −inf and an all-zero event where a
        row has fewer than k structures."""
        return self.structure.top_k(k)

    def entropy(self):
        return self.structure.entropy()

    def cross_entropy(self, other):
        """−E_self[log other] ``[batch]``."""
        return self.structure.cross_entropy(self._other(other))

    def kl_divergence(self, other):
        """KL(self ‖ other) ``[batch]``."""
        return self.structure.kl(self._other(other))

    def log_prob(self, value):
        """log p(event) ``[sample, batch]``; an event that is no structure of this distribution
        (not 0/1, not one of its structures, a part past a row's length) is refused."""
        self.check_event(value)
        return self.structure.log_prob(value)

    def check_event(self, value) -> None:
        ev = self.ops.concrete(value)
        if ev is None:  # traced: checked where concrete
            return
        if tuple(ev.shape[-len(self.structure.event_shape):]) != self.structure.event_shape:
            raise UserError(f"{self.structure.name}.log_prob: an event has the event shape "
                            f"{self.structure.event_shape}, got {tuple(ev.shape)}")
        bad = self.structure.invalid(ev)
        if bad is not None:
            raise UserError(f"{self.structure.name}.log_prob: not a structure: {bad}")

    def enumerate_support(self, expand: bool = True):
        """Every structure ``[K, batch, *event]`` (small sizes; rows of one length)."""
        lengths = np.unique(self.ops.concrete(self.structure.lengths))
        if lengths.size > 1:
            raise UserError(f"{self.structure.name}.enumerate_support: rows of one length only "
                            f"(got lengths {lengths.tolist()})")
        length = int(lengths[0]) if lengths.size else self.structure.size(self.log_potentials)
        events = np.asarray(list(self.structure_class.all_events(self.structure.event_shape,
                                                                 length)), dtype=np.float64)
        if events.shape[0] > 100_000:
            raise UserError(f"{self.structure.name}.enumerate_support: {events.shape[0]} "
                            f"structures; enumeration is for small sizes")
        out = self.ops.from_numpy(events, self.log_potentials)
        shape = (events.shape[0],) + tuple(self.batch_shape) + tuple(self.event_shape)
        out = out.reshape((events.shape[0],) + (1,) * len(self.batch_shape)
                          + tuple(self.event_shape))
        return self.ops.expand(out, shape) if expand else out

    def _other(self, other):
        if not isinstance(other, StructuredDistribution):
            raise UserError(f"{self.structure.name}: the other distribution must be a "
                            f"{self.structure.name}, got {type(other).__name__}")
        return other.structure
