"""The Pyro side of :mod:`ppl_attention.analysis.sbc`: a Pyro model's simulations
(:func:`ppl_attention.pyro.models.base.simulate`) and its guide's draws for one batch, as numpy
arrays (the NumPyro side, :mod:`ppl_attention.numpyro.inference.calibration`, gives the same),
and the planted distortions of a guide site a power study uses."""

from __future__ import annotations

import pyro
import torch
from pyro import poutine
from pyro.poutine.messenger import Messenger

from ...common.contract import capabilities, declared
from ...core.errors import UserError
from ..attend import recording
from ..distributions import position_log_probs
from ..models.base import exact_posterior, simulate
from ..models.device import model_device
from .methods import get_method

__all__ = ["calibration_arrays", "calibration_probs", "distortion", "Distort"]


def distortion(kind: str, factor: float):
    """A planted miscalibration of a guide site's Pyro distribution (the Pyro side of
    :func:`ppl_attention.analysis.sbc.planted`): ``"logits"`` multiplies
    a categorical q's logits by ``factor`` (> 1 over-confident, < 1 under-confident),
    ``"concentration"`` a Dirichlet q's concentration (> 1 over-confident); a tree's
    ``"logits"`` are its arc scores."""
    from pyro.distributions.torch_distribution import MaskedDistribution

    from ..distributions import MaskedDirichlet
    from ..trees import DependencyTree

    def distort(fn):
        mask = None
        if isinstance(fn, MaskedDistribution):
            fn, mask = fn.base_dist, fn._mask
        if kind == "logits" and isinstance(fn, DependencyTree):  # a tree: its arc scores
            new = fn._same_kind(fn.theta * factor)
        elif kind == "logits" and getattr(fn.support, "is_discrete", False) \
                and hasattr(fn, "logits"):  # a categorical guide, however it is subclassed
            new = type(fn)(logits=fn.logits * factor)
        elif kind == "concentration" and isinstance(fn, MaskedDirichlet):
            new = MaskedDirichlet(fn.concentration * factor, fn.source_mask)
        else:
            raise UserError(f"cannot plant {kind!r} in a {type(fn).__name__} guide site")
        return new if mask is None else new.mask(mask)

    return distort


class Distort(Messenger):
    """Replace the distribution of the guide site ``site`` by ``fn(distribution)``."""

    def __init__(self, site: str, fn):
        super().__init__()
        self.site, self.fn = site, fn

    def _pyro_sample(self, msg):
        if msg["name"] == self.site:
            msg["fn"] = self.fn(msg["fn"])


@torch.no_grad()
def calibration_arrays(run, batch, draws: int, seed: int, distort=None,
                       importance: dict | None = None) -> dict:
    """One batch's simulations and guide draws under Pyro (numpy), the random streams seeded
    by ``seed``; ``distort`` a function of the guide site's distribution: ``sim`` (the batch with
    simulated targets), ``mask [B, T]``; ``truth`` — z* ``[B, T]`` (categorical) or its values
    ``[B, T, …]`` —; ``q_probs [B, T, S]`` of a categorical guide or ``q_values [L, B, T, …]``
    and ``logq_draws [L, B]``, ``logq_truth [B]`` of a continuous one (a selection family adds
    ``q_part_probs [B, T, P…]``, q's exact probability that each part — a position ``[S]``, a span
    ``[S, S]`` — is selected, ``part_truth`` the simulated selection's parts and ``part_mask``
    the real ones); ``exact_probs`` where the model has an exact posterior."""
    model = run.model
    site = declared(model, "site")
    m = get_method(run.method)
    pyro.set_rng_seed(seed)
    batch = batch.to(model_device(model))
    sim, value, weights = simulate(model, batch)
    fam = model.family
    if getattr(fam, "tree", False):
        out = _tree_arrays(run, site, m, sim, value, draws, distort)
    else:
        out = _alignment_arrays(run, model, site, m, sim, value, weights, draws, distort)
    if importance is not None:  # the guide's K draws on the simulated targets, to be weighed
        from .importance import importance_arrays

        seed = int(torch.randint(0, 2**31 - 1, (1,)))
        wrap = None if distort is None else (lambda g: Distort(site, distort)(g))
        out["imp"] = importance_arrays(run, sim, importance["samples"], seed, wrap_guide=wrap)
        if "logq_truth" not in out:  # a categorical guide: log q(z*) = Σ_t log q(z*_t)
            guide = model.guide if distort is None else Distort(site, distort)(model.guide)
            fn = poutine.trace(guide).get_trace(sim, posterior=m.posterior).nodes[site]["fn"]
            out["logq_truth"] = _per_pair_log_prob(fn, value, sim.tgt_mask).cpu().numpy()
    return out


