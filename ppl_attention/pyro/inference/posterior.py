"""The Pyro side of posterior analysis: what :func:`ppl_attention.analysis.to_inference_data`
and :func:`ppl_attention.analysis.guide_diagnostics` read of one batch, as numpy arrays — the
NumPyro side, :mod:`ppl_attention.numpyro.inference.posterior`, gives the same keys."""

from __future__ import annotations

import numpy as np
import pyro
import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample

from ...common.contract import capabilities, declared
from ...core.errors import UserError
from ..attend import recording
from ..distributions import categorical_draws, position_log_probs
from ..models.base import (
    exact_posterior,
    exact_token_log_likelihood,
    posterior_samples,
    prior_probs,
)
from ..models.device import model_device
from .evaluate import guide_posterior, log_importance_weights
from .methods import get_method

__all__ = ["alignment_arrays", "diagnostic_arrays", "observed_log_likelihood"]


def _site(calls, site: str):
    for c in calls:
        if c.name == site:
            return c
    raise UserError(f"no pa.attend call wrote the site {site!r} (declare the model's `site`)")


def _observed(trace, skip: str) -> torch.Tensor:
    """Σ of the observed sites' log-densities (the targets), ``[..., B, T]``."""
    trace.compute_log_prob()
    total = 0.0
    for name, site in trace.nodes.items():
        if site["type"] == "sample" and site["is_observed"] and name != skip \
                and not site_is_subsample(site):
            total = total + site["log_prob"]
    return total


def observed_log_likelihood(model, batch, z: torch.Tensor) -> torch.Tensor:
    """log p(y_t | x, y<t, z_t) at alignment draws ``z [K, B, T]`` (source positions) →
    ``[K, B, T]``: the model's ``alignment_log_likelihood`` member, or its program run once
    with the alignment site conditioned on all K draws at once (they broadcast on the left, as
    enumerated values do)."""
    own = getattr(model, "alignment_log_likelihood", None)
    if callable(own):
        return own(batch, z)
    site = declared(model, "site")
    conditioned = poutine.condition(model.model, data={site: z})
    trace = poutine.trace(conditioned).get_trace(batch)
    return torch.broadcast_to(_observed(trace, site), z.shape)


@torch.no_grad()
def alignment_arrays(run, batch, num_samples: int, seed: int) -> dict:
    """What :func:`ppl_attention.analysis.inference_data.to_inference_data` reads of one batch
    under Pyro, its random streams seeded by ``seed``, as numpy: ``prior`` [B, T, S]
    probabilities (or None), ``exact`` [B, T, S] or None, ``posterior`` draws [K, B, T, S],
    ``q`` draws [K, B, T, S] or None, ``log_lik`` [K, B, T] (log p(y_t | ·, z_t) at the
    posterior draws), ``prior_draws`` [K, B, T, S]."""
    model = run.model
    batch = batch.to(model_device(model))
    generator = torch.Generator().manual_seed(seed)
    caps = capabilities(model)
    site = declared(model, "site")
    B, T = batch.tgt_out.shape
    K = num_samples
    fam = model.family

    def one_hot_draws(probs):  # S: the site's positions (a user's site need not be batch.src's)
        S = probs.shape[-1]
        idx = categorical_draws(probs.reshape(-1, S), K, generator)
        return torch.nn.functional.one_hot(idx.T.reshape(K, B, T), S).to(probs.dtype)

    if getattr(fam, "tree", False):
        return _tree_arrays(run, batch, K, generator)
    out = {"prior": prior_probs(model, batch) if "prior" in caps else None, "exact": None,
           "q": None}
    if fam.deterministic:
        with recording() as calls, poutine.block():
            trace = poutine.trace(model.model).get_trace(batch)
        w = _site(calls, site).weights
        out["prior"] = w
        out["posterior"] = out["prior_draws"] = w.expand(K, B, T, w.shape[-1])
        out["log_lik"] = torch.broadcast_to(_observed(trace, site), (B, T)).expand(K, B, T)
    elif "posterior-samples" in caps:
        idx = posterior_samples(model, batch, K, generator)
        out["exact"] = exact_posterior(model, batch)
        out["posterior"] = torch.nn.functional.one_hot(idx, out["exact"].shape[-1]).float()
        out["log_lik"] = observed_log_likelihood(model, batch, idx)
        out["prior_draws"] = one_hot_draws(out["prior"])
        if get_method(run.method).posterior == "inference":
            guide = poutine.trace(model.guide).get_trace(batch, posterior="inference")
            fn = guide.nodes[site]["fn"]
            q = position_log_probs(fn, (B, T)).exp()
            out["q"] = one_hot_draws(q)
    else:
        draws, lls, priors = [], [], []
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))  # generator.device
        pyro.set_rng_seed(seed)
        post = guide_posterior(run)
        for _ in range(K):
            with recording() as calls, poutine.block():
                guide = poutine.trace(model.guide).get_trace(batch, posterior=post)
            draws.append(_site(calls, site).weights)
            with poutine.block():
                replayed = poutine.trace(poutine.replay(model.model, trace=guide)).get_trace(batch)
            lls.append(torch.broadcast_to(_observed(replayed, site), (B, T)))
            with recording() as calls, poutine.block():
                model.model(batch)
            priors.append(_site(calls, site).weights)
        out["posterior"], out["log_lik"] = torch.stack(draws), torch.stack(lls)
        out["prior_draws"] = torch.stack(priors)
    return {k: (None if v is None else v.float().cpu().numpy()) for k, v in out.items()}


