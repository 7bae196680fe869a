"""Batches for the NumPyro mirror: the torch :class:`~ppl_attention.data.batching.Batch` as jnp
arrays, optionally padded to a few fixed shapes so that ``jax.jit`` compiles once per shape
rather than once per batch (padded rows and positions are masked out everywhere).

A training run pads every batch to a :class:`Shapes` chosen from its data by
:func:`choose_shapes` — one (rows, S, T) by default, a few where lengths vary widely — and
records them; validation and the tools on the run pad to the same shapes, so they reuse its
compiled programs. A batch outside the set is padded to its buckets and said so on stderr."""

from __future__ import annotations

import sys
from collections import Counter
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from ..data.batching import as_numpy as _np


class JaxBatch(NamedTuple):
    src: jnp.ndarray  # [B, S] int32
    src_mask: jnp.ndarray  # [B, S] bool
    tgt_in: jnp.ndarray  # [B, T] int32
    tgt_out: jnp.ndarray  # [B, T] int32
    tgt_mask: jnp.ndarray  # [B, T] bool
    features: jnp.ndarray | None = None  # [B, S, F] float: bags' instances (or None)


#: the lengths a padded dimension takes (then multiples of 256): steps of 2 up to 12, then about
#: 1.25× apart, so padding costs ~7 % of the work on a length-sorted corpus (CMUdict batches:
#: 28 shapes compiled, against 82 distinct length pairs; the √2-spaced buckets it replaced cost
#: ~20 % per dimension, 1.4× on S × T, for 15 shapes)
BUCKETS = (4, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384,
           512)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def bucket(n: int) -> int:
    """The smallest bucket length ≥ ``n``."""
    for b in BUCKETS:
        if n <= b:
            return b
    return _round_up(n, 256)



#: a run's shapes: at most this many (S, T) pairs …
MAX_SHAPES = 4
#: … and fewer while the padded cells (rows × S × T summed over the batches) stay within this
#: factor of the buckets' own
SHAPE_TOLERANCE = 2.0


class Shapes(NamedTuple):
    """The padded shapes a run compiles: ``rows`` per batch and ``lengths``, its (S, T) pairs
    (smallest area first)."""

    rows: int
    lengths: tuple

    def fit(self, S: int, T: int) -> tuple[int, int] | None:
        """The smallest of :attr:`lengths` that holds an S × T batch (None: none does)."""
        for S2, T2 in self.lengths:
            if S <= S2 and T <= T2:
                return S2, T2
        return None

    def record(self) -> dict:
        return {"rows": self.rows, "lengths": [list(x) for x in self.lengths]}

    @classmethod
    def from_record(cls, record) -> Shapes | None:
        """The shapes of a run's record (None where the run recorded none)."""
        if not isinstance(record, dict):
            return None
        return cls(int(record["rows"]), _by_area(tuple(int(a) for a in x)
                                                 for x in record["lengths"]))

    def __str__(self) -> str:
        return ", ".join(f"{self.rows}×{S}×{T}" for S, T in self.lengths)


def _by_area(lengths) -> tuple:
    return tuple(sorted(set(lengths), key=lambda st: (st[0] * st[1], st)))


def choose_shapes(batches, max_shapes: int = MAX_SHAPES,
                  tolerance: float = SHAPE_TOLERANCE) -> Shapes:
    """The shapes to pad ``batches`` to: each batch's (S, T) rounded up to :data:`BUCKETS`,
    then the two shapes whose merge (their elementwise maximum) adds the fewest padded cells
    merged, again and again, down to one shape while the cells stay within ``tolerance`` × the
    buckets' and always down to ``max_shapes``. ``rows``: the largest batch's."""
    if not batches:
        raise ValueError("choose_shapes: no batches")
    rows = max(b.size for b in batches)
    need = Counter((bucket(b.src.shape[1]), bucket(b.tgt_out.shape[1])) for b in batches)

    def cells(shapes):
        set_ = Shapes(rows, _by_area(shapes))
        return sum(n * a * b for st, n in need.items() for a, b in [set_.fit(*st)])

    shapes = _by_area(need)
    base = cells(shapes)
    while len(shapes) > 1:
        best = None
        for i, a in enumerate(shapes):
            for b in shapes[i + 1:]:
                merged = _by_area([x for x in shapes if x not in (a, b)]
                                  + [(max(a[0], b[0]), max(a[1], b[1]))])
                c = cells(merged)
                if best is None or c < best[0]:
                    best = (c, merged)
        if len(shapes) <= max_shapes and best[0] > tolerance * base:
            break
        shapes = best[1]
    return Shapes(rows, shapes)


_ANNOUNCED: set = set()


def to_jax(batch, rows: int | None = None, multiple: int | str | Shapes = 1) -> JaxBatch:
    """``batch`` (NumPy arrays, or a Pyro model's torch tensors) → :class:`JaxBatch`.
    ``rows``: pad the batch to this many rows (padded rows attend to position 0 and have no
    target tokens); ``multiple``: round S and T up to a multiple of it, ``"bucket"``: up to
    the next of :data:`BUCKETS` (few shapes, few compilations), or a run's :class:`Shapes`:
    to the smallest of its (S, T) that holds the batch (its buckets, said on stderr once, where
    none does). Padding changes no number: every padded entry is masked."""
    src = _np(batch.src)
    B, S = src.shape
    T = batch.tgt_out.shape[1]
    rows = max(rows or B, B)
    if isinstance(multiple, Shapes):
        fitted = multiple.fit(S, T)
        if fitted is None:
            S2, T2 = bucket(S), bucket(T)
            if (multiple, S2, T2) not in _ANNOUNCED:
                _ANNOUNCED.add((multiple, S2, T2))
                print(f"[numpyro] a batch of S = {S}, T = {T} is outside the run's compiled "
                      f"shapes ({multiple}): padded to {S2} × {T2}, one more compilation",
                      file=sys.stderr)
        else:
            S2, T2 = fitted
    elif multiple == "bucket":
        S2, T2 = bucket(S), bucket(T)
    else:
        S2, T2 = _round_up(S, multiple), _round_up(T, multiple)

    def pad(a, width, fill):
        out = np.full((rows, width), fill, dtype=a.dtype)
        out[: a.shape[0], : a.shape[1]] = a
        return out

    src_mask = pad(_np(batch.src_mask), S2, False)
    src_mask[B:, 0] = True  # a padded row still needs one position to attend to
    features = getattr(batch, "features", None)
    if features is not None:
        f = _np(features)
        padded = np.zeros((rows, S2, f.shape[-1]), f.dtype)
        padded[: f.shape[0], : f.shape[1]] = f
        features = jnp.asarray(padded)
    return JaxBatch(
        jnp.asarray(pad(src, S2, 0), jnp.int32), jnp.asarray(src_mask),
        jnp.asarray(pad(_np(batch.tgt_in), T2, 0), jnp.int32),
        jnp.asarray(pad(_np(batch.tgt_out), T2, 0), jnp.int32),
        jnp.asarray(pad(_np(batch.tgt_mask), T2, False)), features)