def _alignment_arrays(run, model, site, m, sim, value, weights, draws, distort) -> dict:
    fam = model.family
    out = {"sim": sim, "mask": sim.tgt_mask.cpu().numpy()}
    if "exact-posterior" in capabilities(model):
        out["exact_probs"] = exact_posterior(model, sim).cpu().numpy()
    truth = value if fam.enumerable else (value if fam.latent_context else weights)
    out["truth"] = truth.cpu().numpy()
    if m.posterior == "none":
        return out
    guide = model.guide if distort is None else Distort(site, distort)(model.guide)
    if fam.enumerable:
        trace = poutine.trace(guide).get_trace(sim, posterior=m.posterior)
        fn = trace.nodes[site]["fn"]
        out["q_probs"] = position_log_probs(fn, tuple(sim.tgt_out.shape)).exp().cpu().numpy()
        return out
    values, logq = [], []
    for _ in range(draws):
        with recording() as calls:
            trace = poutine.trace(guide).get_trace(sim, posterior=m.posterior)
        node = trace.nodes[site]
        call = next(c for c in calls if c.name == site)
        values.append(node["value"] if fam.latent_context else call.weights)
        logq.append(_per_pair_log_prob(node["fn"], node["value"], sim.tgt_mask))
    out["q_values"] = torch.stack(values).cpu().numpy()
    out["logq_draws"] = torch.stack(logq).cpu().numpy()
    out["logq_truth"] = _per_pair_log_prob(node["fn"], value, sim.tgt_mask).cpu().numpy()
    if fam.selects:  # each part (token t; a position, or a span): q's exact p(part selected)
        f = call.family
        out["q_part_probs"] = f.part_marginals(call.scores, call.mask).cpu().numpy()
        out["part_truth"] = f.parts(value, call.scores.dtype).cpu().numpy()
        src = f.part_mask(sim.src_mask)
        out["part_mask"] = (sim.tgt_mask.reshape(sim.tgt_mask.shape + (1,) * f.part_dims)
                            & src.unsqueeze(1)).cpu().numpy()
    return out


def _tree_arrays(run, site, m, sim, value, draws, distort) -> dict:
    """:func:`calibration_arrays` for a tree family, per word instead of per token: ``truth`` the
    simulated tree's heads ``[B, S]``, ``mask`` the real words, ``q_probs [B, S(word),
    S(head)]`` q's arc marginals (each word's head distribution), ``logq_draws [L, B]`` /
    ``logq_truth [B]`` the exact log q of L draws of q's trees and of the simulated one; where
    the posterior is exact (arc emissions: the tree of θ + φ) the same of it under ``exact_``
    (``exact_probs``, ``exact_logq_draws``, ``exact_logq_truth``). A method without a guide
    (``tree-exact``) has the exact posterior only; ``distort`` then applies to it."""
    from ..trees import DependencyTree
    from .evaluate import tree_scores

    model = run.model
    S, B = sim.src.shape[1], sim.size
    heads = value.reshape(B, S)
    out = {"sim": sim, "mask": sim.src_mask.cpu().numpy(), "truth": heads.cpu().numpy()}
    posteriors = {}
    if m.posterior != "none":
        guide = model.guide if distort is None else Distort(site, distort)(model.guide)
        posteriors[""] = poutine.trace(guide).get_trace(sim, posterior=m.posterior
                                                        ).nodes[site]["fn"]
    if "arc-emissions" in capabilities(model):
        fam = model.family
        scores, lengths = tree_scores(run, sim, posterior=True)
        exact = DependencyTree(scores, lengths, projective=fam.projective,
                               single_root=fam.single_root)
        posteriors["exact_"] = exact if distort is None or m.posterior != "none" else \
            distort(exact)
    for prefix, fn in posteriors.items():
        mu = fn.marginals.reshape(B, S, S)
        out[f"{prefix}q_probs" if prefix == "" else "exact_probs"] = \
            mu.transpose(-1, -2).cpu().numpy()
        tree_draws = fn.sample((draws,))
        out[f"{prefix}logq_draws"] = fn.log_prob(tree_draws).reshape(draws, B).cpu().numpy()
        out[f"{prefix}logq_truth"] = fn.log_prob(heads.reshape(fn.batch_shape + (S,))
                                                 ).reshape(B).cpu().numpy()
    return out


def _per_pair_log_prob(fn, value, tgt_mask):
    lp = fn.log_prob(value)
    return torch.where(tgt_mask, lp, torch.zeros_like(lp)).sum(-1)


@torch.no_grad()
def calibration_probs(run, batch) -> dict:
    """On real targets: q's probabilities ``[B, T, S]`` (a categorical guide) or its mean
    weights over draws, and the exact posterior where there is one — for gold coverage."""
    model = run.model
    site = declared(model, "site")
    m = get_method(run.method)
    batch = batch.to(model_device(model))
    out = {}
    if "exact-posterior" in capabilities(model):
        out["exact_probs"] = exact_posterior(model, batch).cpu().numpy()
    if m.posterior != "none" and not model.family.latent_context:
        if model.family.enumerable:
            trace = poutine.trace(model.guide).get_trace(batch, posterior=m.posterior)
            fn = trace.nodes[site]["fn"]
            out["q_probs"] = position_log_probs(
                fn, tuple(batch.tgt_out.shape)).exp().cpu().numpy()
        else:
            ws = []
            for _ in range(20):
                with recording() as calls:
                    model.guide(batch, posterior=m.posterior)
                ws.append(next(c for c in calls if c.name == site).weights)
            out["q_probs"] = torch.stack(ws).mean(0).cpu().numpy()
    return out