def _tree_arrays(run, batch, K: int, generator: torch.Generator) -> dict:
    """:func:`alignment_arrays` for a tree family: the query's word attention (``posterior``,
    ``prior_draws``: deterministic given x, y<t), and the source's tree — ``heads`` [K, B, S]
    drawn from the guide q(tree | x, y) (the exact prior tree for ``tree-marginals``, which has
    no guide), ``prior_heads`` [K, B, S] from the prior p(tree | x), ``arc_marginals``
    [B, S, S] of the tree the heads are drawn from; ``log_lik`` at each drawn tree."""
    from ..trees import DependencyTree

    model = run.model
    site = declared(model, "site")
    fam = model.family
    B, T = batch.tgt_out.shape
    S = batch.src.shape[1]
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    pyro.set_rng_seed(seed)
    with recording() as calls, poutine.block():
        trace = poutine.trace(model.model).get_trace(batch)
    call = _site(calls, site)
    w = call.weights
    arcs = call.scores.reshape(B, -1, S, S).sum(1)
    prior = DependencyTree(arcs, batch.src_mask.sum(-1), projective=fam.projective,
                           single_root=fam.single_root)
    out = {"prior": w, "exact": None, "q": None, "posterior": w.expand(K, B, T, S),
           "prior_draws": w.expand(K, B, T, S), "prior_heads": prior.sample((K,))}
    if fam.deterministic:
        out["heads"], out["arc_marginals"] = out["prior_heads"], prior.marginals
        out["log_lik"] = torch.broadcast_to(_observed(trace, site), (B, T)).expand(K, B, T)
    else:
        heads, lls = [], []
        post = guide_posterior(run)
        for _ in range(K):
            with poutine.block():
                guide = poutine.trace(model.guide).get_trace(batch, posterior=post)
                replayed = poutine.trace(poutine.replay(model.model, trace=guide)).get_trace(batch)
            heads.append(guide.nodes[site]["value"].reshape(B, -1, S)[:, 0])
            lls.append(torch.broadcast_to(_observed(replayed, site), (B, T)))
        q = guide.nodes[site]["fn"]
        out["arc_marginals"] = q.marginals.reshape(B, -1, S, S)[:, 0]
        out["heads"], out["log_lik"] = torch.stack(heads), torch.stack(lls)
    return {k: (None if v is None else v.float().cpu().numpy()) for k, v in out.items()}



@torch.no_grad()
def diagnostic_arrays(run, b, num_samples: int, seed: int) -> dict:
    """What :func:`ppl_attention.analysis.diagnostics.guide_diagnostics` reads of one batch,
    under Pyro, its random streams seeded by ``seed``: ``lw`` log importance weights [K, B];
    where the model has an exact posterior ``exact_ll`` [B, T], ``log_q`` [B, T, S] and
    ``p_exact`` [B, T, S]; ``draws`` [K, B, T] (a selection family: [K, B, T, S], every selected
    position) (q's draws as source positions: a continuous
    family's largest weight); ``trees`` [K, B, S] (a tree family's guide draws)."""
    model = run.model
    caps = capabilities(model)
    exact = "exact-posterior" in caps and "exact-likelihood" in caps
    pyro.set_rng_seed(seed)
    b = b.to(model_device(model))
    site = declared(model, "site")
    post = guide_posterior(run)
    out = {"lw": log_importance_weights(run, b, num_samples).cpu().numpy().astype(np.float64)}
    if exact:
        guide = poutine.trace(model.guide).get_trace(b, posterior=post)
        fn = guide.nodes[site]["fn"]
        log_q = position_log_probs(fn, tuple(b.tgt_out.shape))
        S = log_q.shape[-1]
        q = log_q.exp().reshape(-1, S)
        draws = torch.multinomial(q, num_samples, replacement=True).T.reshape(
            num_samples, *b.tgt_out.shape)
        out.update(exact_ll=exact_token_log_likelihood(model, b).cpu().numpy(),
                   log_q=log_q.cpu().numpy(), p_exact=exact_posterior(model, b).cpu().numpy(),
                   draws=draws.cpu().numpy())
    elif getattr(model.family, "tree", False):  # the word attention; q's trees of the sources
        with recording() as calls, poutine.block():
            model.model(b)
        w = next(c for c in calls if c.name == site).weights.argmax(-1)
        out["draws"] = w.expand(num_samples, *w.shape).cpu().numpy()
        if post != "none" and get_method(run.method).posterior != "none":
            trees = []
            for _ in range(num_samples):
                with poutine.block():
                    g = poutine.trace(model.guide).get_trace(b, posterior=post)
                trees.append(g.nodes[site]["value"].reshape(b.size, -1, b.src.shape[1])[:, 0])
            out["trees"] = torch.stack(trees).cpu().numpy()
    else:
        ws = []
        for _ in range(num_samples):
            with recording() as calls, poutine.block():
                model.guide(b, posterior=post)
            w = next(c for c in calls if c.name == site).weights
            # a selection: every position it reads
            ws.append(model.family.read_positions(w) if model.family.selects else w.argmax(-1))
        out["draws"] = torch.stack(ws).cpu().numpy()
    return out
