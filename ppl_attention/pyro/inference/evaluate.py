"""Evaluation of any model meeting the contract: NLL/token — exact where the model has the
``exact-likelihood`` capability (enumeration for categorical alignments, whatever method trained
them; soft attention as it stands), an IWAE-K bound otherwise — ELBO/token, MAP alignments and
AER against gold.

Everything here reads the model through its Pyro program and the capabilities of
:mod:`ppl_attention.pyro.models.base`; nothing looks at a model's or family's name. Batches go to
the
model's device first (a no-op where they already are).
"""

from __future__ import annotations

import contextlib
import math

import pyro
import pyro.util
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceEnum_ELBO, TraceMeanField_ELBO
from pyro.poutine.util import site_is_subsample

from ...common.evaluation import evaluate, monotonic_share  # noqa: E402  (the orchestrator, below)
from ...common.runs import Run
from ...core.errors import UserError
from ...core.links import links_from_positions
from ...core.method_specs import guide_posterior as core_guide_posterior
from ...core.progress import progress_bar
from ..attend import recording
from ..models.base import capabilities, declared, exact_posterior, exact_token_log_likelihood
from ..models.device import model_device
from .methods import get_method

__all__ = ["evaluate", "mean_support", "map_trees", "map_trees_by_index", "tree_scores",
           "nll_per_token",
           "elbo_per_token", "map_alignments", "alignment_links", "log_importance_weights",
           "iwae_log_likelihood", "token_log_likelihood", "guide_posterior", "monotonic_share"]


def guide_posterior(run: Run) -> str:
    """The guide the run's method trained ("inference" or "prior"); an exact method has none,
    and its evaluation by importance sampling uses the model's inference network."""
    return core_guide_posterior(run.method, run.model)


def token_log_likelihood(run: Run, batch) -> torch.Tensor:
    """Exact log p(y_t | x, y<t) ``[B, T]`` (needs the ``exact-likelihood`` capability)."""
    return exact_token_log_likelihood(run.model, batch)


def _batch_dim(trace) -> int | None:
    for site in trace.nodes.values():
        for frame in site.get("cond_indep_stack", ()):
            if frame.name == "batch":
                return frame.dim
    return None


def _per_pair(trace, batch) -> torch.Tensor:
    """Σ of the log-densities of ``trace``'s sample sites per pair ``[B]`` on the batch's device
    (summing every dim right of the ``batch`` plate)."""
    dim, B = _batch_dim(trace), batch.size
    total = torch.zeros(B, device=batch.src.device)
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or "log_prob" not in site or site_is_subsample(site):
            continue
        lp = site["log_prob"]
        if dim is None or lp.dim() < -dim or lp.shape[dim] != B:
            raise UserError(f"site {name!r} is not under the plate 'batch' of size {B} "
                             f"(log-density shape {list(lp.shape)}); per-pair importance weights "
                             f"need every site inside pyro.plate('batch', B)")
        right = tuple(range(dim + 1, 0))
        lp = lp.sum(right) if right else lp
        total = total + lp.reshape(-1, B).sum(0)
    return total


def log_importance_weights(run: Run, batch, k: int = 10) -> torch.Tensor:
    """log p(y, z_k | x) − log q(z_k | x, y) for K draws z_k ~ q, per pair ``[K, B]`` (every
    latent site of the guide, whole alignments for a categorical one)."""
    model, post = run.model, guide_posterior(run)
    weights = []
    for _ in range(k):
        g = poutine.trace(model.guide).get_trace(batch, posterior=post)
        mt = poutine.trace(poutine.replay(model.model, trace=g)).get_trace(batch)
        g.compute_log_prob()
        mt.compute_log_prob()
        weights.append(_per_pair(mt, batch) - _per_pair(g, batch))
    return torch.stack(weights)


def iwae_log_likelihood(run: Run, batch, k: int = 10) -> torch.Tensor:
    """log (1/K) Σ_k p(y, z_k | x) / q(z_k | x, y) per pair ``[B]`` (a lower bound on log p)."""
    return log_importance_weights(run, batch, k).logsumexp(0) - math.log(k)


def _exact(run: Run) -> bool:
    return "exact-likelihood" in capabilities(run.model)


def _progress(batches: list, what: str):
    """A bar over the batches when there are enough of them to take a while."""
    return progress_bar(batches, desc=what, unit="batch", leave=False, disable=len(batches) < 20)


@contextlib.contextmanager
def seeded(seed: int):
    """Pyro's random streams (torch, Python, NumPy) seeded with ``seed`` inside the block and
    restored after it: an estimate made inside is the same on every call with the same seed,
    and draws after it are those the caller would have had."""
    state = pyro.util.get_rng_state()
    pyro.set_rng_seed(seed)
    try:
        yield
    finally:
        pyro.util.set_rng_state(state)


