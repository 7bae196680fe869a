"""Batches for the NumPyro mirror: the torch :class:`~ppl_attention.data.batching.Batch` as jnp
arrays, optionally padded to a few fixed shapes so that ``jax.jit`` compiles once per shape
rather than once per batch (padded rows and positions are masked out everywhere)."""

from __future__ import annotations

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



def to_jax(batch, rows: int | None = None, multiple: int | str = 1) -> JaxBatch:
    """``batch`` (NumPy arrays, or a Pyro model's torch tensors) → :class:`JaxBatch`.
    ``rows``: pad the batch to this many rows (padded rows attend to position 0 and have no
    target tokens); ``multiple``: round S and T up to a multiple of it, or ``"bucket"``: up to
    the next of :data:`BUCKETS` (few shapes, few compilations). Padding changes no number:
    every padded entry is masked."""
    src = _np(batch.src)
    B, S = src.shape
    T = batch.tgt_out.shape[1]
    rows = max(rows or B, B)
    if multiple == "bucket":
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
