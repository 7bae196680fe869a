"""Attention over segments: each query selects a set of source segments (phrases) through a
semi-Markov CRF, written once for both backends (``ops``: :mod:`.torch_ops` or :mod:`.jax_ops`).

The source x_0 … x_{L−1} is cut into segments of two labels: *selected* (label 1, length 1 …
``max_len``) and *unselected* (label 0, length 1). Two selected segments are never adjacent, so a
segmentation is one-to-one with its **coverage** c ∈ {0, 1}^L (c_k = 1 when position k lies in a
selected segment) whose runs of 1s are at most ``max_len`` long, and, for the query's word
scores e ``[..., L]``,

    p(z | e) ∝ exp( Σ_{selected segments [s, i]} Σ_{k=s}^{i} e_k ) = exp⟨c(z), e⟩.

In :class:`~.semi_markov.SemiMarkov`'s convention (``[i, j, a, b]``: a segment ending at i, of
length j + 1, label b, after label a) the potentials are

    θ[i, j, 0, 1] = Σ_{k=i−j}^{i} e_k,   θ[i, 0, a, 0] = 0,   every other part −∞

(:func:`selection_potentials`). The coverage is linear in the event,

    c_k(z) = Σ_{i, j : i − j ≤ k ≤ i} Σ_a z[i, j, a, 1]                        (:func:`coverage`),

so the coverage of the exact marginals μ = E[z] is E[c(z)] = p(c_k = 1 | e), and a context
Σ_k c_k v_k read through the marginals is the exact expectation of the sampled one — the
semi-Markov counterpart of Kim et al. (2017)'s segmentation attention (weights not normalized:
several positions, a phrase, may be selected together; none may be).
"""

from __future__ import annotations

from ..core.errors import UserError

__all__ = ["selection_potentials", "coverage", "coverage_statistics", "selected_positions",
           "LABELS"]

#: the labels of a selection's segments: 0 unselected (length 1), 1 selected
LABELS = 2


def selection_potentials(ops, scores, max_len: int):
    """The semi-Markov potentials ``[..., L, max_len, 2, 2]`` of the module docstring from the
    query's word scores ``scores [..., L]`` (a row's padding is cut by the structure's
    ``lengths``)."""
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
        raise UserError(f"max_len must be an integer ≥ 1, got {max_len!r}")
    L = scores.shape[-1]
    c = ops.cumsum(scores, -1)  # c[i] = Σ_{k ≤ i} e_k
    sums = []
    for j in range(max_len):  # Σ_{k=i−j}^{i} e_k = c[i] − c[i−j−1]
        before = ops.pad_last(c[..., :max(L - j - 1, 0)], -1, min(j + 1, L), 0, 0.0)
        sums.append(c - before)
    seg = ops.stack(sums, -1)  # [..., L, m]
    i = ops.arange(L, scores)[:, None]
    j = ops.arange(max_len, scores)[None, :]
    neg = ops.full_like(seg, -float("inf"))
    selected = ops.where(j <= i, seg, neg)  # θ[i, j, 0, 1]
    single = ops.where((j == 0) & (i >= 0), ops.full_like(seg, 0.0), neg)  # θ[i, j, a, 0]
    after_unselected = ops.stack([single, selected], -1)  # a = 0: b = 0, 1
    after_selected = ops.stack([single, neg], -1)  # a = 1: b = 0 only
    return ops.stack([after_unselected, after_selected], -2)  # [..., L, m, a, b]


def coverage(ops, events):
    """c_k = 1 when position k lies in a selected segment: ``events [..., L, m, 2, 2]``
    (indicators, or their marginals) → ``[..., L]`` (linear in ``events``)."""
    selected = events[..., :, :, :, 1].sum(-1)  # [..., L, m]: a selected segment ends at i
    L, m = selected.shape[-2], selected.shape[-1]
    total = ops.full_like(selected[..., 0], 0.0)
    for j in range(m):
        ends = selected[..., j]  # the segment [i − j, i] covers k = i − d, d = 0 … j
        for d in range(min(j + 1, L)):
            total = total + ops.pad_last(ends[..., d:], -1, 0, d, 0.0)
    return total


def coverage_statistics(ops):
    """SparseMAP's regularized statistic of a selection (:mod:`.sparsemap`, *Statistics*): the
    coverage, ``events [n, L, m, 2, 2] → [n, L]`` — the potentials score ⟨c(z), e⟩. Its
    quadratic ½‖c(μ)‖² counts the positions selected, where the event's counts segments (which
    favours few, long ones)."""
    return lambda events: coverage(ops, events)


def selected_positions(weights):
    """The positions a selection's coverage ``weights [..., L]`` (0/1, or their marginals) reads:
    bool, c_k > 1/2 (a coverage's exact 0/1; the more probable side of a marginal)."""
    return weights > 0.5
