"""``ScoreFunctionKL_ELBO``: the ELBO with every latent site's KL in closed form and the
score-function (REINFORCE) gradient for the sites that cannot be reparameterized — what a latent
dependency tree needs (method ``tree-sample``): its KL is exact (:func:`~ppl_attention.pyro.trees.
kl_dependency_tree`), but no draw of a tree is differentiable.

For guide sites z with distributions q and model sites with priors p, and observed sites y,

    ELBO = E_q[log p(y | z)] − Σ_z KL(q(z) ‖ p(z)),

    surrogate = log p(y | z) − Σ_z KL(q ‖ p) + Σ_z stop_grad(r_b − b_b) · log q(z_b),

with r_b = log p(y_b | z) the pair's log-likelihood (each pair's draw is scored by its own
pair: the batch plate; with ``vectorize_particles``, each particle's by its own) and b_b a
baseline (``infer={"baseline": {"baseline_value": b}}`` on the guide site, per pair ``[B]`` or
per token ``[B, T]``, summed per pair). The gradient of the surrogate is an unbiased estimate
of the ELBO's: pathwise through log p(y | z) and the KL, REINFORCE for the draw (log q of the
real, unmasked draws only). A site whose draw was made differentiable by
:func:`~ppl_attention.pyro.inference.relaxation.relax` (``infer["relaxed"]``) takes no
score-function term: its gradient is pathwise through the relaxed draw (biased: a relaxation),
the KL still exact. Pyro's TraceMeanField_ELBO takes the same closed-form KLs but
refuses sites that are not reparameterized; TraceGraph_ELBO estimates the KL by sampling.
"""

from __future__ import annotations

import torch
from pyro import poutine
from pyro.distributions.util import scale_and_mask
from pyro.infer import Trace_ELBO
from pyro.infer.util import is_validation_enabled
from pyro.poutine.util import prune_subsample_sites, site_is_subsample
from pyro.util import check_model_guide_match, check_site_shape
from torch.distributions import kl_divergence

from ...core.errors import UserError

__all__ = ["ScoreFunctionKL_ELBO"]


def _frames(trace) -> tuple:
    """(the batch plate's dim, the vectorized particles' dim, the batch size): None where the
    trace has no such plate."""
    batch = particles = None
    B = 1
    for site in trace.nodes.values():
        for frame in site.get("cond_indep_stack", ()):
            if frame.name == "batch":
                batch, B = frame.dim, frame.size
            elif frame.name == "num_particles_vectorized":
                particles = frame.dim
    return batch, particles, B


def _per_pair(x: torch.Tensor, batch: int | None, particles: int | None, B: int) -> torch.Tensor:
    """``x`` summed over every dim but the batch plate's and the vectorized particles':
    ``[P, B]`` (``[B]`` without vectorized particles) — each particle's draw is scored by its own
    reward. Without a batch plate, the whole (per particle) spread over the B = 1 pair."""
    x = torch.as_tensor(x)
    keep = [d for d in (particles, batch) if d is not None and x.dim() >= -d]
    drop = [d for d in range(-x.dim(), 0) if d not in keep]
    x = x.sum(drop) if drop else x
    if batch is None or batch not in keep:
        x = (x / B).unsqueeze(-1)
    return x.expand(*x.shape[:-1], B)


def _score_function(site) -> torch.Tensor:
    """log q(z) of a guide site, masked as its log-density is — by the distribution's own mask
    and ``poutine.mask`` — but not scaled. Pyro's ``ScoreParts.score_function`` is left unmasked
    (TraceGraph_ELBO multiplies it by masked costs): taken as it is, the draws at masked
    positions (padded target tokens) would be scored with their pair's reward — unbiased, but
    noise, and another estimator than the NumPyro mirror's."""
    return scale_and_mask(site["fn"].log_prob(site["value"]), mask=site["mask"])


