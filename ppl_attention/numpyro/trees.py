"""``DependencyTree`` for the NumPyro mirror: the same distribution, names, arguments and maths as
:mod:`ppl_attention.pyro.trees` (read its docstring for the recursions), in JAX. Eisner's
recursion is the structure library's one definition (:mod:`ppl_attention.structures.eisner`: a
``jax.lax.fori_loop`` over span widths on fixed-size charts, one compilation per padded N); the
matrix-tree theorem takes its log-determinant from :func:`log_abs_det`; marginals, entropy and
KL come from ``jax.grad`` of log Z. Value checks (finite scores, trees given to ``log_prob``)
run on concrete arrays only, as a traced array has no values; the non-projective MAP tree
(Chu–Liu–Edmonds) runs on the host, outside ``jax.jit``.
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
from ..structures import jax_ops
from ..structures.eisner import eisner_value
from ..structures.sparsemap import DEFAULT_MAX_ACTIVE
from ..structures.trainable import Trainable
from .sparse import SparseMAP, kl_sparsemap

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


def _eisner_log_partition(theta, lengths, single_root: bool, semiring: str = "log", key=None):
    """The structure library's one Eisner recursion
    (:func:`~ppl_attention.structures.eisner.eisner_value`) on JAX (``key``: the sampling
    semiring's draws)."""
    return eisner_value(jax_ops, semiring, theta, lengths, single_root, key)


@jax.custom_jvp
def log_abs_det(x):
    """log |det x| ``[...]`` of ``x [..., n, n]`` from one LU factorization; its derivative
    d log|det x| = tr(x⁻¹ dx) comes from the same factors (``jnp.linalg.slogdet``'s rule
    factors x a second time to solve), and is linear in dx, so it is differentiable again in
    either mode."""
    lu, _ = jax.scipy.linalg.lu_factor(x)
    return jnp.log(jnp.abs(jnp.diagonal(lu, 0, -2, -1))).sum(-1)


@log_abs_det.defjvp
def _log_abs_det_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    lu, pivots = jax.scipy.linalg.lu_factor(x)
    value = jnp.log(jnp.abs(jnp.diagonal(lu, 0, -2, -1))).sum(-1)
    eye = jnp.broadcast_to(jnp.eye(x.shape[-1], dtype=x.dtype), x.shape)
    inverse = jax.scipy.linalg.lu_solve((lu, pivots), eye)
    return value, jnp.einsum("...ij,...ji->...", dx, inverse)


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
    return log_abs_det(lap) + shift.sum(-1)


class DependencyTree(Trainable, Distribution):
    """As :class:`ppl_attention.pyro.trees.DependencyTree`: ``scores [..., N, N]``,
    ``lengths [...]`` (default N), ``projective``, ``single_root``; samples are
    ``heads [..., N]``; the relaxations and SparseMAP on the arc indicators, as there (the
    non-projective MAP tree runs on the host, so under ``jit`` they take projective trees)."""

    arg_constraints: dict = {}
    has_enumerate_support = True
    has_rsample = False  # a draw is discrete (see ppl_attention.numpyro.crfs)
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

    # --- ways to train through it (structures/trainable.py), on the arc indicators -----------
    ops = jax_ops
    event_dims = 2

    @property
    def log_potentials(self):
        return self.theta

    @property
    def trainable(self) -> DependencyTree:
        return self

    def aux(self) -> tuple:
        return (self.lengths,)

    def marginals_at(self, theta):
        """Arc marginals at arc scores ``theta`` (these lengths and kind; differentiable)."""
        lengths = jnp.broadcast_to(self.lengths, theta.shape[:-2])
        return jax.grad(lambda t: self._partition(t, lengths=lengths).sum())(theta)

    def at(self, theta) -> DependencyTree:
        """The same kind of tree over other arc scores (draws on the left of the batch)."""
        return DependencyTree(theta, jnp.broadcast_to(self.lengths, theta.shape[:-2]),
                              projective=self.projective, single_root=self.single_root)

    def log_z(self):
        return self.log_partition

    def sample_events(self, n: int, key=None):
        """``n`` exact draws as arc indicators ``[n, ..., N, N]`` (padded words: none)."""
        heads = self.sample(key, (n,))
        real = self._real.astype(self.theta.dtype)
        return heads_to_arcs(heads, self.theta.dtype) * real[..., :, None] * real[..., None, :]

    def argmax_at(self, theta, lengths):
        """Arc indicators ``[..., N, N]`` of the MAP tree at ``theta`` with ``lengths``."""
        theta = jax.lax.stop_gradient(theta)
        lengths = jnp.broadcast_to(lengths, theta.shape[:-2])
        if self.projective:
            return jax.grad(lambda t: _eisner_log_partition(t, lengths, self.single_root,
                                                            "max").sum())(theta)
        if not _concrete(theta, lengths):
            raise UserError("DependencyTree: the non-projective MAP tree (Chu–Liu–Edmonds) runs "
                            "on the host, not under jax.jit; the relaxations and SparseMAP of "
                            "a NumPyro program take projective trees (projective=True)")
        tree = DependencyTree(theta, lengths, projective=False, single_root=self.single_root)
        return heads_to_arcs(tree.argmax(), theta.dtype)

    def sparse_values(self, events):
        """SparseMAP's slots (arc indicators) as heads ``[K, ..., N]``."""
        return arcs_to_heads(events, jnp.broadcast_to(self.lengths, events.shape[:-2]))

    def sparsemap(self, max_active: int | None = None, max_iter: int | None = None,
                  statistics=None) -> SparseMAP:
        """SparseMAP's sparse distribution over these trees (heads); ``statistics`` as the
        structures' (:meth:`ppl_attention.structures.distribution.StructuredDistribution.
        sparsemap`)."""
        return SparseMAP(self, max_active or DEFAULT_MAX_ACTIVE, max_iter, statistics=statistics)

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

    def posterior(self, emission) -> DependencyTree:
        """p(z | x, y) for an emission that factors over arcs (:func:`tree_posterior`); the
        same member as the structure library's distributions."""
        return tree_posterior(self, emission)

    def marginal_log_likelihood(self, emission):
        """log p(y | x) = log Z(θ + φ) − log Z(θ) ``[...]`` (:func:`tree_log_likelihood`)."""
        return tree_log_likelihood(self, emission)

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


kl_divergence.register(SparseMAP, DependencyTree)(kl_sparsemap)


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
