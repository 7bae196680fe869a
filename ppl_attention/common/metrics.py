"""Pure metrics on plain data (no torch, no Pyro): AER, segmentation F1, frame accuracy, WER/PER,
and the
uncertainty metrics of stochastic-attention classifiers.

Uncertainty (Fan et al. 2020, §5):

- ``ece``: expected calibration error, Σ_m |B_m|/n · |acc(B_m) − conf(B_m)| over ``bins``
  equal-width confidence bins of the predictive distribution's top probability (Guo et al. 2017);
- ``pavpu``: patch accuracy vs patch uncertainty (Mukhoti & Gal 2018) as BAM computes it: an
  example is *certain* when a two-sample t-test between the Monte Carlo draws of its top-two
  classes' probabilities rejects equality at level ``threshold`` (p < threshold), and

      PAvPU = (n_accurate-certain + n_inaccurate-uncertain) / n.

Shapes: ``probs`` ``[S, N, C]`` — S posterior draws of the class probabilities of N examples
(S = 1 gives no test: every example counts as certain); ``labels`` ``[N]``.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..core.errors import UserError

Links = set[tuple[int, int]]


def aer(predicted: list[Links], sure: list[Links], possible: list[Links] | None = None) -> float:
    """Alignment error rate (Och & Ney 2003): 1 − (|A∩S| + |A∩P|) / (|A| + |S|), P ⊇ S.

    With no separate possible links (P = S) this is 1 − 2|A∩S| / (|A| + |S|).
    """
    if len(predicted) != len(sure):
        raise UserError(f"{len(predicted)} predicted alignments but {len(sure)} gold ones")
    possible = possible or sure
    a_s = a_p = n_a = n_s = 0
    for a, s, p in zip(predicted, sure, possible):
        a_s += len(a & s)
        a_p += len(a & (p | s))
        n_a += len(a)
        n_s += len(s)
    if n_a + n_s == 0:
        return 0.0
    return 1.0 - (a_s + a_p) / (n_a + n_s)


def alignment_scores(predicted: list[Links], sure: list[Links],
                     possible: list[Links] | None = None) -> dict:
    """AER (:func:`aer`), precision |A∩P| / |A| and recall |A∩S| / |S| of the first
    ``len(sure)`` predicted alignments (the gold of a corpus's first lines)."""
    possible = possible or sure
    predicted = predicted[:len(sure)]
    a_s = sum(len(a & s) for a, s in zip(predicted, sure))
    a_p = sum(len(a & (p | s)) for a, s, p in zip(predicted, sure, possible))
    n_a, n_s = sum(map(len, predicted)), sum(map(len, sure))
    return {"aer": aer(predicted, sure, possible), "precision": a_p / n_a if n_a else 0.0,
            "recall": a_s / n_s if n_s else 0.0}


def _sources_by_target(links: Links) -> dict[int, set[int]]:
    """``{target j: the source positions linked to it}``."""
    out: dict[int, set[int]] = {}
    for i, j in links:
        out.setdefault(j, set()).add(i)
    return out


def link_segments(links: Links) -> set[tuple[int, int, int]]:
    """The segments of an alignment, ``{(target j, first source i, last source i)}``: each
    target token's linked source positions cut into maximal runs of consecutive positions."""
    out = set()
    for j, sources in _sources_by_target(links).items():
        sources = sorted(sources)
        start = prev = sources[0]
        for i in sources[1:] + [None]:
            if i is None or i != prev + 1:
                out.add((j, start, prev))
                start = i
            prev = i
    return out


def segment_scores(predicted: list[Links], gold: list[Links]) -> dict:
    """Segmentation precision, recall and F1 (micro, over every pair): a predicted segment (a
    maximal run of source positions one target token links to, :func:`link_segments`) counts
    when it is exactly a gold one — the same target, the same first and last position."""
    if len(predicted) != len(gold):
        raise UserError(f"{len(predicted)} predicted alignments but {len(gold)} gold ones")
    hit = n_pred = n_gold = 0
    for a, g in zip(predicted, gold):
        pa, pg = link_segments(a), link_segments(g)
        hit += len(pa & pg)
        n_pred += len(pa)
        n_gold += len(pg)
    p = hit / n_pred if n_pred else 0.0
    r = hit / n_gold if n_gold else 0.0
    return {"segment_precision": p, "segment_recall": r,
            "segment_f1": 2 * p * r / (p + r) if p + r else 0.0}


def frame_accuracy(predicted: list[Links], gold: list[Links]) -> float:
    """The share of target tokens (frames) whose predicted links are exactly their gold ones —
    for gold with one source label per frame (the ``durations`` task), the share of frames
    given the right label. Tokens with no gold link are not counted."""
    if len(predicted) != len(gold):
        raise UserError(f"{len(predicted)} predicted alignments but {len(gold)} gold ones")
    right = total = 0
    for a, g in zip(predicted, gold):
        by_target = _sources_by_target(a)
        for j, sources in _sources_by_target(g).items():
            total += 1
            right += by_target.get(j, set()) == sources
    return right / total if total else 0.0


def link_reliability(scores: list[dict], sure: list[Links],
                     possible: list[Links] | None = None, bins: int = 10) -> list[dict]:
    """Are link posteriors calibrated? The links of ``scores`` (``{(i, j): p}`` per pair, as
    ``wordalign --scores`` writes them; NULL entries, i < 0, left out) binned by p into
    ``bins`` equal-width bins: per bin the number of links, their mean posterior and the share
    that is gold (sure or possible) — equal to the mean posterior when the posteriors are
    calibrated. Only the first ``len(sure)`` pairs count (the gold of a corpus's first lines)."""
    possible = possible or sure
    rows = [{"low": b / bins, "high": (b + 1) / bins, "links": 0, "p_sum": 0.0, "gold": 0}
            for b in range(bins)]
    for sc, s, p in zip(scores, sure, possible):
        gold = s | p
        for (i, j), prob in sc.items():
            if i < 0:
                continue
            row = rows[min(int(prob * bins), bins - 1)]
            row["links"] += 1
            row["p_sum"] += prob
            row["gold"] += (i, j) in gold
    return [{"low": r["low"], "high": r["high"], "links": r["links"],
             "mean_posterior": r["p_sum"] / r["links"] if r["links"] else None,
             "gold_share": r["gold"] / r["links"] if r["links"] else None} for r in rows]


def edit_distance(a: list, b: list) -> int:
    """Levenshtein distance between two token sequences (unit costs)."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def wer_per(hypotheses: dict[str, list[str]], references: dict[str, list[list[str]]]
            ) -> tuple[float, float]:
    """Word error rate and phone error rate over the words of ``hypotheses``.

    A word is correct when its hypothesis equals any of its reference pronunciations; PER is
    Σ_w min_r edit(h_w, r) / Σ_w |r*_w| with r*_w the closest reference (ties: the shorter).
    """
    if not hypotheses:
        raise UserError("no hypotheses to score")
    wrong, edits, length = 0, 0, 0
    for word, hyp in hypotheses.items():
        refs = references.get(word)
        if not refs:
            raise UserError(f"no reference pronunciation for {word!r}")
        wrong += hyp not in refs
        d, n = min((edit_distance(hyp, r), len(r)) for r in refs)
        edits += d
        length += n
    return wrong / len(hypotheses), edits / max(1, length)

PAVPU_THRESHOLDS = (0.01, 0.05, 0.1)


def _check(probs, labels):
    probs, labels = np.asarray(probs, float), np.asarray(labels)
    if probs.ndim != 3:
        raise UserError(f"probs must be [draws, examples, classes], got shape {probs.shape}")
    if labels.shape != probs.shape[1:2]:
        raise UserError(f"labels {labels.shape} do not match {probs.shape[1]} examples")
    if labels.size and (labels.min() < 0 or labels.max() >= probs.shape[2]):
        raise UserError(f"labels must lie in [0, {probs.shape[2]}), got {labels.min()}.."
                         f"{labels.max()}")
    return probs, labels


def expected_calibration_error(probs, labels, bins: int = 15) -> float:
    """ECE of the predictive mean over draws (``probs [S, N, C]`` or ``[N, C]``)."""
    probs = np.asarray(probs, float)
    if probs.ndim == 2:
        probs = probs[None]
    probs, labels = _check(probs, labels)
    mean = probs.mean(0)
    conf, pred = mean.max(-1), mean.argmax(-1)
    correct = pred == labels
    edges = np.linspace(0.0, 1.0, bins + 1)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (conf > lo) & (conf <= hi) if lo > 0 else (conf >= lo) & (conf <= hi)
        if inside.any():
            ece += inside.mean() * abs(correct[inside].mean() - conf[inside].mean())
    return float(ece)


def pavpu(probs, labels, threshold: float = 0.05) -> float:
    """PAvPU at t-test level ``threshold`` (module docstring)."""
    from scipy.stats import ttest_ind

    probs, labels = _check(probs, labels)
    mean = probs.mean(0)
    pred = mean.argmax(-1)
    accurate = pred == labels
    if probs.shape[0] < 2:
        certain = np.ones_like(accurate)
    else:
        top2 = np.argsort(mean, -1)[:, -2:]  # [N, 2], second best then best
        n = np.arange(probs.shape[1])
        a, b = probs[:, n, top2[:, 1]], probs[:, n, top2[:, 0]]  # [S, N]
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # identical draws: handled below
            p = ttest_ind(a, b, axis=0).pvalue
        # identical draws (zero variance): equal means are not rejected unless they differ
        p = np.where(np.isnan(p), np.where(a.mean(0) != b.mean(0), 0.0, 1.0), p)
        certain = p < threshold
    good = (accurate & certain) | (~accurate & ~certain)
    return float(good.mean())
