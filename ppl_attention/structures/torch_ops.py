"""The PyTorch table of array operations the structures' recursions are written in (its twin
is :mod:`.jax_ops`; both expose the same names)."""

from __future__ import annotations

import numpy as np
import torch

from ..core.numerics import LOG_ZERO
from .semirings import LOG, MAX, PROB, SAMPLE, divide, k_of, normalizer_ok, one  # noqa: F401

name = "torch"


class _SampleSum(torch.autograd.Function):
    """⊕ of the sampling semiring: logsumexp over ``dim`` forward; backward, the incoming
    gradient routed to one term drawn from softmax over ``dim`` (Gumbel-max)."""

    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim
        ctx.save_for_backward(x)
        return torch.logsumexp(x, dim)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        u = torch.rand_like(x).clamp_(1e-20, 1.0)
        pick = (x - torch.log(-torch.log(u))).argmax(ctx.dim, keepdim=True)
        onehot = torch.zeros_like(x).scatter_(ctx.dim, pick, 1.0)
        return onehot * grad.unsqueeze(ctx.dim), None


def plus(semiring: str, x, dim: int, key=None):
    """⊕ over ``dim`` (``key``: unused — the sampling semiring draws from torch's generator,
    seeded by ``torch.manual_seed`` / ``pyro.set_rng_seed``)."""
    if semiring == LOG:
        return torch.logsumexp(x, dim)
    if semiring == MAX:
        return x.max(dim).values  # its gradient goes to the one maximizing term
    if semiring == SAMPLE:
        return _SampleSum.apply(x, dim)
    if semiring == PROB:
        return x.sum(dim)
    k = k_of(semiring)
    if k is None:
        raise ValueError(semiring)
    x = x.movedim(dim % x.ndim, 1)  # [k, d, ...]
    return x.reshape((-1,) + tuple(x.shape[2:])).topk(k, 0).values


def plus_of(semiring: str, xs, key=None):
    """⊕ of a few arrays of one shape, elementwise (log: a chain of ``logaddexp``, no stack)."""
    if semiring == LOG:
        out = xs[0]
        for x in xs[1:]:
            out = torch.logaddexp(out, x)
        return out
    return plus(semiring, torch.stack(list(xs), -1), -1, key)


def times(semiring: str, a, b):
    """⊗ of two semiring values: a + b; k-best: the k best of the k × k pairwise sums."""
    k = k_of(semiring)
    if k is None:
        return a + b
    pairs = a[:, None] + b[None, :]
    return pairs.reshape((-1,) + tuple(pairs.shape[2:])).topk(k, 0).values


def lift(semiring: str, x):
    """Scores as semiring values: themselves; k-best: [x, log 0, …] on a leading axis of k."""
    k = k_of(semiring)
    if k is None:
        return x
    return torch.cat([x[None], torch.full((k - 1,) + tuple(x.shape), LOG_ZERO, dtype=x.dtype,
                                          device=x.device)], 0)


def where(cond, a, b):
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        a = torch.tensor(a, device=cond.device)
    return torch.where(cond, a, b)


def arange(n: int, like):
    return torch.arange(n, device=like.device)


def full_like(x, value):
    return torch.full_like(x, value)


def stack(xs, dim: int):
    return torch.stack(xs, dim)


def moveaxis(x, src: int, dst: int):
    return torch.movedim(x, src, dst)


def scan(step, carry, xs):
    """``carry = step(carry, x)`` over the leading axis of ``xs`` (a tuple of arrays); returns
    the last carry. A Python loop (PyTorch runs eagerly)."""
    # unbound once: the backward pass stacks the gradients once instead of scattering each
    # step's into a zero buffer of the whole input (quadratic in the length)
    for x in zip(*(x.unbind(0) for x in xs)):
        carry = step(carry, x)
    return carry


def scan_collect(step, carry, xs, reverse: bool = False):
    """``carry, y = step(carry, x)`` over the leading axis of ``xs``; returns the last carry and
    the ``y`` (a tuple of arrays) stacked in the order of ``xs`` (``lax.scan``'s contract, also
    with ``reverse``)."""
    steps = list(zip(*(x.unbind(0) for x in xs)))
    n = len(steps)
    order = range(n - 1, -1, -1) if reverse else range(n)
    ys = [None] * n
    for i in order:
        carry, ys[i] = step(carry, steps[i])
    return carry, tuple(torch.stack(parts, 0) for parts in zip(*ys))


def band_windows(x, size: int, width: int):
    """``x [..., size + width − 1]`` → ``[..., size, width]`` with ``[j, d] = x[j + width − 1 −
    d]`` (a view)."""
    return x.unfold(-1, size, 1).flip(-2).transpose(-1, -2)


def pad_last(x, axis: int, before: int, after: int, value):
    """``x`` padded with ``value`` along ``axis`` (negative)."""
    widths = [0, 0] * (-axis - 1) + [before, after]
    return torch.nn.functional.pad(x, widths, value=value)


