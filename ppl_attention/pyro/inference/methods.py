"""The methods registry under Pyro: each :class:`~ppl_attention.core.method_specs.MethodSpec` with
the
Pyro objects it needs — its family, its ELBO — and the one function that turns a (method, model,
batch, step) into a loss and the surrogate whose gradient is the method's estimator.

A method drives a model only through the contract of :mod:`ppl_attention.pyro.models.base`:
``model.model(batch, enumerate_z=…, kl_scale=…)`` and ``model.guide(batch, posterior=…,
enumerate_z=…, kl_scale=…[, baseline=…])``, plus ``soft_token_log_likelihood`` for the
soft-attention REINFORCE baseline.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
from pyro.infer import (
    ReweightedWakeSleep,
    Trace_ELBO,
    TraceEnum_ELBO,
    TraceGraph_ELBO,
    TraceMeanField_ELBO,
)

from ...core.method_specs import METHOD_SPECS, MethodSpec, method_spec
from ...core.schedules import kl_annealing
from ..families import Family, make_family
from .elbo import ScoreFunctionKL_ELBO
from .relaxation import relax

__all__ = ["Method", "METHODS", "get_method", "programs", "differentiable_loss", "loss_and_grads",
           "PLATES"]

PLATES = 2  # batch and target: the plate nesting of a pairs model (a model may declare more)

_ELBOS = {"Trace_ELBO": Trace_ELBO, "TraceEnum_ELBO": TraceEnum_ELBO,
          "TraceGraph_ELBO": TraceGraph_ELBO, "TraceMeanField_ELBO": TraceMeanField_ELBO,
          "ReweightedWakeSleep": ReweightedWakeSleep, "ScoreFunctionKL_ELBO": ScoreFunctionKL_ELBO}


@dataclass(frozen=True)
class Method:
    """A :class:`~ppl_attention.core.method_specs.MethodSpec` (every field readable here:
    ``name``, ``posterior``, ``enumerate_model`` …) with its Pyro objects, and its method
    options resolved (``options``: the spec's defaults where not given)."""

    spec: MethodSpec
    options: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))

    def __getattr__(self, item):
        return getattr(self.spec, item)

    def family(self, key_dim: int | None = None) -> Family:
        """A fresh instance of the method's family (``key_dim``: a BAM prior network's input)
        with its parameters from the method and its options."""
        return make_family(self.spec.family, key_dim=key_dim,
                           **self.spec.family_kwargs(dict(self.options)))

    def guide_program(self, guide, perturbation: dict | None = None):
        """The guide as the method runs it: with its structured draws relaxed
        (:func:`~ppl_attention.pyro.inference.relaxation.relax`) for a relaxed method;
        ``perturbation``: ``{site: ε}``, the relaxation's noise given (common random
        numbers)."""
        if self.spec.relaxation is None:
            return guide
        return relax(guide, self.spec.relaxation, perturbation=perturbation,
                     **self.spec.relaxation_kwargs(dict(self.options)))

    def elbo(self, max_plate_nesting: int = PLATES):
        """The Pyro estimator, for a model with ``max_plate_nesting`` plates."""
        cls = _ELBOS[self.spec.objective]
        if cls is ReweightedWakeSleep:
            return cls(num_particles=self.spec.particles, max_plate_nesting=max_plate_nesting,
                       vectorize_particles=True)
        return cls(max_plate_nesting=max_plate_nesting)

    def kl_scale(self, step: int, weight: float = 1.0, rho: float | None = None) -> float:
        """The KL weight η·λ(t) on the alignment sites at ``step``: λ ≡ 1 unless the method
        anneals, with ρ = ``rho`` if given, else the method's."""
        if self.spec.anneal_rho is None:
            return weight
        return kl_annealing(step, rho if rho is not None else self.spec.anneal_rho, weight)


METHODS: dict[str, Method] = {name: Method(spec, MappingProxyType(spec.resolve_options()))
                              for name, spec in METHOD_SPECS.items()}


def get_method(name: str, options: dict | None = None) -> Method:
    """The method ``name`` with its method ``options`` (``temperature``, ``max_active`` …:
    :data:`~ppl_attention.core.method_specs.METHOD_OPTIONS`) checked and over its defaults; an
    option it does not take is refused."""
    spec = method_spec(name)
    return Method(spec, MappingProxyType(spec.resolve_options(options)))


def programs(method: Method, model, batch, kl: float = 1.0, step_kwargs: dict | None = None,
             perturbation: dict | None = None):
    """The model and the guide program of one step as ``method`` runs them on ``batch``: two
    functions of the batch with the method's switches (enumeration, the guide's posterior, the
    KL weight ``kl`` on the alignment sites, the soft REINFORCE baseline ``[B, T]``, and the
    model's own ``step_kwargs``; ``perturbation``: a relaxed method's noise, given)."""
    extra = dict(step_kwargs or {})
    guide_kwargs = dict(posterior=method.posterior, enumerate_z=method.enumerate_guide,
                        kl_scale=kl, **extra)
    if method.baseline == "soft":
        with torch.no_grad():
            guide_kwargs["baseline"] = model.soft_token_log_likelihood(batch)

    def p(b):
        return model.model(b, enumerate_z=method.enumerate_model, kl_scale=kl, **extra)

    guide = method.guide_program(model.guide, perturbation)

    def q(b):
        return guide(b, **guide_kwargs)

    return p, q


def differentiable_loss(method: Method, elbo, model, batch, step: int, kl: float = 1.0,
                        step_kwargs: dict | None = None,
                        perturbation: dict | None = None) -> tuple[float, torch.Tensor]:
    """One stochastic estimate of −ELBO summed over the batch, and the surrogate whose gradient
    is the method's gradient estimator (for REINFORCE methods it differs from −ELBO; for
    reweighted wake-sleep it is the wake-θ plus wake-φ loss) — what ``loss_and_grads``
    differentiates, and what a ``DistributedDataParallel`` module returns. ``kl``: the KL weight
    on the alignment sites; ``step_kwargs``: the model's own step-dependent arguments
    (``model.step_arguments(step)``), passed to model and guide; ``perturbation``: a relaxed
    method's noise ``{site: ε}``, given."""
    p, q = programs(method, model, batch, kl, step_kwargs, perturbation)
    with warnings.catch_warnings():
        # TraceEnum_ELBO looks for enumerated sites in the guide only; `exact` enumerates in
        # the model (tested against brute force), so its warning is noise here.
        warnings.filterwarnings("ignore", "TraceEnum_ELBO found no sample sites")
        # Pyro exposes the surrogate of these two only through these methods (1.8 – 1.9)
        if isinstance(elbo, ReweightedWakeSleep):
            wake_theta, phi = elbo._loss(p, q, (batch,), {})
            return float(wake_theta.detach()), wake_theta + phi
        if isinstance(elbo, ScoreFunctionKL_ELBO):
            return elbo.loss_and_surrogate(p, q, batch)
        if isinstance(elbo, TraceGraph_ELBO):
            value, surrogate = elbo._loss_and_surrogate_loss(p, q, (batch,), {})
            return -float(torch.as_tensor(value).detach()), surrogate
        loss = elbo.differentiable_loss(p, q, batch)
        return float(loss.detach()), loss


def loss_and_grads(method: Method, elbo, model, batch, step: int, kl: float = 1.0,
                   step_kwargs: dict | None = None) -> float:
    """One stochastic estimate of −ELBO (summed over the batch), gradients on the model's params."""
    loss, surrogate = differentiable_loss(method, elbo, model, batch, step, kl, step_kwargs)
    surrogate.backward()
    return loss
