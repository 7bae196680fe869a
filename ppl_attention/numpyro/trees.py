"""``DependencyTree`` for the NumPyro mirror: the same distribution, names, arguments and maths as
:mod:`ppl_attention.pyro.trees` (read its docstring for the recursions), in JAX. Eisner's recursion
is
a ``jax.lax.fori_loop`` over span widths on fixed-size charts (one compilation per padded N);
the matrix-tree theorem ``jnp.linalg.slogdet``; marginals, entropy and KL come from
``jax.grad`` of log Z. Value checks (finite scores, trees given to ``log_prob``) run on concrete
arrays only, as a traced array has no values; the non-projective MAP tree (Chu–Liu–Edmonds)
runs on the host, outside ``jax.jit``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import Distribution, constraints
from numpyro.distributions.kl import kl_divergence

from ..core.errors import NonFiniteScores, UserError
from ..core.heads import check_trees, chu_liu_edmonds, enumerate_trees
from ..core.numerics import LOG_ZERO

__all__ = ["DependencyTree", "heads_to_arcs", "arcs_to_heads", "tree_log_likelihood",
           "tree_posterior", "FLOOR"]

FLOOR = LOG_ZERO


def _concrete(*xs) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


def heads_to_arcs(heads, dtype=jnp.float32):
    """``heads [..., N]`` → arc indicators ``[..., N, N]`` (``[h, m]`` = 1 when h heads m)."""
    return jnp.swapaxes(jax.nn.one_hot(heads, heads.shape[-1], dtype=dtype), -1, -2)


def arcs_to_heads(arcs, lengths):
    """Arc indicators ``[..., N, N]`` → heads ``[..., N]`` (padded positions their own index)."""
    N = arcs.shape[-1]
    idx = jnp.arange(N)
    return jnp.where(idx < lengths[..., None], jnp.argmax(arcs, -2), idx)


# --- the semirings of the inside recursion ----------------------------------------------------

@jax.custom_vjp
def _sample_select(x, noise):
    """⊕ = log Σ exp forward; the backward pass sends the incoming indicator to one child drawn
    by Gumbel-max (a top-down sample through the chart)."""
    return jax.nn.logsumexp(x, -1)


def _sample_fwd(x, noise):
    return jax.nn.logsumexp(x, -1), (x, noise)


def _sample_bwd(res, g):
    x, noise = res
    pick = jax.nn.one_hot(jnp.argmax(x + noise, -1), x.shape[-1], dtype=x.dtype)
    return pick * g[..., None], jnp.zeros_like(noise)


_sample_select.defvjp(_sample_fwd, _sample_bwd)


@jax.custom_vjp
def _max_select(x):
    """⊕ = max forward; backward sends the indicator to the best child (Viterbi)."""
    return jnp.max(x, -1)


def _max_fwd(x):
    return jnp.max(x, -1), x


def _max_bwd(x, g):
    return (jax.nn.one_hot(jnp.argmax(x, -1), x.shape[-1], dtype=x.dtype) * g[..., None],)


_max_select.defvjp(_max_fwd, _max_bwd)


def _plus(semiring: str, key=None):
    if semiring == "log":
        return lambda x, i=0: jax.nn.logsumexp(x, -1)
    if semiring == "max":
        return lambda x, i=0: _max_select(x)
    return lambda x, i: _sample_select(x, jax.random.gumbel(jax.random.fold_in(key, i), x.shape,
                                                             x.dtype))


def _eisner_chart(theta, semiring: str, key=None):
    """The complete items of Eisner's recursion over ``theta [..., n, n]`` (torch side:
    :func:`ppl_attention.pyro.trees._eisner_chart`): C← by start, C→ by end and by start, each
    ``[..., n, n(width)]``; one ``fori_loop`` step per width, on whole charts."""
    plus = _plus(semiring, key)
    n = theta.shape[-1]
    s = jnp.arange(n)
    zeros = jnp.zeros(theta.shape, theta.dtype)

    def step(k, charts):
        cl_s, cl_e, cr_s, cr_e, il_e, ir_s = charts
        end = jnp.clip(s + k, 0, n - 1)
        row_ok = (s + k < n)[:, None]

        def split(a, b, b_width, valid):
            bb = b[..., end[:, None], jnp.clip(b_width, 0, n - 1)[None, :]]
            return jnp.where(valid & row_ok, a + bb, FLOOR)

        j = s  # the split index, as many as the positions
        x = plus(split(cr_s, cl_e, k - 1 - j, (j < k)[None, :]), 3 * k)
        il = x + theta[..., end, s]  # arc t → s
        ir = x + theta[..., s, end]  # arc s → t
        il_e = il_e.at[..., :, k].set(jnp.roll(il, k, -1))
        ir_s = ir_s.at[..., :, k].set(ir)
        cl = plus(split(cl_s, il_e, k - j, (j < k)[None, :]), 3 * k + 1)
        cr = plus(split(ir_s, cr_e, k - j, ((j >= 1) & (j <= k))[None, :]), 3 * k + 2)
        return (cl_s.at[..., :, k].set(cl), cl_e.at[..., :, k].set(jnp.roll(cl, k, -1)),
                cr_s.at[..., :, k].set(cr), cr_e.at[..., :, k].set(jnp.roll(cr, k, -1)),
                il_e, ir_s)

    charts = jax.lax.fori_loop(1, n, step, (zeros,) * 6)
    return charts[0], charts[3], charts[2]


def _eisner_log_partition(theta, lengths, single_root: bool, semiring: str = "log", key=None):
    n = theta.shape[-1]
    lead = theta.shape[:-2]
    if not single_root:
        top = jnp.concatenate([jnp.full(lead + (1, 1), FLOOR, theta.dtype),
                               jnp.diagonal(theta, 0, -2, -1)[..., None, :]], -1)
        body = jnp.concatenate([jnp.full(lead + (n, 1), FLOOR, theta.dtype), theta], -1)
        _, _, cr_s = _eisner_chart(jnp.concatenate([top, body], -2), semiring, key)
        return jnp.take_along_axis(cr_s[..., 0, :], lengths[..., None], -1)[..., 0]
    cl_s, cr_e, _ = _eisner_chart(theta, semiring, key)
    left = cl_s[..., 0, :]
    last = jnp.maximum(lengths - 1, 0)
    right_by_width = jnp.take_along_axis(cr_e, last[..., None, None], -2)[..., 0, :]
    m = jnp.arange(n)
    right = jnp.take_along_axis(right_by_width, jnp.maximum(last[..., None] - m, 0), -1)
    terms = left + right + jnp.diagonal(theta, 0, -2, -1)
    terms = jnp.where(m < lengths[..., None], terms, FLOOR)
    plus = _plus(semiring, None if key is None else jax.random.fold_in(key, 1 << 20))
    return plus(terms, 0)


def _matrix_tree_log_partition(theta, lengths, single_root: bool):
    n = theta.shape[-1]
    idx = jnp.arange(n)
    real = idx < lengths[..., None]
    eye = jnp.eye(n, dtype=bool)
    arc_ok = real[..., :, None] & real[..., None, :] & ~eye
    candidates = jnp.where(arc_ok | (eye & real[..., None, :]), theta, FLOOR)
    shift = jax.lax.stop_gradient(jnp.where(real, candidates.max(-2), 0.0))
    A = jnp.where(arc_ok, jnp.exp(theta - shift[..., None, :]), 0.0)
    r = jnp.where(real, jnp.exp(jnp.diagonal(theta, 0, -2, -1) - shift), 0.0)
    cols = A.sum(-2)
    if single_root:
        lap = jnp.eye(n, dtype=theta.dtype) * cols[..., None, :] - A
        lap = jnp.concatenate([r[..., None, :], lap[..., 1:, :]], -2)
    else:
        lap = jnp.eye(n, dtype=theta.dtype) * (cols + r)[..., None, :] - A
    lap = jnp.where(eye & ~real[..., None, :], 1.0, lap)
    return jnp.linalg.slogdet(lap)[1] + shift.sum(-1)


class DependencyTree(Distribution):
    """As :class:`ppl_attention.pyro.trees.DependencyTree`: ``scores [..., N, N]``,
    ``lengths [...]`` (default N), ``projective``, ``single_root``; samples are
    ``heads [..., N]``."""

    arg_constraints: dict = {}
    has_enumerate_support = True
    pytree_data_fields = ("scores", "lengths", "theta", "_real")
    pytree_aux_fields = ("projective", "single_root")

    def __init__(self, scores, lengths=None, *, projective: bool = True, single_root: bool = True,
                 validate_args=None):
        scores = jnp.asarray(scores)
        if scores.ndim < 2 or scores.shape[-1] != scores.shape[-2]:
            raise UserError(f"DependencyTree: scores must be square [..., N, N], got "
                            f"{list(scores.shape)}")
        N = scores.shape[-1]
        batch_shape = scores.shape[:-2]
        if lengths is None:
            lengths = jnp.full(batch_shape, N, jnp.int32)
        lengths = jnp.asarray(lengths)
        if not jnp.issubdtype(lengths.dtype, jnp.integer):
            raise UserError(f"DependencyTree: lengths must be integers, got {lengths.dtype}")
        try:
            lengths = jnp.broadcast_to(lengths, batch_shape)
        except ValueError:
            raise UserError(f"DependencyTree: lengths of shape {list(lengths.shape)} do not "
                            f"broadcast to the batch shape {list(batch_shape)}") from None
        if _concrete(lengths) and lengths.size:  # checked in NumPy (jnp ops trace under jit)
            lens = np.asarray(lengths)
            if lens.min() < 1 or lens.max() > N:
                bad = int(lens[(lens < 1) | (lens > N)].flat[0])
                raise UserError(f"DependencyTree: every length must be in 1 … N = {N}, got {bad}")
        self.projective, self.single_root = bool(projective), bool(single_root)
        self.lengths = lengths
        self._real = jnp.arange(N) < lengths[..., None]
        real_arc = self._real[..., :, None] & self._real[..., None, :]
        if _concrete(scores, lengths):
            lens = np.asarray(lengths)
            real = np.arange(N) < lens[..., None]
            bad = real[..., :, None] & real[..., None, :] & ~np.isfinite(np.asarray(scores))
            if bad.any():
                where = [int(i) for i in np.argwhere(bad)[0]]
                raise NonFiniteScores(f"DependencyTree: scores must be finite at real arcs; "
                                f"{int(bad.sum())} are not (first at index {where}; give padded "
                                f"positions through lengths=)")
        self.scores = scores
        self.theta = jnp.where(real_arc, jnp.maximum(scores, FLOOR), 0.0)
        super().__init__(batch_shape, (N,), validate_args=validate_args)

    @property
    def N(self) -> int:
        return self.event_shape[0]

    @constraints.dependent_property(is_discrete=True, event_dim=1)
    def support(self):
        return constraints.independent(constraints.integer_interval(0, self.N - 1), 1)

    def _partition(self, theta, semiring: str = "log", key=None, lengths=None):
        lengths = self.lengths if lengths is None else lengths
        if self.projective:
            return _eisner_log_partition(theta, lengths, self.single_root, semiring, key)
        return _matrix_tree_log_partition(theta, lengths, self.single_root)

    @property
    def log_partition(self):
        """log Z(θ) ``[...]``."""
        return self._partition(self.theta)

    @property
    def marginals(self):
        """Arc marginals ``[..., N, N]`` = ∂ log Z / ∂θ (differentiable again)."""
        return jax.grad(lambda t: self._partition(t).sum())(self.theta)

    def score(self, heads):
        heads = jnp.asarray(heads)
        shape = jnp.broadcast_shapes(heads.shape[:-1], self.batch_shape)
        theta = jnp.broadcast_to(self.theta, shape + (self.N, self.N))
        arc = jnp.take_along_axis(theta, jnp.broadcast_to(heads, shape + (self.N,))[..., None, :],
                                  -2)[..., 0, :]
        return jnp.where(jnp.broadcast_to(self._real, arc.shape), arc, 0.0).sum(-1)

    def log_prob(self, value):
        if _concrete(value, self.lengths):
            shape = jnp.broadcast_shapes(value.shape[:-1], self.batch_shape)
            check_trees(np.broadcast_to(np.asarray(value), shape + (self.N,)),
                        np.broadcast_to(np.asarray(self.lengths), shape),
                        projective=self.projective, single_root=self.single_root)
        return self.score(value) - self.log_partition

    def entropy(self):
        """H = log Z − Σ μ θ, each column shifted by its largest real score (torch side)."""
        real_arc = self._real[..., :, None] & self._real[..., None, :]
        c = jax.lax.stop_gradient(jnp.where(self._real, jnp.where(real_arc, self.theta,
                                                                  FLOOR).max(-2), 0.0))
        terms = jnp.where(self._real[..., None, :], self.marginals * (self.theta - c[..., None, :]),
                          0.0)
        return (self.log_partition - c.sum(-1)) - terms.sum((-1, -2))

    def argmax(self):
        """The MAP tree ``heads [..., N]``: Eisner's Viterbi (projective, jittable) or
        Chu–Liu–Edmonds (non-projective, on the host)."""
        if self.projective:
            arcs = jax.grad(lambda t: self._partition(t, "max").sum())(self.theta)
            return arcs_to_heads(arcs, self.lengths)
        theta = np.asarray(self.theta, np.float64).reshape(-1, self.N, self.N)
        lens = np.asarray(self.lengths).reshape(-1)
        heads = [chu_liu_edmonds(t, int(L), single_root=self.single_root)
                 for t, L in zip(theta, lens)]
        return jnp.asarray(np.asarray(heads, np.int32).reshape(self.batch_shape + (self.N,)))

    @property
    def mode(self):
        return self.argmax()

    def sample(self, key, sample_shape=()):
        """Exact draws ``heads [*sample_shape, ..., N]``."""
        shape = tuple(sample_shape) + self.batch_shape
        theta = jax.lax.stop_gradient(jnp.broadcast_to(self.theta, shape + (self.N, self.N)))
        lengths = jnp.broadcast_to(self.lengths, shape)
        if self.projective:
            arcs = jax.grad(lambda t: _eisner_log_partition(t, lengths, self.single_root,
                                                            "sample", key).sum())(theta)
            return arcs_to_heads(arcs, lengths)
        return self._sample_sequential(key, theta, lengths)

    def _sample_sequential(self, key, theta, lengths):
        N = self.N
        idx = jnp.arange(N)
        heads = jnp.broadcast_to(idx, theta.shape[:-1])
        real = idx < lengths[..., None]
        for m in range(N):
            grad = jax.grad(lambda t: _matrix_tree_log_partition(t, lengths,
                                                                 self.single_root).sum())
            mu = grad(theta)[..., :, m]
            logits = jnp.log(jnp.maximum(mu, 0.0))
            h = jax.random.categorical(jax.random.fold_in(key, m), logits)
            h = jnp.where(real[..., m], h, m)
            heads = heads.at[..., m].set(h)
            keep = (idx == h[..., None]) | ~real[..., m:m + 1]
            theta = theta.at[..., :, m].set(jnp.where(keep, theta[..., :, m], FLOOR))
        return heads

    def enumerate_support(self, expand: bool = True):
        lens = np.unique(np.asarray(self.lengths))
        if lens.size != 1:
            raise UserError("DependencyTree.enumerate_support needs every row of one length "
                            f"(got lengths {sorted(int(v) for v in lens)})")
        trees = jnp.asarray(enumerate_trees(int(lens[0]), self.N, projective=self.projective,
                                            single_root=self.single_root))
        out = trees.reshape((-1,) + (1,) * len(self.batch_shape) + (self.N,))
        return jnp.broadcast_to(out, (out.shape[0],) + self.batch_shape + (self.N,)) \
            if expand else out


@kl_divergence.register(DependencyTree, DependencyTree)
def kl_dependency_tree(p, q):
    """KL(p ‖ q) = Σ μ^p (θ^p − θ^q) − log Z_p + log Z_q (same kind, same lengths)."""
    if (p.projective, p.single_root, p.N) != (q.projective, q.single_root, q.N):
        raise UserError("KL(DependencyTree ‖ DependencyTree) needs trees of the same kind "
                        f"(projective, single_root, N): {(p.projective, p.single_root, p.N)} "
                        f"vs {(q.projective, q.single_root, q.N)}")
    if _concrete(p.lengths, q.lengths) and not np.array_equal(
            *np.broadcast_arrays(np.asarray(p.lengths), np.asarray(q.lengths))):
        raise UserError("KL(DependencyTree ‖ DependencyTree) needs the same lengths on both sides")
    return (p.marginals * (p.theta - q.theta)).sum((-1, -2)) - p.log_partition + q.log_partition


def tree_posterior(prior: DependencyTree, emission) -> DependencyTree:
    """p(z | x, y) = the tree of θ + φ (:func:`ppl_attention.pyro.trees.tree_posterior`)."""
    return DependencyTree(prior.theta + emission, prior.lengths, projective=prior.projective,
                          single_root=prior.single_root)



def tree_log_likelihood(prior: DependencyTree, emission):
    """log p(y | x) = log Z(θ + φ) − log Z(θ)
    (:func:`ppl_attention.pyro.trees.tree_log_likelihood`)."""
    return tree_posterior(prior, emission).log_partition - prior.log_partition
