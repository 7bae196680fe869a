"""Evaluation: exact NLL/token and perplexity by enumeration for categorical alignments (whatever
method trained them), exact likelihood for soft attention, an IWAE bound for continuous families,
ELBO/token, MAP alignments and AER against gold."""

from __future__ import annotations

import math

import pyro
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceEnum_ELBO, TraceMeanField_ELBO

from ..data.batching import Batch
from ..metrics import aer
from .methods import PLATES, get_method
from .run import Run


def _kind(run: Run) -> str:
    """"soft", "categorical" (also the Markov family: enumerable, exact), or a continuous one."""
    family = run.model.family
    if family.deterministic:  # Soft, SegmentCRF: no latent variable, exact likelihood
        return "soft"
    return "categorical" if family.name == "markov-categorical" else family.name


def token_log_likelihood(run: Run, batch: Batch) -> torch.Tensor:
    """Exact log p(y_t | x, y<t) ``[B, T]`` for soft and categorical models."""
    if _kind(run) == "soft":
        return run.model.soft_token_log_likelihood(batch)
    return run.model.exact_token_log_likelihood(batch)


def _guide_kwargs(run: Run) -> dict:
    m = get_method(run.method)
    return dict(posterior=m.posterior if m.posterior != "none" else "inference")


def log_importance_weights(run: Run, batch: Batch, k: int = 10) -> torch.Tensor:
    """log p(y, z_k | x) − log q(z_k | x, y) for K draws z_k ~ q, per pair ``[K, B]``. For a
    categorical alignment sampled in the guide, each draw is a full alignment."""
    model, gk = run.model, _guide_kwargs(run)
    weights = []
    for _ in range(k):
        g = poutine.trace(model.guide).get_trace(batch, **gk)
        mt = poutine.trace(poutine.replay(model.model, trace=g)).get_trace(batch)
        g.compute_log_prob()
        mt.compute_log_prob()
        lw = sum(site["log_prob"].sum(-1) for site in mt.nodes.values()
                 if site["type"] == "sample" and "log_prob" in site)
        lw = lw - sum(site["log_prob"].sum(-1) for site in g.nodes.values()
                      if site["type"] == "sample" and "log_prob" in site)
        weights.append(lw)
    return torch.stack(weights)


def iwae_log_likelihood(run: Run, batch: Batch, k: int = 10) -> torch.Tensor:
    """log (1/K) Σ_k p(y, z_k | x) / q(z_k | x, y) per pair ``[B]`` (a lower bound on log p)."""
    return log_importance_weights(run, batch, k).logsumexp(0) - math.log(k)


@torch.no_grad()
def nll_per_token(run: Run, batches: list[Batch], iwae_k: int = 10) -> float:
    total, n = 0.0, 0
    for b in batches:
        if _kind(run) in ("soft", "categorical"):
            total -= float(token_log_likelihood(run, b).sum())
        else:
            total -= float(iwae_log_likelihood(run, b, iwae_k).sum())
        n += b.n_tokens
    return total / n


def elbo_per_token(run: Run, batches: list[Batch], samples: int = 5) -> float:
    """The ELBO of the trained (model, guide) pair with KL weight 1: exact (enumerated) for
    categorical guides; a mean of ``samples`` estimates otherwise."""
    m = get_method(run.method)
    model = run.model
    kind = _kind(run)
    if kind == "soft" or m.posterior == "none":
        return -nll_per_token(run, batches)
    if kind == "categorical":
        elbo, reps = TraceEnum_ELBO(max_plate_nesting=PLATES), 1
        gk = dict(posterior=m.posterior, enumerate_z=True)
    else:
        analytic = m.elbo().__class__ is TraceMeanField_ELBO
        elbo = (TraceMeanField_ELBO if analytic else Trace_ELBO)(max_plate_nesting=PLATES)
        reps, gk = samples, dict(posterior=m.posterior)
    total, n = 0.0, 0
    with torch.no_grad():
        for b in batches:
            for _ in range(reps):
                total -= elbo.loss(model.model, lambda bb: model.guide(bb, **gk), b) / reps
            n += b.n_tokens
    return total / n