def take_last(x, index):
    """``x [..., T, V]`` at ``index [..., S]`` → ``[..., T, S]``."""
    idx = index[..., None, :].expand(*x.shape[:-1], index.shape[-1])
    return torch.gather(x, -1, idx)


def _broadcast_shapes(a: tuple, b: tuple) -> tuple:
    """NumPy's broadcast of two shapes (``torch.broadcast_shapes`` imports several hundred
    modules on its first call)."""
    a, b = (1,) * (len(b) - len(a)) + a, (1,) * (len(a) - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise ValueError(f"shapes {a} and {b} do not broadcast")
        out.append(y if x == 1 else x)
    return tuple(out)


def take_along_last(x, index):
    """``x [..., V]`` at ``index [..., K]`` → ``[..., K]``, the leading dimensions broadcast."""
    lead = _broadcast_shapes(tuple(x.shape[:-1]), tuple(index.shape[:-1]))
    return torch.gather(x.expand(*lead, x.shape[-1]), -1,
                        index.expand(*lead, index.shape[-1]).long())


def broadcast_to(x, shape):
    return x.expand(*shape)


def logmatmulexp(a, b):
    """(A ⊗ B)[i, j] = log Σ_k exp(A[i, k] + B[k, j]) for ``[..., S, S]`` matrices, by a
    max-shifted matmul (memory of the operands, not of S³)."""
    ma = a.max(-1, keepdim=True).values
    mb = b.max(-2, keepdim=True).values
    prod = torch.exp(a - ma) @ torch.exp(b - mb)
    return torch.log(prod.clamp_min(torch.finfo(prod.dtype).tiny)) + ma + mb


def maxmatmul(a, b):
    """(A ⊙ B)[i, j] = max_k A[i, k] + B[k, j] (the max-plus semiring)."""
    return (a.unsqueeze(-1) + b.unsqueeze(-3)).max(-2).values


def associative_scan(op, elems, axis: int):
    """Inclusive prefix scan: out[t] = elems[0] ∘ … ∘ elems[t] along ``axis`` for an associative
    ``op`` — the odd/even recursion of ``jax.lax.associative_scan``, O(log T) levels."""
    elems = elems.movedim(axis, 0)

    def scan_(e):
        n = e.shape[0]
        if n < 2:
            return e
        odd = scan_(op(e[0:-1:2], e[1::2]))
        if n % 2 == 0:
            even = op(odd[:-1], e[2::2])
        else:
            even = op(odd, e[2::2])
        even = torch.cat([e[:1], even], 0)
        out = torch.empty((n, *e.shape[1:]), dtype=e.dtype, device=e.device)
        out[0::2] = even
        out[1::2] = odd
        return out

    return scan_(elems).movedim(0, axis)


def einsum(spec: str, *xs):
    return torch.einsum(spec, *xs)


def as_bool(x):
    return x.bool()


def on_accelerator(like) -> bool:
    """Whether ``like`` lives on an accelerator (a CUDA device)."""
    return like is not None and like.device.type == "cuda"


def argmax(x, dim: int):
    return x.argmax(dim)


def clip(x, low, high):
    return x.clamp(low, high)


def maximum(x, value):
    return x.clamp(min=value)


def grad(f, x):
    """∂ Σ f(x) / ∂ x, differentiable in turn when ``x`` is part of a graph (marginals a loss
    is taken through: structured attention)."""
    with torch.enable_grad():
        if x.requires_grad:
            y = f(x)
            return torch.autograd.grad(y.sum(), x, create_graph=True)[0]
        x = x.detach().requires_grad_(True)
        y = f(x)
        return torch.autograd.grad(y.sum(), x)[0]


def any_nan(x) -> bool:
    """Whether ``x`` holds NaN or +inf: one reduction, its max (NaN propagates through it)."""
    if x.device.type == "meta" or x.numel() == 0:  # no values: checked where there are
        return False
    return not bool(x.detach().amax() < float("inf"))


def floor_at(x, value: float):
    """max(x, value) elementwise, the gradient passing where x ≥ value."""
    return torch.clamp_min(x, value)


def expand(x, shape):
    return x.expand(*shape).contiguous()



def lengths_of(lengths, batch_shape, n: int, like):
    """``lengths`` as an integer tensor of ``batch_shape`` on ``like``'s device (None: n);
    None when their shape does not broadcast to it."""
    if lengths is None:
        return torch.full(batch_shape, n, dtype=torch.long, device=like.device)
    lengths = torch.as_tensor(lengths, device=like.device)
    try:
        return lengths.long().expand(batch_shape)
    except RuntimeError:
        return None


def fold_in(key, i):
    return None


def stop_gradient(x):
    return x.detach()


def concrete(x):
    """``x`` as a NumPy array (None on the meta device, which holds no values — as a traced
    array under JAX)."""
    if x.device.type == "meta":
        return None
    return x.detach().cpu().numpy()


def from_numpy(array, like):
    """A NumPy array as a tensor of ``like``'s dtype and device."""
    return torch.as_tensor(array, dtype=like.dtype, device=like.device)


def concat(xs, dim: int):
    return torch.cat(xs, dim)


def cumsum(x, dim: int):
    return torch.cumsum(x, dim)


def sort_desc(x):
    """``x`` sorted along its last axis, largest first (differentiable: a permutation)."""
    return torch.sort(x, dim=-1, descending=True).values


def cast_like(x, like):
    return torch.as_tensor(x, dtype=like.dtype, device=like.device)


def compiled(value):
    """The recursion as it is (PyTorch runs eagerly)."""
    return value


def to_index(x):
    return torch.as_tensor(x).long() if not isinstance(x, torch.Tensor) else x.long()


def log_softmax(x, dim: int):
    return torch.log_softmax(x, dim)


def from_numpy_int(array, like):
    return torch.as_tensor(np.array(array), dtype=torch.long, device=like.device)


def from_numpy_bool(array, like):
    return torch.as_tensor(np.array(array), dtype=torch.bool, device=like.device)



def full_last(like, k: int, value):
    """An array of ``like``'s shape but ``k`` in the last dimension, filled with ``value``."""
    return torch.full((*like.shape[:-1], k), value, dtype=like.dtype, device=like.device)



def diag(x, offset: int):
    """``x [..., n, n]``'s entries (i, i + offset) → ``[..., n − |offset|]``."""
    return torch.diagonal(x, offset, -2, -1)


def solve(a, b):
    """x with a x = b for square ``a [..., n, n]`` and ``b [..., n]``; where ``a`` is singular,
    the least-squares solution of least norm (the pseudo-inverse's)."""
    x, info = torch.linalg.solve_ex(a, b)
    bad = info != 0
    if not a.is_meta and bool(bad.any()):
        x = torch.where(bad[..., None], (torch.linalg.pinv(a) @ b[..., None])[..., 0], x)
    return x


def eps(like) -> float:
    """The machine epsilon of ``like``'s dtype."""
    return torch.finfo(like.dtype).eps


def while_loop(cond, body, carry):
    """``carry = body(carry)`` while ``cond(carry)`` (a Python loop)."""
    while bool(cond(carry)):
        carry = body(carry)
    return carry


def gumbel(key, like):
    """Standard Gumbel noise of ``like``'s shape, dtype and device (``key``: unused — torch's
    generator, seeded by ``torch.manual_seed`` / ``pyro.set_rng_seed``)."""
    u = torch.rand_like(like).clamp_(torch.finfo(like.dtype).tiny, 1.0)
    return -torch.log(-torch.log(u))


class _CustomBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fwd, bwd, *aux):
        y = fwd(x, *aux)
        ctx.save_for_backward(x, y, *aux)
        ctx.bwd = bwd
        return y

    @staticmethod
    def backward(ctx, g):
        x, y, *aux = ctx.saved_tensors
        return (ctx.bwd(x, y, g, *aux), None, None) + (None,) * len(aux)


