"""Sparse normalizers of scores: sparsemax and α-entmax, written once over an operation table
(:mod:`.torch_ops`, :mod:`.jax_ops`) for both backends.

α-entmax (Peters, Niculae & Martins 2019, eq. 7–9) maps scores z ∈ ℝ^S to the simplex,

    α-entmax(z) = argmax_{p ∈ Δ} ⟨p, z⟩ + H_α(p),   H_α(p) = Σ_j (p_j − p_j^α) / (α(α − 1)),

    p_j = [(α − 1) z_j − τ]_+^{1/(α−1)},   τ the one number with Σ_j p_j = 1;

α → 1 is softmax, α = 2 sparsemax (Martins & Astudillo 2016: the Euclidean projection of z on
the simplex, p = [z − τ]_+). For α > 1 the positions with (α − 1) z_j ≤ τ get **exactly 0**.

- :func:`sparsemax` and :func:`entmax15` find τ exactly by sorting (Martins & Astudillo's
  Algorithm 1; Peters et al.'s Algorithm 2): the support is the largest prefix k of the sorted
  scores whose τ_k stays below its k-th score. Automatic differentiation through the sort and
  the prefix sums *is* the exact Jacobian — given the support S, τ is a smooth function of z_S,
  so d p / d z = diag(s) − s sᵀ / Σ_j s_j with s_j = [j ∈ S] (sparsemax) or 2 √p_j (1.5-entmax).
- :func:`entmax_bisect` for any α > 1 (a number, or an array: learnable): τ by bisection on
  Σ_j p_j(τ) − 1 = 0, held constant, then one Newton step τ − g(τ)/g'(τ) whose value is τ again
  but whose derivative is the implicit function theorem's, dτ = −(∂g/∂z dz + ∂g/∂α dα) / (∂g/∂τ):
  the exact Jacobian in z and in α without differentiating through the iterations.

``mask [..., S]`` (bool, True on real positions; None: all): a masked position has probability
exactly 0 and no gradient; a row needs one real position. Every function maps ``z [..., S]`` to
``p [..., S]`` along the last axis.
"""

from __future__ import annotations

import math

from ..core.errors import UserError

__all__ = ["sparsemax", "entmax15", "entmax_bisect", "entmax", "tsallis_alpha_ok"]


def tsallis_alpha_ok(alpha) -> bool:
    """Whether α is a number above 1 (α-entmax's domain)."""
    return isinstance(alpha, int | float) and not isinstance(alpha, bool) and \
        math.isfinite(alpha) and alpha > 1


def _prepare(ops, z, mask):
    """``z`` with masked positions below every real one and at least 1 below the real maximum
    (so they sort last, and every threshold τ ≥ max − 1 leaves them out), the number of real
    positions ``[..., 1]`` and the ranks 1 … S."""
    S = z.shape[-1]
    rank = ops.cast_like(ops.arange(S, z), z) + 1.0
    if mask is None:
        return z, None, ops.full_like(z[..., :1], float(S)), rank
    mask = ops.broadcast_to(ops.as_bool(mask), tuple(z.shape))
    inf = ops.full_like(z, float("inf"))
    zs = ops.stop_gradient(z)
    low = -ops.plus("max", -ops.where(mask, zs, inf), -1)[..., None]  # min over real positions
    high = ops.plus("max", ops.where(mask, zs, -inf), -1)[..., None]
    fill = ops.where(low < high - 1.0, low, high - 1.0) - 1.0
    z = ops.where(mask, z, ops.broadcast_to(fill, tuple(z.shape)))
    n_real = ops.cast_like(mask, z).sum(-1)[..., None]
    return z, mask, n_real, rank


def _finish(ops, p, mask):
    if mask is None:
        return p
    return ops.where(mask, p, ops.full_like(p, 0.0))


def _rounding(ops, z_sorted, rank):
    """How far τ_k may lie from its exact value by rounding ``[..., S]``: k ulps of the largest
    |z| (τ_k sums k scores). A score within it of τ_k is at the support's edge, where the map
    is not differentiable (p = 0 there either way, the Jacobian differs by side)."""
    zs = ops.stop_gradient(z_sorted)  # sorted: the largest |z| is at one end
    big = ops.maximum(ops.maximum(zs[..., :1], -zs[..., -1:]), 1.0)
    return 4.0 * ops.eps(z_sorted) * rank * big


def _support_threshold(ops, tau, z_sorted, rank, n_real):
    """τ and the support's edge: the largest prefix k with z_(k) above τ_k by more than rounding
    (within the real positions); ``(τ [..., 1], edge [..., 1])``, position j in the support iff
    z_j − τ > edge. A score on the edge is left out on either backend and in either precision
    — its p is 0 both ways and τ the same (τ_{k−1} = τ_k when z_(k) = τ_k) —, so both give the
    same one-sided Jacobian there (a tie on the edge, as −λ·|t − i| on a grid makes, would
    otherwise take a side by rounding)."""
    edge = _rounding(ops, z_sorted, rank)
    ok = (tau + edge < z_sorted) & (rank <= n_real)
    k = ops.cast_like(ok, z_sorted).sum(-1)[..., None]
    k = ops.maximum(k, 1.0)
    index = ops.to_index(k) - 1
    return ops.take_along_last(tau, index), ops.take_along_last(edge, index)


