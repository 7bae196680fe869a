"""Evaluation of any model meeting the contract, under either backend: NLL/token — exact where
the model has the ``exact-likelihood`` capability, an IWAE-K bound otherwise —, ELBO/token, MAP
alignments and AER against gold, UAS of trees, decoding metrics, the importance-corrected
posterior. Every number comes from the backend's module (:mod:`ppl_attention.common.backends`), so
this orchestration imports neither torch nor JAX itself: a NumPyro model is evaluated without
torch ever loading."""

from __future__ import annotations

import math

from .backends import get_backend
from .contract import capabilities
from .metrics import aer, frame_accuracy, segment_scores

__all__ = ["evaluate", "monotonic_share"]


def evaluate(run, batches: list, gold: list | None = None,
             log_likelihood: list[float] | None = None, iwae_k: int = 10,
             with_elbo: bool = True, backend: str = "pyro",
             references: dict | None = None, beam: int = 1, ensemble: list | None = None,
             gold_trees: list | None = None, decode_pairs: list | None = None,
             importance: dict | None = None, seed: int = 0, segments: bool = False,
             frames: bool = False) -> dict:
    """A report: ``nll_per_token`` (exact where defined, else IWAE-K), ``ppl``, ``exact``,
    ``elbo_per_token``, ``aer`` (with gold, for models with the ``alignment`` capability),
    ``floor_nll_per_token`` (with the generator's log-likelihoods), ``n_pairs``, ``n_tokens``,
    ``n_unk``, ``method``, ``backend``; ``support`` for a sparse family (sparsemax and α-entmax
    weights, a sparsemax q, SparseMAP): the mean number of positions (or structures) with weight
    above 0 per real target token (per sentence for a tree), and for SparseMAP
    ``sparsemap_unconverged``, the share of those rows whose active-set search filled its
    ``max_active`` slots before the optimum (q is then the best over the structures found).

    ``backend="numpyro"`` computes every number with the NumPyro twin of the run's model,
    whichever backend trained it. ``references`` (word → pronunciations, G2P) adds
    ``wer``/``per`` of beam-``beam`` decoding for models with the ``predictive`` capability;
    ``ensemble`` (more runs on the same data) decodes with ``run`` and them together — the other
    numbers stay ``run``'s. ``gold_trees`` (the gold heads of each source, corpus order) adds
    ``uas`` of the MAP trees for a tree family; ``decode_pairs`` (source, target) adds
    ``prefix_accuracy`` — the share of target tokens greedy decoding gets right before its
    first error — and ``sequence_accuracy`` (exact match), for models with ``predictive``.
    ``segments`` (gold whose links are one source segment per target token: the ``phrases``
    task) adds ``segment_precision``, ``segment_recall`` and ``segment_f1`` of the MAP
    links' segments (:func:`~ppl_attention.common.metrics.segment_scores`) — and so does any
    gold for a run whose family ``selects`` (segments, spans), whatever the corpus; ``frames`` (gold
    with one source label per target frame: ``durations``) adds ``frame_accuracy``.
    ``importance`` (``{"samples": K, "threshold": t}``) adds the evaluation by the guide's
    importance-corrected posterior
    (:func:`ppl_attention.common.importance_weights.evaluate_importance`:
    IWAE-K and ELBO of the same draws, k̂ per sentence, the corrected MAP's AER). ``seed``
    seeds every Monte Carlo estimate (the IWAE bound, a sampled ELBO, the importance draws):
    the same seed gives the same figures on every call."""
    ops = get_backend(backend)
    ops.check_run(run)
    ops.prepare(run)  # Pyro: a clear param store, the model in eval mode
    caps = capabilities(run.model)
    nll = ops.nll_per_token(run, batches, iwae_k, seed=seed)
    n_tokens = sum(b.n_tokens for b in batches)
    report = {
        "method": run.method,
        "nll_per_token": nll,
        "ppl": math.exp(nll) if nll < 709 else math.inf,  # e^709 is the largest float
        "exact": "exact-likelihood" in caps,
        "n_pairs": sum(b.size for b in batches),
        "n_tokens": n_tokens,
        "n_unk": sum(getattr(b, "n_unk", 0) for b in batches),
        "backend": backend,
    }
    if not report["exact"]:
        report["iwae_k"] = iwae_k
    if with_elbo:
        report["elbo_per_token"] = ops.elbo_per_token(run, batches, seed=seed)
    if getattr(run.model.family, "sparse", False):
        report["support"], unconverged = ops.mean_support(run, batches)
        if unconverged is not None:  # SparseMAP: rows whose search stopped at max_active
            report["sparsemap_unconverged"] = unconverged
    if gold is not None and "alignment" in caps:
        links = ops.alignment_links(run, batches)
        idx = sorted(links)
        report["aer"] = aer([links[i] for i in idx], [gold[i] for i in idx])
        if segments or getattr(run.model.family, "selects", False):
            report.update(segment_scores([links[i] for i in idx], [gold[i] for i in idx]))
        if frames:
            report["frame_accuracy"] = frame_accuracy([links[i] for i in idx],
                                                      [gold[i] for i in idx])
    if gold_trees is not None and getattr(run.model.family, "tree", False):
        from ..core.heads import attachment_score

        trees = ops.map_trees_by_index(run, batches)
        idx = sorted(trees)
        report["uas"] = attachment_score([trees[i] for i in idx], [gold_trees[i] for i in idx])
    if decode_pairs is not None and "predictive" in caps:
        from .decoding import prefix_accuracy

        report.update(prefix_accuracy(run, decode_pairs, progress=True, backend=backend))
    if importance is not None:
        from .importance_weights import evaluate_importance

        ops.check_importance(run, importance["samples"], max(
            (b.size, b.tgt_out.shape[1], b.src.shape[1]) for b in batches))
        report.update(evaluate_importance(
            lambda b, k, seed: ops.importance_arrays(run, b, k, seed), batches,
            importance["samples"], importance["threshold"], gold,
            tree=getattr(run.model.family, "tree", False), seed=seed))
    if log_likelihood is not None:
        report["floor_nll_per_token"] = -sum(log_likelihood) / n_tokens
    if references and "predictive" in caps:
        from .decoding import word_error_rates

        report.update(word_error_rates([run, *(ensemble or [])], references, beam,
                                       progress=True, backend=backend))
        if "alignment" in caps:
            report["monotonic_share"] = monotonic_share(ops.alignment_links(run, batches))
    return report


def monotonic_share(links: dict[int, set[tuple[int, int]]]) -> float:
    """Share of pairs whose MAP alignment never moves backwards: source positions
    non-decreasing along the target (the <eos> step excluded)."""
    ok = 0
    for pair_links in links.values():
        src = [i for i, _ in sorted(pair_links, key=lambda ij: ij[1])]
        ok += all(a <= b for a, b in zip(src, src[1:]))
    return ok / max(1, len(links))
