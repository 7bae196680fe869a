"""Projective dependency trees: Eisner's first-order inside recursion (Eisner 1996), written once
over a semiring for both backends (``DependencyTree`` on each backend serves it; the
non-projective kind — the matrix-tree theorem, Chu–Liu–Edmonds, its sequential sampler — is the
named exception, written per backend beside it).

``theta [..., n, n]``: ``theta[h, m]`` scores the arc h → m, the diagonal ``theta[m, m]`` the arc
root → m (torch-struct's ``DependencyCRF`` convention); ``lengths [...]``. For a span s..t of
width k the incomplete items (an arc between s and t over the best split) and the complete items
(a head with its finished half-subtrees),

    I→[s,t] = ⊕_{s≤r<t} C→[s,r] ⊗ C←[r+1,t] ⊗ θ_st,     I←[s,t] = … ⊗ θ_ts,
    C←[s,t] = ⊕_{s≤r<t} C←[s,r] ⊗ I←[r,t],             C→[s,t] = ⊕_{s<r≤t} I→[s,r] ⊗ C→[r,t];

with one root child (``single_root``) the value is ⊕_m C←[0,m] ⊗ C→[m,L−1] ⊗ θ_mm; with several,
the same recursion over the sentence with the root prepended, C→[root, L−1]. Under LOG it is
log Z, under MAX the best tree's score, under SAMPLE a draw's (the gradient: the tree's arcs).

Each chart is indexed by span start (``…_s``) or span end (``…_e``) with one column per width.
PyTorch grows them by one column per width (one batched operation per width on exactly the
spans of that width, an autograd graph of O(n) nodes); JAX keeps them at full size ``[..., n,
n]`` and runs one ``fori_loop`` step per width over masked whole charts (one compilation per
padded n). Which items combine, with which arc, is written once here.
"""

from __future__ import annotations

from ..core.numerics import LOG_ZERO


def _chart(ops, semiring, theta, key):
    """The complete items over ``theta [..., n, n]``: C← by start, C→ by end and by start, each
    ``[..., n, n(width)]``. The items of each width come from the charts of the widths below it
    (the recursion of the module docstring); how a chart is stored and the loop over widths are
    the backend's (``ops.chart_*``, ``ops.width_loop``)."""
    n = theta.shape[-1]

    def plus(pairs, i):
        return ops.plus(semiring, ops.times(semiring, *pairs), -1, ops.fold_in(key, i))

    def width(k, charts):
        cl_s, cl_e, cr_s, cr_e, il_e, ir_s = charts
        # C→[s, r] ⊗ C←[r + 1, t]: widths w1 + w2 = k − 1
        x = plus(ops.chart_pairs(cr_s, cl_e, k, k - 1, 0, 0), 3 * k)
        il_e = ops.chart_set(il_e, x + ops.chart_arc(theta, k, True), k, True)  # arc t → s
        ir_s = ops.chart_set(ir_s, x + ops.chart_arc(theta, k, False), k, False)  # arc s → t
        cl = plus(ops.chart_pairs(cl_s, il_e, k, k, 0, 1), 3 * k + 1)  # C←[s, r] ⊗ I←[r, t]
        cr = plus(ops.chart_pairs(ir_s, cr_e, k, k, 1, 0), 3 * k + 2)  # I→[s, r] ⊗ C→[r, t]
        return (ops.chart_set(cl_s, cl, k, False), ops.chart_set(cl_e, cl, k, True),
                ops.chart_set(cr_s, cr, k, False), ops.chart_set(cr_e, cr, k, True), il_e, ir_s)

    charts = ops.width_loop(width, n, (ops.chart_new(theta[..., 0] * 0),) * 6)
    return charts[0], charts[3], charts[2]


def eisner_value(ops, semiring, theta, lengths, single_root: bool, key=None):
    """⊕ over the projective trees of each row of their scores ``[...]`` (module docstring)."""
    n = theta.shape[-1]
    if not single_root:  # the root prepended as word 0, arcs into it impossible
        diag = ops.diag(theta, 0)  # [..., n]
        top = ops.concat([ops.full_last(diag[..., None, :], 1, LOG_ZERO), diag[..., None, :]], -1)
        body = ops.concat([ops.full_last(theta, 1, LOG_ZERO), theta], -1)
        _, _, cr_s = _chart(ops, semiring, ops.concat([top, body], -2), key)
        return ops.take_along_last(cr_s[..., 0, :], ops.to_index(lengths)[..., None])[..., 0]
    cl_s, cr_e, _ = _chart(ops, semiring, theta, key)
    left = cl_s[..., 0, :]  # C←[0, m], m = width
    last = ops.to_index(lengths) - 1
    right_by_width = ops.take_along_last(ops.moveaxis(cr_e, -2, -1), last[..., None, None])[..., 0]
    m = ops.arange(n, theta)
    right = ops.take_along_last(right_by_width, ops.clip(last[..., None] - m, 0, n - 1))
    terms = left + right + ops.diag(theta, 0)  # C←[0, m] ⊗ C→[m, L−1] ⊗ θ_mm
    terms = ops.where(m < lengths[..., None], terms, ops.full_like(terms, LOG_ZERO))
    return ops.plus(semiring, terms, -1, ops.fold_in(key, 3 * n + 3))


__all__ = ["eisner_value"]