def sparsemax(ops, z, mask=None):
    """sparsemax(z) = argmin_{p ∈ Δ} ‖p − z‖² along the last axis ``[..., S]``."""
    z, mask, n_real, rank = _prepare(ops, z, mask)
    zs = ops.sort_desc(z)
    cs = ops.cumsum(zs, -1)
    tau = (cs - 1.0) / rank  # τ_k = (Σ_{j≤k} z_(j) − 1) / k
    tau, edge = _support_threshold(ops, tau, zs, rank, n_real)
    d = z - tau
    return _finish(ops, ops.where(d > edge, d, ops.full_like(d, 0.0)), mask)


def _sqrt_pos(ops, x):
    """√x for x > 0 and 0 elsewhere, with no infinite derivative where x ≤ 0."""
    pos = x > 0
    return ops.where(pos, ops.where(pos, x, ops.full_like(x, 1.0)) ** 0.5, ops.full_like(x, 0.0))


def entmax15(ops, z, mask=None):
    """1.5-entmax along the last axis, by sorting: p = [z/2 − τ]_+², exact."""
    z, mask, n_real, rank = _prepare(ops, z, mask)
    z = z / 2.0
    zs = ops.sort_desc(z)
    mean = ops.cumsum(zs, -1) / rank
    mean_sq = ops.cumsum(zs * zs, -1) / rank
    delta = (1.0 - rank * (mean_sq - mean * mean)) / rank  # τ_k = mean_k − √δ_k solves
    tau = mean - _sqrt_pos(ops, delta)  # Σ_{j≤k} (z_(j) − τ)² = 1
    tau, edge = _support_threshold(ops, tau, zs, rank, n_real)
    d = z - tau
    p = ops.where(d > edge, d, ops.full_like(d, 0.0))
    return _finish(ops, p * p, mask)


def _pow_pos(ops, x, e):
    """x^e for x > 0 and 0 elsewhere (e may be an array), with finite derivatives."""
    pos = x > 0
    return ops.where(pos, ops.where(pos, x, ops.full_like(x, 1.0)) ** e, ops.full_like(x, 0.0))


def entmax_bisect(ops, z, mask=None, alpha=1.5, n_iter: int = 50):
    """α-entmax along the last axis for α > 1 (a number, or an array broadcasting to ``z[...,
    :1]`` — differentiable, so α can be learned): τ by ``n_iter`` bisection steps, then the
    implicit-gradient Newton step of the module docstring."""
    am1 = alpha - 1.0
    e = 1.0 / am1
    x, mask, n_real, _ = _prepare(ops, z * am1, mask)
    xs = ops.stop_gradient(x)
    es = ops.stop_gradient(e) if not isinstance(e, float) else e
    top = ops.plus("max", xs, -1)[..., None]
    lo = top - 1.0  # p_max = 1 there: Σ p ≥ 1
    hi = top - ops.stop_gradient((1.0 / n_real) ** am1)  # every p ≤ 1/n: Σ p ≤ 1

    def total(tau):
        return _pow_pos(ops, xs - tau, es).sum(-1)[..., None] - 1.0

    def step(carry, _):  # Σ p falls as τ grows: the root lies above mid where Σ p ≥ 1 there
        lo_, width = carry
        width = width / 2.0
        mid = lo_ + width
        lo_ = ops.where(total(mid) >= 0, mid, lo_)
        return lo_, width

    lo, width = ops.scan(step, (lo, hi - lo), (ops.arange(n_iter, z),))
    tau = ops.stop_gradient(lo + width / 2.0)
    base = x - tau  # the Newton step: value τ, derivative −g_z / g_τ (and −g_α / g_τ)
    g = _pow_pos(ops, base, e).sum(-1)[..., None] - 1.0
    g_tau = ops.stop_gradient(-(_pow_pos(ops, base, e - 1.0).sum(-1)[..., None]) * e)
    tau = tau - g / g_tau
    p = _pow_pos(ops, x - tau, e)
    p = p / ops.stop_gradient(p.sum(-1)[..., None])  # Σ p = 1 to rounding (τ is converged)
    return _finish(ops, p, mask)


def entmax(ops, z, mask=None, alpha=1.5, n_iter: int = 50):
    """α-entmax with the exact sort-based form where one exists (α = 1.5, α = 2 given as
    numbers) and bisection otherwise."""
    if isinstance(alpha, bool | int | float):
        if not tsallis_alpha_ok(alpha):
            raise UserError(f"entmax: alpha must be a number above 1, got {alpha!r}")
        if alpha == 2:
            return sparsemax(ops, z, mask)
        if alpha == 1.5:
            return entmax15(ops, z, mask)
        alpha = float(alpha)
    return entmax_bisect(ops, z, mask, alpha, n_iter)