@torch.no_grad()
def map_alignments(run: Run, batch: Batch) -> torch.Tensor:
    """The alignment of each target token ``[B, T]``: argmax_j p(z_t = j | x, y) (exact) for
    categorical models; the argmax of the attention scores for soft; for continuous families the
    argmax of the guide's scores, which is the argmax of q's mean weights (Dirichlet, Weibull,
    LogNormal: the mean is monotone in the scores; Gaussian context: its soft weights) and the
    most probable vertex of the Concrete. Deterministic, so both backends agree."""
    model = run.model
    kind = _kind(run)
    if kind == "categorical":
        return model.exact_posterior(batch).argmax(-1)
    H = model.encode(batch.src, batch.src_mask)
    if kind == "soft":
        scores = model.decode(H, batch.src_mask, batch.tgt_in)[1]
        return model.family.deterministic_weights(scores, batch.src_mask.unsqueeze(1)).argmax(-1)
    if _guide_kwargs(run)["posterior"] == "prior":
        scores = model.decode(H, batch.src_mask, batch.tgt_in)[1]
    else:
        scores = model.inference_scores(batch, H)
    return scores.masked_fill(~batch.src_mask.unsqueeze(1), -torch.inf).argmax(-1)


def alignment_links(run: Run, batches: list[Batch], map_fn=None
                    ) -> dict[int, set[tuple[int, int]]]:
    """Corpus index → MAP links {(source i, target j)} over real target tokens (not <eos>).
    ``map_fn(run, batch) -> [B, T]`` gives the MAP positions (default :func:`map_alignments`;
    the NumPyro side passes its own)."""
    map_fn = map_fn or map_alignments
    out = {}
    for b in batches:
        a = map_fn(run, b)
        lengths = b.tgt_mask.sum(-1) - 1  # drop <eos>
        for r, idx in enumerate(b.index.tolist()):
            out[idx] = {(int(a[r, j]), j) for j in range(int(lengths[r]))}
    return out


BACKENDS = ("pyro", "numpyro")


def evaluate(run: Run, batches: list[Batch], gold: list | None = None,
             log_likelihood: list[float] | None = None, iwae_k: int = 10,
             with_elbo: bool = True, backend: str = "pyro",
             references: dict | None = None, beam: int = 1, ensemble: list | None = None
             ) -> dict:
    """A report: ``nll_per_token`` (exact where defined, else IWAE-K), ``ppl``, ``exact``,
    ``elbo_per_token``, ``aer`` (with gold), ``floor_nll_per_token`` (with the generator's
    log-likelihoods), ``n_pairs``, ``n_tokens``, ``n_unk``, ``method``, ``backend``.

    ``backend="numpyro"`` computes every number with the NumPyro twin of the run's model
    (:mod:`ppl_attention.numpyro.inference.evaluate`), whichever backend trained it.
    ``references`` (word → pronunciations, G2P) adds ``wer``/``per`` of beam-``beam`` decoding
    (:func:`~ppl_attention.inference.decode.word_error_rates`); ``ensemble`` (more runs on the
    same data) decodes with ``run`` and them together — the other numbers stay ``run``'s."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if backend == "numpyro":
        from ..numpyro.inference import evaluate as ops
    else:
        ops = _PyroOps
    pyro.clear_param_store()
    run.model.eval()
    kind = _kind(run)
    nll = ops.nll_per_token(run, batches, iwae_k)
    n_tokens = sum(b.n_tokens for b in batches)
    report = {
        "method": run.method,
        "nll_per_token": nll,
        "ppl": math.exp(nll),
        "exact": kind in ("soft", "categorical"),
        "n_pairs": sum(b.size for b in batches),
        "n_tokens": n_tokens,
        "n_unk": sum(b.n_unk for b in batches),
        "backend": backend,
    }
    if not report["exact"]:
        report["iwae_k"] = iwae_k
    if with_elbo:
        report["elbo_per_token"] = ops.elbo_per_token(run, batches)
    if gold is not None:
        links = ops.alignment_links(run, batches)
        idx = sorted(links)
        report["aer"] = aer([links[i] for i in idx], [gold[i] for i in idx])
    if log_likelihood is not None:
        report["floor_nll_per_token"] = -sum(log_likelihood) / n_tokens
    if references:
        from .decode import word_error_rates

        report.update(word_error_rates([run, *(ensemble or [])], references, beam))
        links = ops.alignment_links(run, batches)
        report["monotonic_share"] = monotonic_share(links)
    return report


def monotonic_share(links: dict[int, set[tuple[int, int]]]) -> float:
    """Share of pairs whose MAP alignment never moves backwards: source positions
    non-decreasing along the target (the <eos> step excluded)."""
    ok = 0
    for pair_links in links.values():
        src = [i for i, _ in sorted(pair_links, key=lambda ij: ij[1])]
        ok += all(a <= b for a, b in zip(src, src[1:]))
    return ok / max(1, len(links))


class _PyroOps:
    """The Pyro-side functions :func:`evaluate` assembles its report from."""

    nll_per_token = staticmethod(nll_per_token)
    elbo_per_token = staticmethod(elbo_per_token)
    alignment_links = staticmethod(alignment_links)
