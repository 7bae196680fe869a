"""The monotonic (hard, HMM) alignment chain of the Markov family, written once for both
backends: exact inference over alignment paths, marginalized inside one distribution as Pyro's
``DiscreteHMM`` does, instead of by T sequential enumerated sites.

The chain z_0 … z_{T−1} ∈ {0 … S−1} of each row b has

    p(z_0 = j)                       = exp(init[b, j]),
    p(z_t = i + d − m | z_{t−1} = i) = exp(trans[b, t, i, d]),   d ∈ {0 … W−1}
                                       (banded: jumps −m … W−1−m, m = max_back),
    and evidence log p(y_t | z_t = j, ·) = emissions[b, t, j];

steps with ``mask[b, t] = False`` (padded targets, a suffix of each row) are skipped. With
M_t[i, j] = log p(z_t = j | z_{t−1} = i) + emissions[t, j] (and the row vector
v_0 = init + emissions[0]), the forward variables are the prefix products of a log-semiring
matrix chain,

    log α_t = v_0 ⊗ M_1 ⊗ … ⊗ M_t,   (A ⊗ B)[i, j] = log Σ_k exp(A[i, k] + B[k, j]),

so log p(y | x) = log Σ_j exp(log α_{T−1}[j]) and log p(y_t | x, y<t) = log Σ α_t − log Σ α_{t−1}.

Two ways to compute them, equal to float precision (tested against each other and brute force):

- ``"sequential"``: the library's chain recursion
  (:func:`~ppl_attention.structures.linear_chain.chain_forward`) over banded steps, O(T·S·W)
  work and T steps of depth — the fast path on a CPU and for short chains;
- ``"parallel"``: an associative (prefix) scan over dense S × S matrices, O(log T) depth and
  O(T·S³) work (the algorithm of ``jax.lax.associative_scan``) — for an accelerator, where depth
  rather than work is the cost.

``"auto"`` takes the banded recursion on a CPU — measured faster there at every size, long chains
of few states included (``benchmarks/structured.py``; docs/results.md) — and the parallel scan
on an accelerator by the rule of :mod:`ppl_attention.structures.chain_paths`.

Exact posterior marginals are ∂ log p(y | x) / ∂ emissions; the Viterbi path the gradient of the
max-plus semiring's value; exact posterior draws by forward filtering, backward sampling.
Nothing here imports torch or JAX: ``ops`` is a backend's operation table.
"""

from __future__ import annotations

from ..core.errors import UserError
from ..core.numerics import LOG_ZERO
from .chain_paths import choose_path
from .linear_chain import chain_forward
from .semirings import LOG, MAX

FLOOR = LOG_ZERO  # finite stand-in for log 0: exp(FLOOR) = 0, and no NaN in gradients
METHODS = ("auto", "sequential", "parallel")


def aligned_transitions(ops, trans, max_back: int):
    """The transition scores lined up with the candidates of each target j:
    ``aligned[..., t, j, d] = trans[..., t, j − d + m, d]`` (FLOOR off the chain), ``[..., T, S,
    W]``."""
    S, W = trans.shape[-2], trans.shape[-1]
    padded = ops.pad_last(trans, -2, W - 1 - max_back, max_back, FLOOR)
    return ops.stack([padded[..., W - 1 - d:W - 1 - d + S, d] for d in range(W)], -1)


def banded_contract(ops, semiring, max_back: int, width: int):
    """The chain's step over banded transitions: the candidates of target j are α_{t−1}[i] +
    trans[t, i, d] for i = j − d + m, d ∈ {0 … W−1}; α_t[j] = ⊕_d candidates + emissions[t, j]."""
    def contract(alpha, aligned_t, emis_t, key):
        S = alpha.shape[-1]
        padded = ops.pad_last(alpha, -1, width - 1 - max_back, max_back, FLOOR)
        cands = ops.band_windows(padded, S, width) + aligned_t  # [..., S(j), W]
        return ops.plus(semiring, cands, -1, key) + emis_t
    return contract


def band_to_dense(ops, trans, max_back: int):
    """``[..., S, W]`` banded log-probabilities → dense ``[..., S, S]`` (FLOOR off the band)."""
    S, W = trans.shape[-2], trans.shape[-1]
    i = ops.arange(S, trans)
    target = i[:, None] + ops.arange(W, trans)[None, :] - max_back  # [S(i), W]
    onehot = ops.cast_like(target[..., None] == i, trans)  # [S(i), W, S(j)]
    dense = ops.einsum("...sw,swt->...st", trans, onehot)
    return ops.where(onehot.sum(-2) > 0, dense, ops.full_like(dense, FLOOR))


