"""The JAX table of array operations the structures' recursions are written in (its twin is
:mod:`.torch_ops`; both expose the same names). The loop over positions is ``lax.scan``."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

from ..core import xla_flags  # noqa: F401  (XLA_FLAGS before JAX's backend starts)
from ..core.numerics import LOG_ZERO
from .semirings import LOG, MAX, PROB, SAMPLE, divide, k_of, normalizer_ok, one  # noqa: F401

name = "jax"


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _sample_sum(x, key, dim):
    return logsumexp(x, dim)


def _sample_fwd(x, key, dim):
    return logsumexp(x, dim), (x, key)


def _sample_bwd(dim, res, g):
    x, key = res
    pick = jax.random.categorical(key, x, axis=dim)
    onehot = jax.nn.one_hot(pick, x.shape[dim], dtype=x.dtype, axis=dim)
    return onehot * jnp.expand_dims(g, dim), None


_sample_sum.defvjp(_sample_fwd, _sample_bwd)


def plus(semiring: str, x, dim: int, key=None):
    """⊕ over ``dim`` (``key``: the sampling semiring's draw at this step)."""
    if semiring == LOG:
        return logsumexp(x, dim)
    if semiring == MAX:
        return _max(x, dim)
    if semiring == SAMPLE:
        return _sample_sum(x, key, dim)
    if semiring == PROB:
        return jnp.sum(x, dim)
    k = k_of(semiring)
    if k is None:
        raise ValueError(semiring)
    x = jnp.moveaxis(x, dim % x.ndim, 1)  # [k, d, ...]
    return _top_k_first(x.reshape((-1,) + x.shape[2:]), k)


def plus_of(semiring: str, xs, key=None):
    """⊕ of a few arrays of one shape, elementwise: stacked and reduced (XLA fuses the two; a
    chain of ``logaddexp``, PyTorch's form, measured no faster here)."""
    return plus(semiring, jnp.stack(list(xs), -1), -1, key)


def _top_k_first(x, k: int):
    """The k largest along the first axis, sorted (``lax.top_k`` takes the last)."""
    return jnp.moveaxis(jax.lax.top_k(jnp.moveaxis(x, 0, -1), k)[0], -1, 0)


def times(semiring: str, a, b):
    """⊗ of two semiring values: a + b; k-best: the k best of the k × k pairwise sums."""
    k = k_of(semiring)
    if k is None:
        return a + b
    pairs = a[:, None] + b[None, :]
    return _top_k_first(pairs.reshape((-1,) + pairs.shape[2:]), k)


def lift(semiring: str, x):
    """Scores as semiring values: themselves; k-best: [x, log 0, …] on a leading axis of k."""
    k = k_of(semiring)
    if k is None:
        return x
    return jnp.concatenate([x[None], jnp.full((k - 1,) + x.shape, LOG_ZERO, x.dtype)], 0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _max(x, dim):
    return jnp.max(x, dim)


def _max_fwd(x, dim):
    return jnp.max(x, dim), x


def _max_bwd(dim, x, g):
    # the whole gradient to one maximizing term (JAX's own rule splits it among ties)
    onehot = jax.nn.one_hot(jnp.argmax(x, dim), x.shape[dim], dtype=x.dtype, axis=dim)
    return (onehot * jnp.expand_dims(g, dim),)


_max.defvjp(_max_fwd, _max_bwd)


def where(cond, a, b):
    return jnp.where(cond, a, b)


def arange(n: int, like):
    return jnp.arange(n)


def full_like(x, value):
    return jnp.full_like(x, value)


def stack(xs, dim: int):
    return jnp.stack(xs, dim)


def moveaxis(x, src: int, dst: int):
    return jnp.moveaxis(x, src, dst)


def scan(step, carry, xs):
    """``carry = step(carry, x)`` over the leading axis of ``xs`` (a tuple of arrays) by
    ``lax.scan``; returns the last carry."""
    return jax.lax.scan(lambda c, x: (step(c, x), None), carry, xs)[0]


def scan_collect(step, carry, xs, reverse: bool = False):
    """``carry, y = step(carry, x)`` by ``lax.scan``: the last carry and the stacked ``y``."""
    return jax.lax.scan(step, carry, xs, reverse=reverse)


def band_windows(x, size: int, width: int):
    """``x [..., size + width − 1]`` → ``[..., size, width]`` with ``[j, d] = x[j + width − 1 −
    d]``."""
    return jnp.stack([x[..., width - 1 - d:width - 1 - d + size] for d in range(width)], -1)


def pad_last(x, axis: int, before: int, after: int, value):
    """``x`` padded with ``value`` along ``axis`` (negative)."""
    widths = [(0, 0)] * x.ndim
    widths[axis] = (before, after)
    return jnp.pad(x, widths, constant_values=value)


def take_along_last(x, index):
    """``x [..., V]`` at ``index [..., K]`` → ``[..., K]``, the leading dimensions broadcast."""
    lead = jnp.broadcast_shapes(x.shape[:-1], index.shape[:-1])
    return jnp.take_along_axis(jnp.broadcast_to(x, lead + x.shape[-1:]),
                               jnp.broadcast_to(index, lead + index.shape[-1:]), -1)


def broadcast_to(x, shape):
    return jnp.broadcast_to(x, shape)


def logmatmulexp(a, b):
    """(A ⊗ B)[i, j] = log Σ_k exp(A[i, k] + B[k, j]) by a max-shifted matmul."""
    ma = jnp.max(a, -1, keepdims=True)
    mb = jnp.max(b, -2, keepdims=True)
    prod = jnp.exp(a - ma) @ jnp.exp(b - mb)
    return jnp.log(jnp.maximum(prod, jnp.finfo(prod.dtype).tiny)) + ma + mb


def maxmatmul(a, b):
    """(A ⊙ B)[i, j] = max_k A[i, k] + B[k, j]."""
    return jnp.max(a[..., :, :, None] + b[..., None, :, :], -2)


def associative_scan(op, elems, axis: int):
    return jax.lax.associative_scan(op, elems, axis=axis)


def einsum(spec: str, *xs):
    return jnp.einsum(spec, *xs)


def as_bool(x):
    return jnp.asarray(x).astype(bool)


def on_accelerator(like) -> bool:
    """Whether JAX's default device is an accelerator."""
    return jax.default_backend() in ("gpu", "cuda", "rocm")


def argmax(x, dim: int):
    return jnp.argmax(x, dim)


def clip(x, low, high):
    return jnp.clip(x, low, high)


def maximum(x, value):
    return jnp.maximum(x, value)


def grad(f, x):
    """∂ Σ f(x) / ∂ x (``jax.grad``; differentiable in turn)."""
    return jax.grad(lambda v: f(v).sum())(x)


def any_nan(x) -> bool:
    try:
        return bool(jnp.isnan(x).any() | jnp.isposinf(x).any())
    except jax.errors.ConcretizationTypeError:  # traced under jit: checked where concrete
        return False


def floor_at(x, value: float):
    """max(x, value) elementwise, the gradient passing where x ≥ value."""
    return jnp.where(x < value, value, x)


def expand(x, shape):
    return jnp.broadcast_to(x, shape)


def lengths_of(lengths, batch_shape, n: int, like):
    if lengths is None:
        return jnp.full(batch_shape, n, dtype=jnp.int32)
    try:
        return jnp.broadcast_to(jnp.asarray(lengths).astype(jnp.int32), batch_shape)
    except ValueError:
        return None


def fold_in(key, i):
    return None if key is None else jax.random.fold_in(key, i)


def stop_gradient(x):
    return jax.lax.stop_gradient(x)


def concrete(x):
    """``x`` as a NumPy array, or None where it is traced (under ``jit``)."""
    import numpy as np

    try:
        return np.asarray(x)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return None


def from_numpy(array, like):
    return jnp.asarray(array, dtype=like.dtype)


def concat(xs, dim: int):
    return jnp.concatenate(xs, dim)


def cumsum(x, dim: int):
    return jnp.cumsum(x, dim)


def sort_desc(x):
    """``x`` sorted along its last axis, largest first (differentiable: a permutation)."""
    return -jnp.sort(-x, axis=-1)


def cast_like(x, like):
    return jnp.asarray(x, dtype=like.dtype)


_COMPILED: dict = {}


def compiled(value):
    """A structure's recursion jitted once per function, the operation table and the semiring
    static (a ``lax.scan`` run eagerly would be traced again at every call)."""
    if value not in _COMPILED:
        _COMPILED[value] = jax.jit(value, static_argnums=(0, 1))
    return _COMPILED[value]


def to_index(x):
    return jnp.asarray(x).astype(jnp.int32)


def log_softmax(x, dim: int):
    return jax.nn.log_softmax(x, dim)


def take_last(x, index):
    """``x [..., T, V]`` at ``index [..., S]`` → ``[..., T, S]``."""
    idx = jnp.broadcast_to(index[..., None, :], x.shape[:-1] + index.shape[-1:])
    return jnp.take_along_axis(x, idx, -1)


def from_numpy_int(array, like):
    return jnp.asarray(array, dtype=jnp.int32)


def from_numpy_bool(array, like):
    return jnp.asarray(array, dtype=bool)



def full_last(like, k: int, value):
    """An array of ``like``'s shape but ``k`` in the last dimension, filled with ``value``."""
    return jnp.full((*like.shape[:-1], k), value, dtype=like.dtype)



def diag(x, offset: int):
    """``x [..., n, n]``'s entries (i, i + offset) → ``[..., n − |offset|]``."""
    return jnp.diagonal(x, offset, -2, -1)


def solve(a, b):
    """x with a x = b for square ``a [..., n, n]`` and ``b [..., n]``; where ``a`` is singular
    (its LU solution not finite), the least-squares solution of least norm (the
    pseudo-inverse's)."""
    x = jnp.linalg.solve(a, b[..., None])[..., 0]
    bad = ~jnp.isfinite(x).all(-1)
    return jax.lax.cond(bad.any(), lambda: jnp.where(
        bad[..., None], (jnp.linalg.pinv(a) @ b[..., None])[..., 0], x), lambda: x)


def eps(like) -> float:
    """The machine epsilon of ``like``'s dtype."""
    return float(jnp.finfo(like.dtype).eps)


def while_loop(cond, body, carry):
    """``carry = body(carry)`` while ``cond(carry)`` (``lax.while_loop``: not differentiated
    through — what runs in it is held constant)."""
    return jax.lax.while_loop(cond, body, carry)


def gumbel(key, like):
    """Standard Gumbel noise of ``like``'s shape and dtype, drawn with ``key``."""
    return jax.random.gumbel(key, like.shape, like.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _custom_backward(fwd, bwd, x, *aux):
    return fwd(x, *aux)


def _custom_backward_fwd(fwd, bwd, x, *aux):
    y = fwd(x, *aux)
    return y, (x, y, aux)


def _zero_cotangent(a):
    if jnp.issubdtype(a.dtype, jnp.inexact):
        return jnp.zeros_like(a)
    import numpy as np

    return np.zeros(a.shape, dtype=jax.dtypes.float0)


def _custom_backward_bwd(fwd, bwd, res, g):
    x, y, aux = res
    return (bwd(x, y, g, *aux),) + tuple(_zero_cotangent(a) for a in aux)


_custom_backward.defvjp(_custom_backward_fwd, _custom_backward_bwd)


def custom_backward(fwd, bwd, x, *aux):
    """y = ``fwd(x, *aux)`` whose backward pass is ``bwd(x, y, g, *aux)`` (the gradient in x
    for the incoming gradient g; ``aux``: arrays held constant, passed explicitly — a
    ``custom_vjp`` may not close over traced values)."""
    return _custom_backward(fwd, bwd, x, *aux)


def log(x):
    return jnp.log(x)


def exp(x):
    return jnp.exp(x)


# --- charts over spans (structures.eisner, structures.tree_crf): full size, one fori_loop step
# per width --------------------------------------------------------------------------------------

def chart_new(first):
    """A chart ``[..., n, n(width)]`` whose width-0 column is ``first [..., n]`` (0 elsewhere)."""
    n = first.shape[-1]
    return jnp.zeros(first.shape + (n,), first.dtype).at[..., 0].set(first)


def chart_pairs(a_s, b_e, k, total, a_min: int, b_min: int):
    """For every start s, the split pairs a_s[s, w1] and b_e[s + k, total − w1] over w1 ∈ 0 …
    n − 1 as two stacks ``[..., n, n]``, the first LOG_ZERO outside a_min ≤ w1 ≤ total − b_min
    and where s + k ≥ n."""
    n = a_s.shape[-1]
    s = jnp.arange(n)
    end = jnp.clip(s + k, 0, n - 1)
    other = b_e[..., end[:, None], jnp.clip(total - s, 0, n - 1)[None, :]]
    valid = ((s >= a_min) & (s <= total - b_min))[None, :] & (s + k < n)[:, None]
    return jnp.where(valid, a_s, LOG_ZERO), other


def chart_arc(theta, k, leftward: bool):
    """θ at (s, s + k) for every start s — the arc between s and s + k (t → s or s → t), or a
    span's value —, ``[..., n]``."""
    s = jnp.arange(theta.shape[-1])
    end = jnp.clip(s + k, 0, theta.shape[-1] - 1)
    return theta[..., end, s] if leftward else theta[..., s, end]


def chart_set(chart, col, k, by_end: bool):
    """The chart with width k's items ``col [..., n]`` (by start s) as its column k, indexed by
    start or by end (rolled by k)."""
    return chart.at[..., :, k].set(jnp.roll(col, k, -1) if by_end else col)


def width_loop(step, n: int, charts):
    """``charts = step(k, charts)`` for k = 1 … n − 1 (``lax.fori_loop``)."""
    return jax.lax.fori_loop(1, n, step, charts)