@torch.no_grad()
def nll_per_token(run: Run, batches: list, iwae_k: int = 10, seed: int = 0) -> float:
    """NLL/token: exact where the model has the capability, else the IWAE-``iwae_k`` bound,
    its draws seeded by ``seed`` (the same figure on every call)."""
    total, n = 0.0, 0
    exact = _exact(run)
    with seeded(seed):
        for b in _progress(batches, "NLL" if exact else f"IWAE-{iwae_k}"):
            b = b.to(model_device(run.model))
            if exact:
                total -= float(token_log_likelihood(run, b).sum())
            else:
                total -= float(iwae_log_likelihood(run, b, iwae_k).sum())
            n += b.n_tokens
    return total / n


def elbo_per_token(run: Run, batches: list, samples: int = 5, seed: int = 0) -> float:
    """The ELBO of the trained (model, guide) pair with KL weight 1: exact (enumerated) for
    categorical guides; a mean of ``samples`` estimates otherwise, seeded by ``seed``. Exact
    methods (no guide) report log p itself."""
    m = get_method(run.method)
    model = run.model
    fam = model.family
    nest = declared(model, "max_plate_nesting")
    if fam.deterministic or m.posterior == "none":
        return -nll_per_token(run, batches, seed=seed)
    if fam.enumerable:
        elbo, reps = TraceEnum_ELBO(max_plate_nesting=nest), 1
        gk = dict(posterior=m.posterior, enumerate_z=True)
    else:
        analytic = m.spec.objective == "TraceMeanField_ELBO"
        elbo = (TraceMeanField_ELBO if analytic else Trace_ELBO)(max_plate_nesting=nest)
        reps, gk = samples, dict(posterior=m.posterior)
    total, n = 0.0, 0
    with torch.no_grad(), seeded(seed):
        for b in _progress(batches, "ELBO"):
            b = b.to(model_device(model))
            for _ in range(reps):
                total -= elbo.loss(model.model, lambda bb: model.guide(bb, **gk), b) / reps
            n += b.n_tokens
    return total / n


def _site_call(calls, site: str):
    for c in calls:
        if c.name == site:
            return c
    raise UserError(f"no pa.attend call wrote the site {site!r} (declare the model's `site`)")


@torch.no_grad()
def map_alignments(run: Run, batch) -> torch.Tensor:
    """The alignment of each target token ``[B, T]``: argmax_j p(z_t = j | x, y) (exact) where
    the model has an exact posterior; the argmax of the attention weights for a deterministic
    family; for continuous families the argmax of the guide's scores, which is the argmax of
    q's mean weights (Dirichlet, Weibull, LogNormal: the mean is monotone in the scores;
    Gaussian context: its soft weights) and the most probable vertex of the Concrete.
    A selection family (``family.selects``: segments, spans): every position the MAP selection
    reads, ``[B, T, S]`` bool — q's for a sampled one, the model's for the exact marginals.
    Deterministic, so both backends agree."""
    model = run.model
    batch = batch.to(model_device(model))
    if "exact-posterior" in capabilities(model):
        return exact_posterior(model, batch).argmax(-1)
    site = declared(model, "site")
    if model.family.selects:  # the MAP selection: q's, or the model's for the marginals
        with recording() as calls, poutine.block():
            if model.family.deterministic:
                model.model(batch)
            else:
                model.guide(batch, posterior=guide_posterior(run))
        call = _site_call(calls, site)
        return model.family.read_positions(model.family.map_weights(call.scores, call.mask))
    if model.family.deterministic or model.family.tree:  # a tree: the query's word attention
        with recording() as calls, poutine.block():
            model.model(batch)
        return _site_call(calls, site).weights.argmax(-1)
    with recording() as calls, poutine.block():
        model.guide(batch, posterior=guide_posterior(run))
    call = _site_call(calls, site)
    return call.scores.masked_fill(~call.mask, -torch.inf).argmax(-1)


