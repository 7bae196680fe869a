"""Brute force for the structure tests, independent of the library: every structure enumerated
in NumPy float64, its score summed part by part from the potentials, and from the list of
(event, score) every quantity a structured distribution reports. Shared by the structure tests,
which run it against both backends."""

from __future__ import annotations

import itertools

import numpy as np


def chain_structures(n: int, t: int, length: int):
    """(event [n, t, t], labels) of every label sequence of ``length`` (SynJax's convention:
    event[i, y_{i−1}, y_i] = 1, y_{−1} = 0)."""
    for labels in itertools.product(range(t), repeat=length):
        ev = np.zeros((n, t, t))
        prev = 0
        for i, b in enumerate(labels):
            ev[i, prev, b] = 1.0
            prev = b
        yield ev, labels


def segmentations(length: int, m: int, t: int):
    """Every labelled segmentation of 0 … length − 1 into segments of length ≤ m: lists of
    (start, end, label)."""
    if length == 0:
        return [[]]
    out = []
    for size in range(1, min(m, length) + 1):
        for rest in segmentations(length - size, m, t):
            out += [rest + [(length - size, length - 1, b)] for b in range(t)]
    return out


def semi_markov_structures(n: int, m: int, t: int, length: int):
    """(event [n, m, t, t], segments) of every labelled segmentation (SynJax's convention:
    event[end, size − 1, previous label, label] = 1, the first segment's previous label 0)."""
    for segs in segmentations(length, m, t):
        ev = np.zeros((n, m, t, t))
        prev = 0
        for start, end, label in segs:
            ev[end, end - start, prev, label] = 1.0
            prev = label
        yield ev, segs


def ctc_structures(logp: np.ndarray, labels, t_len: int, blank: int = 0):
    """(event [2L + 1, T], frame labels) of every frame labelling π ∈ V^{t_len} whose collapse
    (repeats merged, then blanks dropped) is ``labels`` — each with its extended-label state
    path, read off π itself; ``logp [T, V]``."""
    T, V = logp.shape
    L = len(labels)
    for pi in itertools.product(range(V), repeat=t_len):
        collapsed = [c for k, c in enumerate(pi) if c != blank and (k == 0 or c != pi[k - 1])]
        if collapsed != list(labels):
            continue
        ev = np.zeros((2 * L + 1, T))
        done, prev = 0, None  # labels emitted so far, the symbol before
        for k, c in enumerate(pi):
            if c != blank and c != prev:
                done += 1  # a new label (a repeat needs a blank in between)
            ev[2 * done if c == blank else 2 * done - 1, k] = 1.0
            prev = c
        yield ev, pi


def bracketings(i: int, j: int):
    """Every binary tree over words i … j as its list of spans."""
    if i == j:
        return [[(i, i)]]
    return [[(i, j)] + left + right for k in range(i, j)
            for left in bracketings(i, k) for right in bracketings(k + 1, j)]


def tree_crf_structures(n: int, labels: int, length: int):
    """(event [n, n, l], labelled spans) of every labelled binary tree over ``length`` words."""
    for spans in bracketings(0, length - 1):
        for chosen in itertools.product(range(labels), repeat=len(spans)):
            ev = np.zeros((n, n, labels))
            for (i, j), c in zip(spans, chosen, strict=True):
                ev[i, j, c] = 1.0
            yield ev, tuple(zip(spans, chosen, strict=True))


#: how many best structures ``top_k`` is checked for (more than some rows have)
TOP_K = 4


def summary(events: np.ndarray, theta: np.ndarray, other: np.ndarray | None = None) -> dict:
    """From ``events [K, *event]`` and potentials: log Z, marginals, entropy, the best event and
    its score, the ``TOP_K`` best events and scores (−inf and zeros past the last structure),
    every event's log-probability, and against ``other`` potentials the cross-entropy and
    KL."""
    axes = tuple(range(1, events.ndim))
    scores = (events * theta).sum(axes)
    log_z = np.logaddexp.reduce(scores)
    logp = scores - log_z
    p = np.exp(logp)
    order = np.argsort(-scores, kind="stable")[:TOP_K]
    top_scores = np.full(TOP_K, -np.inf)
    top_scores[:len(order)] = scores[order]
    top_events = np.zeros((TOP_K,) + events.shape[1:])
    top_events[:len(order)] = events[order]
    out = dict(log_z=log_z, marginals=np.tensordot(p, events, 1), entropy=-(p * logp).sum(),
               best=events[scores.argmax()], best_score=scores.max(), log_p=logp,
               events=events, probs=p, top_scores=top_scores, top_events=top_events)
    if other is not None:
        q_scores = (events * other).sum(axes)
        log_q = q_scores - np.logaddexp.reduce(q_scores)
        out["cross_entropy"] = -(p * log_q).sum()
        out["kl"] = (p * (logp - log_q)).sum()
    return out


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's chi-square p-value of ``counts`` against ``probs``, the cells expected fewer
    than 5 times pooled into one (the test's approximation needs them)."""
    from scipy.stats import chisquare

    expected = probs * counts.sum()
    small = expected < 5
    if small.any():
        counts = np.append(counts[~small], counts[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    return float(chisquare(counts, expected).pvalue)


def dependency_trees(n: int, length: int, projective: bool = True, single_root: bool = True):
    """Every dependency tree of ``length`` words as heads ``[n]`` (``heads[m] = m``: the root's
    child; padded positions their own index), by trying every head assignment: one root child
    when ``single_root``, every word reaching the root, and — ``projective`` — no two arcs
    crossing (the root's arcs included)."""
    out = []
    for heads in itertools.product(range(length), repeat=length):
        roots = [m for m in range(length) if heads[m] == m]
        if not roots or (single_root and len(roots) > 1):
            continue
        ok = True
        for m in range(length):  # follow the heads: a cycle never reaches a root
            seen, h = set(), m
            while heads[h] != h:
                if h in seen:
                    ok = False
                    break
                seen.add(h)
                h = heads[h]
            if not ok:
                break
        if not ok:
            continue
        if projective:
            arcs = [(-1 if heads[m] == m else heads[m], m) for m in range(length)]
            spans = [(min(h, m), max(h, m)) for h, m in arcs]
            if any(a < c < b < d for a, b in spans for c, d in spans):
                continue
        out.append(list(heads) + list(range(length, n)))
    return out


def chain_events(shape, length: int):
    """Every label sequence's event (the potentials' ``shape`` [n, t, t])."""
    n, t, _ = shape
    return [ev for ev, _ in chain_structures(n, t, length)]


def semi_markov_events(shape, length: int):
    """Every labelled segmentation's event (``shape`` [n, m, t, t])."""
    n, m, t, _ = shape
    return [ev for ev, _ in semi_markov_structures(n, m, t, length)]
