"""A semi-Markov CRF over labelled segmentations, in SynJax's convention.

``log_potentials [..., n, m, t, t]``: ``log_potentials[i, j, a, b]`` scores a segment that ends
at position i (inclusive), has length j + 1 and label b, after a segment labelled a that ends at
i − j − 1 (a = 0 for the first segment, which starts at 0). A segmentation of the first L
positions (L = ``lengths``) into segments of length at most m, each with a label, scores the
sum of its segments' potentials; p ∝ exp(score). Parts whose segment would start before 0
(j > i) are never used. An event is the indicator array of the potentials' shape, one 1 per
segment.

The recursion (over any semiring ⊕, ⊗ = +), β(i, b) the ⊕ over segmentations of 0 … i whose
last segment has label b, β(−1, ·) = [0, −∞, …] (the start, label 0):

    β(i, b) = ⊕_{j < m, a} β(i − j − 1, a) + θ_i(j, a, b),    log Z = ⊕_b β(L − 1, b)

It keeps the last m β's: the carry ``[..., m, t]`` holds β(i − 1), …, β(i − m).
"""

from __future__ import annotations

from ..core.errors import UserError
from ..core.numerics import LOG_ZERO
from .structure import Structure


def semi_markov_value(ops, semiring, log_potentials, lengths, key=None):
    """⊕ over every labelled segmentation of its score ``[...]`` (the recursion above)."""
    n, m, t = log_potentials.shape[-4], log_potentials.shape[-3], log_potentials.shape[-1]
    lead = tuple(log_potentials.shape[:-4])
    start = ops.where(ops.arange(t, log_potentials) == 0, 0.0, LOG_ZERO)  # [t]
    history = ops.where(ops.arange(m, log_potentials)[:, None] == 0, start[None, :],
                        LOG_ZERO)  # [m, t]: β(−1), then before the start
    history = ops.lift(semiring, ops.expand(ops.cast_like(history, log_potentials),
                                            lead + (m, t)))
    steps = ops.moveaxis(log_potentials, -4, 0)  # [n, ..., m, t, t]
    positions = ops.arange(n, log_potentials)

    def step(history, x):
        theta, i = x
        terms = history[..., :, :, None] + theta
        terms = terms.reshape(tuple(terms.shape[:-3]) + (m * t, t))
        beta = ops.plus(semiring, terms, -2, ops.fold_in(key, i))  # [..., t]
        shifted = ops.concat([beta[..., None, :], history[..., :-1, :]], -2)
        return ops.where((i < lengths)[..., None, None], shifted, history)

    history = ops.scan(step, history, (steps, positions))
    return ops.plus(semiring, history[..., 0, :], -1, ops.fold_in(key, n))


class SemiMarkov(Structure):
    """The semi-Markov structure (module docstring) for :class:`Structure`'s operations."""

    event_dims = 4
    name = "SemiMarkovCRF"

    @staticmethod
    def check(log_potentials, lengths) -> None:
        shape = tuple(log_potentials.shape)
        if len(shape) < 4 or shape[-1] != shape[-2]:
            raise UserError(f"SemiMarkovCRF: log_potentials must be [..., n, m, t, t] (a segment "
                            f"ending at i, of length j + 1, label b after label a), got shape "
                            f"{shape}")

    @staticmethod
    def size(log_potentials) -> int:
        return log_potentials.shape[-4]

    @staticmethod
    def value(ops, semiring, log_potentials, lengths, key=None):
        return semi_markov_value(ops, semiring, log_potentials, lengths, key)

    @staticmethod
    def all_events(event_shape, length: int):
        """The event of every labelled segmentation of ``length`` (small sizes)."""
        n, m, t = event_shape[0], event_shape[1], event_shape[-1]
        for segments in _segmentations(length, m, t):
            yield segments_to_event(segments, n, m, t)

    @staticmethod
    def invalid_events(events, lengths):
        """Why NumPy ``events [..., n, m, t, t]`` are not labelled segmentations of
        ``lengths [...]`` (None when they all are)."""
        import numpy as np

        if not np.isin(events, (0, 1)).all():
            return "entries must be 0 or 1"
        flat = events.reshape((-1,) + events.shape[-4:])
        for ev, length in zip(flat, np.asarray(lengths).reshape(-1), strict=True):
            parts = sorted((int(i), int(j), int(a), int(b)) for i, j, a, b in np.argwhere(ev))
            position, label = 0, 0
            for i, j, a, b in parts:
                if i - j != position:
                    return (f"segments must tile the positions: one starts at {i - j}, where "
                            f"{position} was expected")
                if a != label:
                    return (f"a segment ending at {i} follows label {a}, but the one before "
                            f"has label {label} (0 for the first)")
                position, label = i + 1, b
            if position != length:
                return (f"the segments cover positions 0 … {position - 1}, not the row's "
                        f"length {length}" + (" (positions past it hold no segment)"
                                              if position > length else ""))
        return None


def _segmentations(length: int, m: int, t: int):
    """Every list of (start, end, label) segments tiling 0 … length − 1, lengths ≤ m."""
    if length == 0:
        yield []
        return
    for size in range(1, min(m, length) + 1):
        for rest in _segmentations(length - size, m, t):
            for label in range(t):
                yield rest + [(length - size, length - 1, label)]


def segments_to_event(segments, n: int, m: int, t: int) -> list:
    """The event (nested lists ``[n][m][t][t]``) of segments ``[(start, end, label), …]`` in
    order from position 0."""
    ev = [[[[0.0] * t for _ in range(t)] for _ in range(m)] for _ in range(n)]
    prev = 0
    for start, end, label in segments:
        ev[end][end - start][prev][label] = 1.0
        prev = label
    return ev


def event_to_segments(event) -> list:
    """The segments ``[(start, end, label), …]`` of one event ``[n, m, t, t]``."""
    import numpy as np

    parts = sorted(map(tuple, np.argwhere(np.asarray(event) > 0.5)))
    return [(int(i - j), int(i), int(b)) for i, j, _a, b in parts]


__all__ = ["SemiMarkov", "semi_markov_value", "segments_to_event", "event_to_segments"]