def tree_scores(run: Run, batch, posterior: bool = True):
    """The arc scores of the model's tree of each source, ``[B, S, S]``, and the source lengths
    ``[B]``, for a model whose family is a tree family: the prior's, recorded from its
    ``attend`` call (one tree per query pooled into the tree they all agree on, the product of
    the per-query distributions: arc scores summed over queries) — and where the posterior is
    exact (``posterior`` and the capability ``arc-emissions``: the emission factors over arcs)
    the exact posterior's, θ + φ with φ the model's ``arc_emission_scores``."""
    model = run.model
    batch = batch.to(model_device(model))
    if not getattr(model.family, "tree", False):
        raise UserError(f"trees: {type(model).__name__} attends with the {model.family.name!r} "
                        f"family, not through a dependency tree")
    with recording() as calls, poutine.block():
        model.model(batch)
    call = _site_call(calls, declared(model, "site"))
    scores = call.scores
    scores = scores.reshape(batch.size, -1, *scores.shape[-2:]).sum(1)
    if posterior and "arc-emissions" in capabilities(model):
        with poutine.block():
            phi = model.arc_emission_scores(batch)
        scores = scores + phi.reshape(batch.size, -1, *phi.shape[-2:]).sum(1)
    return scores, batch.src_mask.sum(-1)


@torch.no_grad()
def map_trees(run: Run, batch) -> list[list[int]]:
    """The MAP tree of each source (:func:`tree_scores`: under the exact posterior where the
    model's emission factors over arcs, else under its prior): heads of the real words, one
    list per pair."""
    from ..trees import DependencyTree

    scores, lengths = tree_scores(run, batch)
    fam = run.model.family
    heads = DependencyTree(scores, lengths, projective=fam.projective,
                           single_root=fam.single_root).argmax()
    return [heads[r, :int(L)].tolist() for r, L in enumerate(lengths)]


def support_sizes(fn):
    """The size of a sparse site's support per row: q's positions with probability above 0
    (:class:`~ppl_attention.pyro.sparse.SparsemaxCategorical`) or SparseMAP's active structures
    (:class:`~ppl_attention.pyro.sparse.SparseMAP`), under its masks."""
    while not hasattr(fn, "support_size") and not hasattr(fn, "active") and \
            hasattr(fn, "base_dist"):
        fn = fn.base_dist
    if hasattr(fn, "support_size"):
        return fn.support_size
    if hasattr(fn, "active"):
        return fn.active
    raise UserError(f"{type(fn).__name__} has no sparse support to count")


def _unwrap(fn):
    while not hasattr(fn, "support_size") and not hasattr(fn, "active") and \
            hasattr(fn, "base_dist"):
        fn = fn.base_dist
    return fn


@torch.no_grad()
def mean_support(run: Run, batches: list) -> tuple[float, float | None]:
    """The mean size of a sparse family's support: for a deterministic one (sparsemax,
    α-entmax) the positions with weight above 0 per real target token; for a sparse q
    (sparsemax q, SparseMAP) q's support per real token (per sentence for a tree). With it,
    for SparseMAP, the share of those rows whose active-set search stopped before the optimum
    (its slots full; None for the others)."""
    model = run.model
    site = declared(model, "site")
    total, count, stopped = 0.0, 0, None
    for batch in batches:
        batch = batch.to(model_device(model))
        mask = batch.tgt_mask
        if model.family.deterministic:
            with recording() as calls, poutine.block():
                model.model(batch)
            sizes = (_site_call(calls, site).weights > 0).sum(-1).to(torch.float64)
        else:
            with poutine.block():
                tr = poutine.trace(model.guide).get_trace(batch, posterior=guide_posterior(run))
            fn = _unwrap(tr.nodes[site]["fn"])
            sizes = support_sizes(fn).to(torch.float64)
        sizes = sizes.reshape(batch.size, -1)
        keep = torch.ones_like(sizes, dtype=torch.bool) if sizes.shape[1] == 1 else mask
        total += float(sizes[keep].sum())
        count += int(keep.sum())
        if not model.family.deterministic and hasattr(fn, "converged"):
            missed = ~fn.converged.reshape(batch.size, -1)[keep]
            stopped = (stopped or 0) + int(missed.sum())
    return total / max(count, 1), None if stopped is None else stopped / max(count, 1)


def alignment_links(run: Run, batches: list, map_fn=None) -> dict[int, set[tuple[int, int]]]:
    """Corpus index → MAP links {(source i, target j)} over real target tokens (not <eos>).
    ``map_fn(run, batch) -> [B, T]`` gives the MAP positions (default :func:`map_alignments`;
    the NumPyro side passes its own)."""
    return links_from_positions(run, batches, map_fn or map_alignments)


def map_trees_by_index(run: Run, batches: list, map_fn=None) -> dict[int, list[int]]:
    """Corpus index → the MAP heads of its source (:func:`map_trees`, or the NumPyro side's
    ``map_fn``)."""
    map_fn = map_fn or map_trees
    out = {}
    for b in batches:
        for idx, heads in zip(b.index.tolist(), map_fn(run, b)):
            out[idx] = heads
    return out


