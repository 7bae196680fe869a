"""The methods registry: a name → the family the model samples, the guide, and the ELBO.

Names follow DESIGN.md §3 (Deng et al. 2018 Table 1 names in brackets in the docstrings).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from pyro.infer import (
    ReweightedWakeSleep,
    Trace_ELBO,
    TraceEnum_ELBO,
    TraceGraph_ELBO,
    TraceMeanField_ELBO,
)

from .. import families as fam

PLATES = 2  # batch and target


@dataclass(frozen=True)
class Method:
    """How one inference method trains a model.

    ``family``: builds the alignment family (given the hidden size, for BAM's key MLP).
    ``posterior``: the guide ("none", "prior" or "inference"); ``enumerate_model`` /
    ``enumerate_guide``: parallel enumeration on that side; ``elbo``: builds the estimator;
    ``baseline``: REINFORCE control variate for sampled categorical guides ("soft": var-attn's
    soft-attention log-likelihood; "avg": a decaying average of the per-token ELBO);
    ``anneal_rho``: KL weight λ(t) = sigmoid(t·ρ) on the alignment site (BAM), or None.
    """

    name: str
    description: str
    family: Callable[[int], fam.Family]
    posterior: str
    elbo: Callable[[], object]
    enumerate_model: bool = False
    enumerate_guide: bool = False
    baseline: str | None = None
    anneal_rho: float | None = None
    options: dict = field(default_factory=dict)

    def kl_scale(self, step: int) -> float:
        if self.anneal_rho is None:
            return 1.0
        # λ(t) = sigmoid(t·ρ), shifted so that it starts near 0 (BAM's annealing)
        return 1.0 / (1.0 + math.exp(-(step * self.anneal_rho - 6.0)))


def _enum():
    return TraceEnum_ELBO(max_plate_nesting=PLATES)


METHODS: dict[str, Method] = {m.name: m for m in [
    Method("soft", "soft attention, maximum likelihood [Soft attention]",
           lambda h: fam.Soft(), "none", lambda: Trace_ELBO(max_plate_nesting=PLATES)),
    Method("exact", "exact marginal likelihood by enumeration [Marginal likelihood]",
           lambda h: fam.Categorical(), "none", _enum, enumerate_model=True),
    Method("hmm-exact", "exact marginal likelihood of hard monotonic (HMM) attention, forward "
           "algorithm by enumeration [Wu & Cotterell 2019]",
           lambda h: fam.MarkovCategorical(), "none", _enum, enumerate_model=True),
    Method("hard-enum", "E_p[log p(y|z)] enumerated, prior as guide [Hard attention + Enum]",
           lambda h: fam.Categorical(), "prior", _enum, enumerate_guide=True),
    Method("hard-sample", "E_p[log p(y|z)] by REINFORCE, prior as guide [Hard attention + Sample]",
           lambda h: fam.Categorical(), "prior",
           lambda: TraceGraph_ELBO(max_plate_nesting=PLATES), baseline="soft"),
    Method("vae-enum", "exact ELBO with q(z|x,y) enumerated [Variational attention + Enum]",
           lambda h: fam.Categorical(), "inference", _enum, enumerate_guide=True),
    Method("vae-sample", "ELBO by REINFORCE with baselines [Variational attention + Sample]",
           lambda h: fam.Categorical(), "inference",
           lambda: TraceGraph_ELBO(max_plate_nesting=PLATES), baseline="soft"),
    Method("vae-gumbel", "Concrete relaxation of q and p, reparameterized",
           lambda h: fam.RelaxedCategorical(0.5), "inference",
           lambda: Trace_ELBO(max_plate_nesting=PLATES)),
    Method("vae-rws", "reweighted wake-sleep with q(z|x,y) (K=5)",
           lambda h: fam.Categorical(), "inference",
           lambda: ReweightedWakeSleep(num_particles=5, max_plate_nesting=PLATES,
                                       vectorize_particles=True)),
    Method("dirichlet", "Dirichlet alignment, implicit reparameterization [Variational relaxed]",
           lambda h: fam.Dirichlet(1.0), "inference",
           lambda: TraceMeanField_ELBO(max_plate_nesting=PLATES)),
    Method("bam-weibull", "BAM-WC: Weibull attention, contextual Gamma prior, analytic KL",
           lambda h: fam.Weibull(k=10.0, key_dim=h), "prior",
           lambda: TraceMeanField_ELBO(max_plate_nesting=PLATES), anneal_rho=0.02),
    Method("bam-lognormal", "BAM-LC: LogNormal attention, contextual prior, analytic KL",
           lambda h: fam.LogNormal(sigma=0.5, key_dim=h), "prior",
           lambda: TraceMeanField_ELBO(max_plate_nesting=PLATES), anneal_rho=0.02),
    Method("gaussian-context", "Gaussian context vector [Variational attention, Bahuleyan]",
           lambda h: fam.GaussianContext(prior="soft"), "inference",
           lambda: TraceMeanField_ELBO(max_plate_nesting=PLATES)),
    Method("segment-crf", "segmentation attention: binary linear-chain CRF marginals, maximum "
           "likelihood [Structured attention, Kim et al. 2017]",
           lambda h: fam.SegmentCRF(), "none", lambda: Trace_ELBO(max_plate_nesting=PLATES)),
]}


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; valid: {', '.join(METHODS)}") from None


def differentiable_loss(method: Method, elbo, model, batch, step: int,
                        avg_baseline: float | None = None) -> tuple[float, torch.Tensor]:
    """One stochastic estimate of −ELBO summed over the batch, and the surrogate whose gradient
    is the method's gradient estimator (for REINFORCE methods it differs from −ELBO; for
    reweighted wake-sleep it is the wake-θ plus wake-φ loss) — what ``loss_and_grads``
    differentiates, and what a ``DistributedDataParallel`` module returns."""
    kl = method.kl_scale(step)
    baseline = None
    if method.baseline == "soft":
        with torch.no_grad():
            baseline = model.soft_token_log_likelihood(batch)
    elif method.baseline == "avg" and avg_baseline is not None:
        baseline = torch.full(batch.tgt_out.shape, avg_baseline)
    guide_kwargs = dict(posterior=method.posterior, enumerate_z=method.enumerate_guide,
                        kl_scale=kl)
    if baseline is not None:
        guide_kwargs["baseline"] = baseline

    def p(b):
        return model.model(b, enumerate_z=method.enumerate_model, kl_scale=kl)

    def q(b):
        return model.guide(b, **guide_kwargs)

    with warnings.catch_warnings():
        # TraceEnum_ELBO looks for enumerated sites in the guide only; `exact` enumerates in
        # the model (tested against brute force), so its warning is noise here.
        warnings.filterwarnings("ignore", "TraceEnum_ELBO found no sample sites")
        # Pyro exposes the surrogate of these two only through these methods (1.8 – 1.9)
        if isinstance(elbo, ReweightedWakeSleep):
            wake_theta, phi = elbo._loss(p, q, (batch,), {})
            return float(wake_theta.detach()), wake_theta + phi
        if isinstance(elbo, TraceGraph_ELBO):
            value, surrogate = elbo._loss_and_surrogate_loss(p, q, (batch,), {})
            return -float(torch.as_tensor(value).detach()), surrogate
        loss = elbo.differentiable_loss(p, q, batch)
        return float(loss.detach()), loss


def loss_and_grads(method: Method, elbo, model, batch, step: int,
                   avg_baseline: float | None = None) -> float:
    """One stochastic estimate of −ELBO (summed over the batch), gradients on the model's params."""
    loss, surrogate = differentiable_loss(method, elbo, model, batch, step, avg_baseline)
    surrogate.backward()
    return loss
