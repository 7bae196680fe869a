"""``MonotonicAlignment`` for the NumPyro mirror: the same chain, names and maths as
:mod:`ppl_attention.pyro.structured` (read its docstring), in JAX — the sequential path a
``jax.lax.scan`` over banded steps, the parallel path ``jax.lax.associative_scan`` over dense
log-semiring matrices."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..core.chain_paths import choose_path
from ..core.errors import UserError
from ..core.numerics import LOG_ZERO
from .trees import DependencyTree

__all__ = ["MonotonicAlignment", "DependencyTree", "FLOOR", "logmatmulexp", "maxmatmul"]

FLOOR = LOG_ZERO


def logmatmulexp(a, b):
    """(A ⊗ B)[i, j] = log Σ_k exp(A[i, k] + B[k, j]) by a max-shifted matmul."""
    ma = jnp.max(a, -1, keepdims=True)
    mb = jnp.max(b, -2, keepdims=True)
    prod = jnp.exp(a - ma) @ jnp.exp(b - mb)
    return jnp.log(jnp.maximum(prod, jnp.finfo(prod.dtype).tiny)) + ma + mb


def maxmatmul(a, b):
    """(A ⊙ B)[i, j] = max_k A[i, k] + B[k, j]."""
    return jnp.max(a[..., :, :, None] + b[..., None, :, :], -2)


def _band_to_dense(trans, max_back: int):
    *lead, S, W = trans.shape
    i = jnp.arange(S)[:, None]
    j = i + jnp.arange(W) - max_back  # [S, W]
    onehot = (j[..., None] == jnp.arange(S)).astype(trans.dtype)  # [S, W, S]
    dense = jnp.where(onehot.sum(-2) > 0, jnp.einsum("...sw,swt->...st", trans, onehot), FLOOR)
    return dense


class MonotonicAlignment:
    """As :class:`ppl_attention.pyro.structured.MonotonicAlignment`: ``init [B, S]``,
    ``trans [B, T, S, W]``, ``emissions [B, T, S]``, ``mask [B, T]``."""

    def __init__(self, init, trans, emissions, mask, max_back: int = 0, method: str = "auto"):
        if method not in ("auto", "sequential", "parallel"):
            raise UserError(f"method must be auto, sequential or parallel; got {method!r}")
        B, T, S = emissions.shape
        self.init, self.trans = jnp.maximum(init, FLOOR), jnp.maximum(trans, FLOOR)
        self.emissions, self.mask = jnp.maximum(emissions, FLOOR), mask.astype(bool)
        self.max_back, self.W = max_back, trans.shape[-1]
        self.method = self.choose(T, S) if method == "auto" else method

    @staticmethod
    def choose(T: int, S: int) -> str:
        """The path expected to be faster on the default JAX device."""
        return choose_path(T, S, accelerator=jax.default_backend() in ("gpu", "cuda", "rocm"))

    @property
    def shape(self):
        return self.emissions.shape

    def _candidates(self, alpha, trans_t):
        """``[B, S(j), W]``: α_{t−1}[i] + trans[t, i, d] with i = j − d + m."""
        S = alpha.shape[-1]
        m, W = self.max_back, self.W
        padded = jnp.pad(alpha, ((0, 0), (W - 1 - m, m)), constant_values=FLOOR)
        tr = jnp.pad(trans_t, ((0, 0), (W - 1 - m, m), (0, 0)), constant_values=FLOOR)
        cands = [padded[:, W - 1 - d:W - 1 - d + S] + tr[:, W - 1 - d:W - 1 - d + S, d]
                 for d in range(W)]
        return jnp.stack(cands, -1)

    def _forward_sequential(self):
        joint = self.init + self.emissions[:, 0]
        ll0 = jax.nn.logsumexp(joint, -1)
        alpha0 = joint - ll0[:, None]

        def step(alpha, xs):
            trans_t, emis_t, keep = xs
            joint = jax.nn.logsumexp(self._candidates(alpha, trans_t), -1) + emis_t
            ll = jax.nn.logsumexp(joint, -1)
            alpha = jnp.where(keep[:, None], joint - ll[:, None], alpha)
            return alpha, (alpha, jnp.where(keep, ll, 0.0))

        xs = (jnp.swapaxes(self.trans[:, 1:], 0, 1), jnp.swapaxes(self.emissions[:, 1:], 0, 1),
              jnp.swapaxes(self.mask[:, 1:], 0, 1))
        _, (fs, lls) = jax.lax.scan(step, alpha0, xs)
        filters = jnp.concatenate([alpha0[:, None], jnp.swapaxes(fs, 0, 1)], 1)
        ll0 = jnp.where(self.mask[:, 0], ll0, 0.0)  # a padded row (NumPyro's padded pairs): 0
        ll = jnp.concatenate([ll0[:, None], jnp.swapaxes(lls, 0, 1)], 1)
        return filters, ll

    def _elements(self):
        B, T, S = self.shape
        dense = _band_to_dense(self.trans, self.max_back) + self.emissions[:, :, None, :]
        first = jnp.broadcast_to((self.init + self.emissions[:, 0])[:, None, :], (B, S, S))
        eye = jnp.where(jnp.eye(S, dtype=bool), 0.0, FLOOR).astype(dense.dtype)
        dense = jnp.where(self.mask[:, :, None, None], dense, eye)
        return jnp.concatenate([first[:, None], dense[:, 1:]], 1)

    def _forward_parallel(self):
        prefix = jax.lax.associative_scan(logmatmulexp, self._elements(), axis=1)[:, :, 0]
        log_z = jax.nn.logsumexp(prefix, -1)
        ll = jnp.concatenate([log_z[:, :1], log_z[:, 1:] - log_z[:, :-1]], 1)
        return prefix - log_z[..., None], jnp.where(self.mask, ll, 0.0)

    def forward(self):
        if self.method == "parallel":
            return self._forward_parallel()
        return self._forward_sequential()

    def token_log_likelihood(self):
        return self.forward()[1]

    def log_partition(self):
        return self.token_log_likelihood().sum(-1)

    def marginals(self):
        def log_z(emis):
            return MonotonicAlignment(self.init, self.trans, emis, self.mask, self.max_back,
                                      self.method).log_partition().sum()

        return jnp.where(self.mask[..., None], jax.grad(log_z)(self.emissions), 0.0)

    def score(self, z):
        """log p(z, y | x) of paths ``z [B, T]``, ``[B]``."""
        em = jnp.take_along_axis(self.emissions, z[..., None], -1)[..., 0]
        start = jnp.take_along_axis(self.init, z[:, :1], -1)[:, 0]
        d = z[:, 1:] - z[:, :-1] + self.max_back
        ok = (d >= 0) & (d < self.W)
        rows = jnp.take_along_axis(self.trans[:, 1:], z[:, :-1, None, None], -2)[..., 0, :]
        tr = jnp.take_along_axis(rows, jnp.clip(d, 0, self.W - 1)[..., None], -1)[..., 0]
        tr = jnp.where(ok, tr, FLOOR)
        steps = jnp.where(self.mask[:, 1:], tr + em[:, 1:], 0.0)
        return start + em[:, 0] + steps.sum(-1)

    def log_prob(self, z):
        return self.score(z) - self.log_partition()

    def viterbi(self):
        if self.method == "parallel":
            def best(emis):
                m = MonotonicAlignment(self.init, self.trans, emis, self.mask, self.max_back,
                                       "parallel")
                return jnp.max(jax.lax.associative_scan(maxmatmul, m._elements(), axis=1)
                               [:, -1, 0], -1).sum()

            return jnp.where(self.mask, jnp.argmax(jax.grad(best)(self.emissions), -1), 0)
        B, T, S = self.shape
        m = self.max_back
        j = jnp.arange(S)
        score0 = self.init + self.emissions[:, 0]

        def step(score, xs):
            trans_t, emis_t, keep = xs
            cands = self._candidates(score, trans_t)
            new = jnp.max(cands, -1) + emis_t
            prev = jnp.clip(j - jnp.argmax(cands, -1) + m, 0, S - 1)
            back = jnp.where(keep[:, None], prev, j)
            return jnp.where(keep[:, None], new, score), back

        xs = (jnp.swapaxes(self.trans[:, 1:], 0, 1), jnp.swapaxes(self.emissions[:, 1:], 0, 1),
              jnp.swapaxes(self.mask[:, 1:], 0, 1))
        final, backs = jax.lax.scan(step, score0, xs)  # backs [T−1, B, S]
        last = jnp.argmax(final, -1)

        def back(zt, bt):
            prev = jnp.take_along_axis(bt, zt[:, None], -1)[:, 0]
            return prev, prev

        _, path = jax.lax.scan(back, last, backs, reverse=True)  # path[t] = z_t, t < T−1
        z = jnp.concatenate([jnp.swapaxes(path, 0, 1), last[:, None]], 1)
        return jnp.where(self.mask, z, 0)

    def sample(self, key, num_samples: int = 1):
        """Exact draws z ~ p(z | x, y) by forward filtering, backward sampling ``[K, B, T]``."""
        filters, _ = self.forward()
        B, T, S = self.shape
        K, m, W = num_samples, self.max_back, self.W
        lengths = self.mask.sum(-1)
        i = jnp.arange(S)
        keys = jax.random.split(key, T)
        last = jax.random.categorical(keys[-1], jnp.broadcast_to(filters[:, -1], (K, B, S)))
        z_last = jnp.where((T - 1 < lengths)[None], last, 0)

        def step(z_next, xs):
            t, f_t, trans_next, k = xs
            d = z_next[..., None] - i + m
            ok = (d >= 0) & (d < W)
            tr = jnp.take_along_axis(jnp.broadcast_to(trans_next, (K, B, S, W)),
                                     jnp.clip(d, 0, W - 1)[..., None], -1)[..., 0]
            inner = (t + 1 < lengths)[None, :, None]
            logits = jnp.where(inner, f_t + jnp.where(ok, tr, FLOOR), f_t)
            z_t = jax.random.categorical(k, jnp.broadcast_to(logits, (K, B, S)))
            z_t = jnp.where((t < lengths)[None], z_t, 0)
            return z_t, z_t

        ts = jnp.arange(T - 1)
        xs = (ts, jnp.swapaxes(filters[:, :-1], 0, 1), jnp.swapaxes(self.trans[:, 1:], 0, 1),
              keys[:-1])
        _, zs = jax.lax.scan(step, z_last, xs, reverse=True)  # [T−1, K, B]
        return jnp.concatenate([jnp.moveaxis(zs, 0, -1), z_last[..., None]], -1)
