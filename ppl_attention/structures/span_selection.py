"""Attention over spans: each query reads constituents of a latent binary tree over the source
through a constituency CRF (:class:`~.tree_crf.TreeCRFStructure`), written once for both
backends (``ops``: :mod:`.torch_ops` or :mod:`.jax_ops`).

The latent z is a binary tree over the source x_0 … x_{L−1} (its 2L − 1 spans, the leaves and
the root included) whose every span carries one of two labels: *read* (1) or *not read* (0). A
read span [i, j] is read as the average of its words, so the query's weights are

    w_k(z) = Σ_{read spans [i, j] ∋ k} 1 / (j − i + 1)                    (:func:`span_weights`)

— several nested constituents may be read; a word inside a read phrase and read itself counts
twice; nothing read reads nothing (not normalized, as the segment selection) —, and, for the
query's word scores e ``[..., L]``,

    p(z | e) ∝ exp⟨w(z), e⟩ = exp Σ_{read spans} mean(e_i … e_j).

In the constituency CRF's convention (``[i, j, c]``: span i … j inclusive, label c) the
potentials are

    θ[i, j, 1] = (1 / (j − i + 1)) Σ_{k=i}^{j} e_k,   θ[i, j, 0] = 0               (j ≥ i)

(:func:`span_potentials`; the parts with j < i are never a span and are set to 0). The weights
are linear in the event, so the weights of the exact marginals μ = E[z] are E[w(z)], and a
context Σ_k w_k v_k read through the marginals is the exact expectation of the sampled one: the
constituency counterpart of the segment selection (:mod:`.segment_selection`). The tree's
bracketing is latent too: p(span [i, j] read) sums over every tree containing it.
"""

from __future__ import annotations

__all__ = ["span_potentials", "span_weights", "span_parts", "span_part_mask", "read_positions",
           "LABELS"]

#: the labels of a span: 0 not read, 1 read
LABELS = 2


def _widths(ops, n: int, like):
    """``(upper [n, n] bool: j ≥ i, widths [n, n]: j − i + 1, and 1 where j < i)`` on
    ``like``'s device and in its dtype (no division by 0 below the diagonal, whose gradient
    would be NaN)."""
    i = ops.arange(n, like)[:, None]
    j = ops.arange(n, like)[None, :]
    upper = j >= i
    return upper, ops.cast_like(ops.where(upper, j - i + 1, 1 + 0 * i), like)


def span_potentials(ops, scores):
    """The constituency potentials ``[..., L, L, 2]`` of the module docstring from the query's
    word scores ``scores [..., L]`` (a row's padding is cut by the structure's ``lengths``)."""
    L = scores.shape[-1]
    c = ops.cumsum(scores, -1)  # c[k] = Σ_{k' ≤ k} e_k'
    sums = c[..., None, :] - (c - scores)[..., :, None]  # [i, j] = c[j] − c[i − 1]
    upper, widths = _widths(ops, L, scores)
    read = ops.where(upper, sums / widths, ops.full_like(sums, 0.0))
    return ops.stack([ops.full_like(read, 0.0), read], -1)


def span_parts(events):
    """The read-span indicators ``[..., L, L]`` of events ``[..., L, L, 2]`` (or the
    probability that each span is read, for marginals): the parts a selection is calibrated
    on."""
    return events[..., 1]


def span_part_mask(ops, mask):
    """The spans [i, j] (i ≤ j) within a source ``mask [..., L]`` (a prefix of each row):
    ``[..., L, L]`` bool, the parts of :func:`span_parts` that exist."""
    L = mask.shape[-1]
    upper = ops.arange(L, mask)[None, :] >= ops.arange(L, mask)[:, None]
    return mask[..., :, None] & mask[..., None, :] & upper


def span_weights(ops, events):
    """w_k = Σ_{read [i, j] ∋ k} 1/(j − i + 1): ``events [..., L, L, 2]`` (indicators, or their
    marginals) → ``[..., L]`` (linear in ``events``)."""
    read = span_parts(events)
    L = read.shape[-1]
    upper, widths = _widths(ops, L, read)
    per_word = ops.where(upper, read / widths, ops.full_like(read, 0.0))
    k = ops.arange(L, read)[None, :]
    starts_before = ops.cast_like(ops.arange(L, read)[:, None] <= k, read)  # [i, k]: i ≤ k
    ends_after = ops.cast_like(ops.arange(L, read)[:, None] >= k, read)  # [j, k]: j ≥ k
    return ops.einsum("...ij,ik,jk->...k", per_word, starts_before, ends_after)


def read_positions(weights):
    """The positions a labelled tree's weights ``[..., L]`` read: bool, w_k > 0 (every position
    some read span covers; an uncovered position's weight is exactly 0)."""
    return weights > 0