def custom_backward(fwd, bwd, x, *aux):
    """y = ``fwd(x, *aux)`` whose backward pass is ``bwd(x, y, g, *aux)`` (the gradient in x
    for the incoming gradient g; ``aux``: arrays held constant)."""
    return _CustomBackward.apply(x, fwd, bwd, *aux)


def log(x):
    return torch.log(x)


def exp(x):
    return torch.exp(x)


# --- charts over spans (structures.eisner, structures.tree_crf): grown one column per width ----

def chart_new(first):
    """A chart whose width-0 column is ``first [..., n]``: ``[..., n, 1]``."""
    return first[..., None]


def chart_pairs(a_s, b_e, k: int, total: int, a_min: int, b_min: int):
    """For the spans of width k (start s, end s + k), the split pairs a_s[s, w1] and b_e[s + k,
    w2] over w1 + w2 = ``total``, w1 ≥ a_min, w2 ≥ b_min, as two stacks ``[..., n − k, total −
    a_min − b_min + 1]`` (the recursion combines them with the semiring's ⊗)."""
    m = a_s.shape[-2] - k
    return (a_s[..., :m, a_min:total - b_min + 1],
            torch.flip(b_e[..., k:, b_min:total - a_min + 1], (-1,)))


def chart_arc(theta, k: int, leftward: bool):
    """θ at (s, s + k) — the arc between s and s + k (t → s with ``leftward``, else s → t), or
    a span's value —, ``[..., n − k]``."""
    return torch.diagonal(theta, -k if leftward else k, -2, -1)


def chart_set(chart, col, k: int, by_end: bool):
    """The chart with width k's items ``col [..., n − k]`` (by start s) as its next column,
    indexed by start or by end."""
    col = torch.nn.functional.pad(col, (k, 0) if by_end else (0, k))
    return torch.cat([chart, col[..., None]], -1)


def width_loop(step, n: int, charts):
    """``charts = step(k, charts)`` for k = 1 … n − 1 (a Python loop)."""
    for k in range(1, n):
        charts = step(k, charts)
    return charts