class Monotonic:
    """The chain of the module docstring on the operation table ``ops``: ``init [B, S]``,
    ``trans [B, T, S, W]`` (step 0 unused), ``emissions [B, T, S]`` (FLOOR on masked source
    positions), ``mask [B, T]`` bool with ``mask[:, 0]`` True on every real row; ``method``:
    ``"auto"``, ``"sequential"`` or ``"parallel"``. The backends' ``MonotonicAlignment`` bind
    ``ops`` and their source of randomness (:meth:`ffbs`)."""

    ops = None

    def __init__(self, init, trans, emissions, mask, max_back: int = 0, method: str = "auto"):
        if method not in METHODS:
            raise UserError(f"method must be auto, sequential or parallel; got {method!r}")
        if len(emissions.shape) != 3:
            raise UserError(f"MonotonicAlignment: emissions must be [B, T, S], got shape "
                            f"{list(emissions.shape)}")
        B, T, S = emissions.shape
        if tuple(init.shape) != (B, S) or len(trans.shape) != 4 or \
                tuple(trans.shape[:3]) != (B, T, S) or tuple(mask.shape) != (B, T):
            raise UserError(f"MonotonicAlignment: init {list(init.shape)}, trans "
                            f"{list(trans.shape)}, emissions {list(emissions.shape)} and mask "
                            f"{list(mask.shape)} do not agree on [B, T, S]")
        if not 0 <= max_back < trans.shape[-1]:
            raise UserError(f"MonotonicAlignment: max_back must lie in 0 … W − 1 = "
                            f"{trans.shape[-1] - 1}, got {max_back}")
        ops = self.ops
        self.init, self.trans = ops.maximum(init, FLOOR), ops.maximum(trans, FLOOR)
        self.emissions, self.mask = ops.maximum(emissions, FLOOR), ops.as_bool(mask)
        self.max_back, self.W = max_back, trans.shape[-1]
        self.method = self.choose(T, S, emissions) if method == "auto" else method

    @classmethod
    def choose(cls, T: int, S: int, like=None) -> str:
        """The path expected to be faster for ``like``'s device (see the module docstring)."""
        return choose_path(T, S, accelerator=cls.ops.on_accelerator(like))

    @property
    def shape(self):
        return tuple(self.emissions.shape)

    # --- the forward recursion ------------------------------------------------------------------
    def _steps(self, emissions):
        """The chain recursion's inputs after step 0: (aligned ``[T−1, B, S, W]``, emissions
        ``[T−1, B, S]``) and keep ``[T−1, B]``."""
        ops = self.ops
        aligned = aligned_transitions(ops, self.trans[:, 1:], self.max_back)
        steps = (ops.moveaxis(aligned, 1, 0), ops.moveaxis(emissions[:, 1:], 1, 0))
        return steps, ops.moveaxis(self.mask[:, 1:], 1, 0)

    def _sequential(self, emissions, semiring=LOG, filters=True):
        """LOG: (filters log p(z_t | x, y≤t) ``[B, T, S]`` — None unless ``filters`` —, log
        p(y_t | x, y<t) ``[B, T]``); MAX: the best path's score ``[B]``."""
        ops = self.ops
        first = self.init + emissions[:, 0]
        steps, keep = self._steps(emissions)
        contract = banded_contract(ops, semiring, self.max_back, self.W)
        if semiring != LOG:
            return ops.plus(semiring, chain_forward(ops, semiring, first, steps, keep, contract),
                            -1)
        c0 = ops.plus(LOG, first, -1)
        alpha0 = first - c0[:, None]
        c0 = ops.where(self.mask[:, 0], c0, c0 * 0)  # a padded row (NumPyro's padded pairs): 0
        _, collected = chain_forward(ops, LOG, alpha0, steps, keep, contract, normalize=True,
                                     filters=filters)
        if collected is None:  # T = 1
            return alpha0[:, None] if filters else None, c0[:, None]
        ll = ops.concat([c0[:, None], ops.moveaxis(collected[-1], 0, 1)], 1)
        if not filters:
            return None, ll
        return ops.concat([alpha0[:, None], ops.moveaxis(collected[0], 0, 1)], 1), ll

    def _elements(self, emissions):
        """The scan's elements ``[B, T, S, S]``: M_0 (every row v_0), M_t for t ≥ 1, the
        identity on padded steps."""
        ops = self.ops
        B, T, S = self.shape
        dense = band_to_dense(ops, self.trans, self.max_back) + emissions[:, :, None, :]
        first = ops.broadcast_to((self.init + emissions[:, 0])[:, None, :], (B, S, S))
        i = ops.arange(S, dense)
        eye = ops.where(i[:, None] == i[None, :], 0.0, ops.full_like(dense[0, 0], FLOOR))
        dense = ops.where(self.mask[:, :, None, None], dense, eye)
        return ops.concat([first[:, None], dense[:, 1:]], 1)

    def _parallel(self, emissions):
        ops = self.ops
        prefix = ops.associative_scan(ops.logmatmulexp, self._elements(emissions), 1)[:, :, 0]
        log_z = ops.plus(LOG, prefix, -1)  # log p(y_≤t | x)  [B, T]
        ll = ops.concat([log_z[:, :1], log_z[:, 1:] - log_z[:, :-1]], 1)
        return prefix - log_z[..., None], ops.where(self.mask, ll, ll * 0)

    def _forward(self, emissions, filters=True):
        if self.method == "parallel":
            return self._parallel(emissions)
        return self._sequential(emissions, filters=filters)

    def forward(self):
        """(filters log p(z_t | x, y≤t) ``[B, T, S]``, token log-likelihoods ``[B, T]``) by the
        chosen path."""
        return self._forward(self.emissions)

    # --- what a tool asks -----------------------------------------------------------------------
    def token_log_likelihood(self):
        """log p(y_t | x, y<t) ``[B, T]``, 0 on padded steps."""
        return self._forward(self.emissions, filters=False)[1]

    def log_partition(self):
        """log p(y | x) = log Σ_z p(z, y | x), ``[B]``."""
        return self.token_log_likelihood().sum(-1)

    def marginals(self):
        """p(z_t = j | x, y) ``[B, T, S]`` = ∂ log p(y | x) / ∂ emissions (0 on padded steps;
        differentiable in turn where the emissions are)."""
        ops = self.ops
        grad = ops.grad(lambda e: self._forward(e, filters=False)[1].sum(-1), self.emissions)
        return ops.where(self.mask[..., None], grad, grad * 0)

    def max_score(self, emissions=None):
        """max_z log p(z, y | x) ``[B]``."""
        emissions = self.emissions if emissions is None else emissions
        if self.method == "parallel":
            ops = self.ops
            best = ops.associative_scan(ops.maxmatmul, self._elements(emissions), 1)[:, -1, 0]
            return ops.plus(MAX, best, -1)
        return self._sequential(emissions, MAX)

    def viterbi(self):
        """The MAP path argmax_z p(z | x, y), ``[B, T]`` (0 on padded steps): the gradient of
        the max-plus value with respect to the emissions is the best path's indicator."""
        ops = self.ops
        grad = ops.grad(self.max_score, ops.stop_gradient(self.emissions))
        path = ops.argmax(grad, -1)
        return ops.where(self.mask, path, path * 0)

    def score(self, z):
        """log p(z, y | x) of paths ``z [..., B, T]`` (padded steps ignored), ``[..., B]``."""
        ops = self.ops
        z = ops.to_index(z)
        em = ops.take_along_last(self.emissions, z[..., None])[..., 0]  # [..., B, T]
        start = ops.take_along_last(self.init, z[..., :1])[..., 0]
        d = z[..., 1:] - z[..., :-1] + self.max_back  # [..., B, T−1]
        ok = (d >= 0) & (d < self.W)
        rows = ops.take_along_last(ops.moveaxis(self.trans[:, 1:], -2, -1),
                                   z[..., :-1, None, None])[..., 0]  # [..., B, T−1, W]
        tr = ops.take_along_last(rows, ops.clip(d, 0, self.W - 1)[..., None])[..., 0]
        tr = ops.where(ok, tr, ops.full_like(tr, FLOOR))
        steps = ops.where(self.mask[:, 1:], tr + em[..., 1:], tr * 0)
        return start + em[..., 0] + steps.sum(-1)

    def log_prob(self, z):
        """log p(z | x, y) of paths ``z [..., B, T]``, ``[..., B]``."""
        return self.score(z) - self.log_partition()

    def ffbs(self, num_samples: int, keys, draw):
        """Exact draws z ~ p(z | x, y) by forward filtering, backward sampling, ``[K, B, T]`` (0
        on padded steps): z_{T−1} from the last filter, then z_t from p(z_t | z_{t+1}, y≤t) ∝
        filter_t(z_t) p(z_{t+1} | z_t). ``keys`` ``[T, ...]`` one per step, ``draw(key, logits
        [..., S]) → [...]`` the backend's categorical draw."""
        ops = self.ops
        filters, _ = self.forward()
        B, T, S = self.shape
        K, m, W = num_samples, self.max_back, self.W
        lengths = self.mask.sum(-1)
        i = ops.arange(S, filters)
        last = draw(keys[T - 1], ops.broadcast_to(filters[:, -1], (K, B, S)))
        z_last = ops.where((lengths > T - 1)[None], last, last * 0)
        if T == 1:
            return z_last[..., None]

        def step(z_next, xs):
            t, f_t, trans_next, key = xs
            d = z_next[..., None] - i + m  # [K, B, S]: the jump from i to z_{t+1}
            ok = (d >= 0) & (d < W)
            tr = ops.take_along_last(ops.broadcast_to(trans_next, (K, B, S, W)),
                                     ops.clip(d, 0, W - 1)[..., None])[..., 0]
            inner = (lengths > t + 1)[None, :, None]
            logits = ops.where(inner, f_t + ops.where(ok, tr, ops.full_like(tr, FLOOR)),
                               ops.broadcast_to(f_t, (K, B, S)))
            z_t = draw(key, logits)
            z_t = ops.where((lengths > t)[None], z_t, z_t * 0)
            return z_t, (z_t,)

        xs = (ops.arange(T - 1, lengths), ops.moveaxis(filters[:, :-1], 1, 0),
              ops.moveaxis(self.trans[:, 1:], 1, 0), keys[:T - 1])
        _, (zs,) = ops.scan_collect(step, z_last, xs, reverse=True)  # [T−1, K, B]
        return ops.concat([ops.moveaxis(zs, 0, -1), z_last[..., None]], -1)


__all__ = ["Monotonic", "FLOOR", "METHODS", "aligned_transitions", "banded_contract",
           "band_to_dense"]