class ScoreFunctionKL_ELBO(Trace_ELBO):
    """The estimator of the module docstring (``num_particles`` averaged as Pyro's ELBOs)."""

    def _get_trace(self, model, guide, args, kwargs):
        """The guide's trace and the model's run against it (Pyro's ``get_importance_trace``),
        the log-densities computed at every site but a relaxed one — a relaxed draw is no
        structure, and its site enters by its KL alone."""
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(
            *args, **kwargs)
        if is_validation_enabled():
            check_model_guide_match(model_trace, guide_trace, self.max_plate_nesting)
        guide_trace = prune_subsample_sites(guide_trace)
        model_trace = prune_subsample_sites(model_trace)
        relaxed = {n for n, s in guide_trace.nodes.items()
                   if s["type"] == "sample" and (s.get("infer") or {}).get("relaxed")}
        model_trace.compute_log_prob(site_filter=lambda name, site: name not in relaxed)
        guide_trace.compute_log_prob(site_filter=lambda name, site: name not in relaxed)
        if is_validation_enabled():
            for name, site in model_trace.nodes.items():
                if site["type"] == "sample" and name not in relaxed:
                    check_site_shape(site, self.max_plate_nesting)
        return model_trace, guide_trace

    def _terms(self, model_trace, guide_trace):
        model_trace.compute_log_prob(site_filter=lambda name, site: site["is_observed"])
        dims = _frames(model_trace)
        elbo, reward, kl_total = 0.0, 0.0, 0.0
        latent = [n for n, s in guide_trace.nodes.items()
                  if s["type"] == "sample" and not s["is_observed"] and not site_is_subsample(s)]
        for name, site in model_trace.nodes.items():
            if site["type"] != "sample" or site_is_subsample(site):
                continue
            if name in latent:
                g = guide_trace.nodes[name]
                kl = scale_and_mask(kl_divergence(g["fn"], site["fn"]), site["scale"],
                                    site["mask"])
                kl_total = kl_total + kl.sum()
            elif site["is_observed"]:
                elbo = elbo + site["log_prob_sum"]
                reward = reward + _per_pair(site["log_prob"], *dims)
            else:
                raise UserError(f"site {name!r} is latent in the model but not in the guide")
        surrogate = elbo - kl_total
        for name in latent:
            g = guide_trace.nodes[name]
            if name not in model_trace.nodes:
                raise UserError(f"guide site {name!r} is not in the model")
            if g["fn"].has_rsample or g["infer"].get("relaxed"):
                continue  # pathwise: a reparameterized or relaxed draw
            score = _per_pair(_score_function(g), *dims)
            b = g["infer"].get("baseline", {}).get("baseline_value")
            b = 0.0 if b is None else torch.as_tensor(b)
            if torch.is_tensor(b) and b.dim() >= 2:  # per token: the pair's sum
                b = b.reshape(b.shape[0], -1).sum(-1)
            surrogate = surrogate + ((reward - b).detach() * score).sum()
        return elbo - kl_total, surrogate

    def loss_and_surrogate(self, model, guide, *args, **kwargs):
        """(−ELBO as a float, −surrogate to differentiate), averaged over the particles."""
        value, surrogate = 0.0, 0.0
        for model_trace, guide_trace in self._get_traces(model, guide, args, kwargs):
            e, s = self._terms(model_trace, guide_trace)
            value += float(torch.as_tensor(e).detach()) / self.num_particles
            surrogate = surrogate + s / self.num_particles
        return -value, -surrogate

    def loss(self, model, guide, *args, **kwargs):
        with torch.no_grad():
            return self.loss_and_surrogate(model, guide, *args, **kwargs)[0]

    def differentiable_loss(self, model, guide, *args, **kwargs):
        return self.loss_and_surrogate(model, guide, *args, **kwargs)[1]

    def loss_and_grads(self, model, guide, *args, **kwargs):
        value, surrogate = self.loss_and_surrogate(model, guide, *args, **kwargs)
        surrogate.backward()
        return value
