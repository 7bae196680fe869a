"""What every structure gains from its marginals and its MAP oracle at any potentials: the
differentiable draws of :mod:`.perturbation` and the sparse distribution of :mod:`.sparsemap`
— one mixin, so that :class:`~.structure.Structure` (chains, segmentations, constituency trees,
CTC) and the dependency trees of both backends serve them with the same code.

A class that mixes it in provides ``ops`` (its operation table), ``log_potentials`` θ (its
event's shape, batch first), ``event_dims``, ``marginals_at(θ)``, ``argmax_at(θ, *aux)`` and
``aux()`` (its lengths as arrays).
"""

from __future__ import annotations

from .perturbation import relaxed_sample
from .sparsemap import DEFAULT_MAX_ACTIVE, sparsemap


class Trainable:
    def relaxed_sample(self, kind: str, temperature: float = 1.0, noise: str = "gumbel",
                       noise_scale: float = 1.0, lam: float = 10.0, key=None,
                       perturbation=None):
        """A differentiable draw ``[batch, *event]`` of the event array: ``kind`` one of
        ``"perturbed"``, ``"straight-through"``, ``"imle"``
        (:func:`~.perturbation.relaxed_sample`; ``key``: the JAX key of the noise)."""
        return relaxed_sample(self, kind, temperature, noise, noise_scale, lam, key,
                              perturbation)

    def sparsemap_support(self, max_active: int = DEFAULT_MAX_ACTIVE,
                          max_iter: int | None = None, statistics=None):
        """SparseMAP of the potentials (:func:`~.sparsemap.sparsemap`): ``(events [K, batch,
        *event], probs [K, batch], converged [batch], active [batch])``, the probabilities
        differentiable in the potentials; ``statistics`` the regularized statistic (default:
        the event)."""
        aux = self.aux()
        return sparsemap(self.ops, self.log_potentials, lambda th: self.argmax_at(th, *aux),
                         self.event_dims, max_active, max_iter, statistics)
