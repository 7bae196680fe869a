"""A constituency tree CRF over labelled binary trees, in SynJax's convention.

``log_potentials [..., n, n, l]``: ``log_potentials[i, j, c]`` scores the span i … j (inclusive)
with label c. A binary tree over the first L words (L = ``lengths``) has 2L − 1 spans — the L
leaves (i, i), the root (0, L − 1) and every span in between, each split in two — and each span
one label; it scores the sum of its spans' potentials. An event is the indicator array of the
potentials' shape, one 1 per span (0 outside the tree and past the row's length).

The recursion (inside algorithm, over any semiring ⊕, ⊗ = +), β(i, j) the ⊕ over labelled
subtrees spanning i … j:

    β(i, i) = ⊕_c θ(i, i, c),   β(i, j) = ⊕_c θ(i, j, c) + ⊕_{i ≤ k < j} β(i, k) + β(k + 1, j),
    log Z = β(0, L − 1)

It runs width by width on two charts of β, by span start and by span end, one column per width
(the chart operations :mod:`.eisner` uses: PyTorch grows them, JAX runs one ``fori_loop`` step
per width on full-size charts, so that it compiles once per n).
"""

from __future__ import annotations

import numpy as np

from ..core.errors import UserError
from ..core.numerics import LOG_ZERO
from .structure import Structure


def tree_crf_value(ops, semiring, log_potentials, lengths, key=None):
    """⊕ over every labelled binary tree of its score ``[...]`` (the recursion above)."""
    n = log_potentials.shape[-2]
    # ⊕_c θ(i, j, c) of every span at once, [..., n, n]: a span's label is chosen alone
    labelled = ops.plus(semiring, ops.lift(semiring, log_potentials), -1,
                        ops.fold_in(key, 2 * n))

    def width(w, charts):
        starts, ends = charts  # β(i, i + k) by start i, β(j − k, j) by end j; column k
        # the splits k: β(i, i + k) and β(i + k + 1, i + w)
        left, right = ops.chart_pairs(starts, ends, w, w - 1, 0, 0)
        beta = ops.times(semiring, ops.chart_arc(labelled, w, False), ops.plus(
            semiring, ops.times(semiring, left, right), -1, ops.fold_in(key, w)))
        return ops.chart_set(starts, beta, w, False), ops.chart_set(ends, beta, w, True)

    first = ops.chart_arc(labelled, 0, False)
    starts, _ = ops.width_loop(width, n, (ops.chart_new(first), ops.chart_new(first)))
    roots = starts[..., 0, :]  # β(0, w): [..., n]
    widths = ops.arange(n, log_potentials)
    roots = ops.where(widths == (lengths[..., None] - 1), roots, LOG_ZERO)
    return ops.plus(semiring, roots, -1, ops.fold_in(key, 3 * n))


class TreeCRFStructure(Structure):
    """The constituency structure (module docstring) for :class:`Structure`'s operations."""

    event_dims = 3
    name = "TreeCRF"

    @staticmethod
    def check(log_potentials, lengths) -> None:
        shape = tuple(log_potentials.shape)
        if len(shape) < 3 or shape[-2] != shape[-3]:
            raise UserError(f"TreeCRF: log_potentials must be [..., n, n, l] (span i … j with "
                            f"label c), got shape {shape}")

    @staticmethod
    def value(ops, semiring, log_potentials, lengths, key=None):
        return tree_crf_value(ops, semiring, log_potentials, lengths, key)

    @staticmethod
    def all_events(event_shape, length: int):
        """The event of every labelled binary tree over ``length`` words (small sizes)."""
        import itertools

        n, labels = event_shape[0], event_shape[-1]
        for spans in binary_trees(0, length - 1):
            for chosen in itertools.product(range(labels), repeat=len(spans)):
                yield spans_to_event(list(zip(spans, chosen, strict=True)), n, labels)

    @staticmethod
    def invalid_events(events, lengths):
        """Why NumPy ``events [..., n, n, l]`` are not labelled binary trees of ``lengths``."""
        if not np.isin(events, (0, 1)).all():
            return "entries must be 0 or 1"
        flat = events.reshape((-1,) + events.shape[-3:])
        for ev, length in zip(flat, np.asarray(lengths).reshape(-1), strict=True):
            per_span = ev.sum(-1)
            if (per_span > 1).any():
                return "a span holds one label"
            spans = {(int(i), int(j)) for i, j in np.argwhere(per_span > 0)}
            if not _is_tree(spans, 0, int(length) - 1) or len(spans) != 2 * length - 1:
                return (f"the spans must form one binary tree over the row's {int(length)} "
                        f"words (2L − 1 = {2 * int(length) - 1} spans, each split in two)")
        return None


def _is_tree(spans: set, i: int, j: int) -> bool:
    if (i, j) not in spans:
        return False
    if i == j:
        return True
    inside = [k for k in range(i, j) if (i, k) in spans and (k + 1, j) in spans]
    return any(_is_tree(spans, i, k) and _is_tree(spans, k + 1, j) for k in inside)


def binary_trees(i: int, j: int):
    """Every binary bracketing of i … j as a list of spans (small sizes)."""
    if i == j:
        yield [(i, i)]
        return
    for k in range(i, j):
        for left in binary_trees(i, k):
            for right in binary_trees(k + 1, j):
                yield [(i, j)] + left + right


def spans_to_event(spans, n: int, labels: int) -> list:
    """The event (nested lists ``[n][n][l]``) of ``[((i, j), label), …]``."""
    ev = [[[0.0] * labels for _ in range(n)] for _ in range(n)]
    for (i, j), c in spans:
        ev[i][j][c] = 1.0
    return ev


def event_to_spans(event) -> list:
    """``[((i, j), label), …]`` of one event ``[n, n, l]``, sorted."""
    return sorted(((int(i), int(j)), int(c)) for i, j, c in np.argwhere(np.asarray(event) > 0.5))


__all__ = ["TreeCRFStructure", "tree_crf_value", "spans_to_event", "event_to_spans",
           "binary_trees"]
