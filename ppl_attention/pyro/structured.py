"""``MonotonicAlignment``: exact inference over alignment paths of a hard monotonic (HMM) attention,
marginalized inside the distribution as Pyro's ``DiscreteHMM`` does, instead of by T sequential
enumerated sites.

The chain z_0 … z_{T−1} ∈ {0 … S−1} has

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

- ``"sequential"``: T banded steps, O(T·S·W) work and T steps of depth — the fast path on a CPU
  and for short chains;
- ``"parallel"``: an associative (prefix) scan over dense S × S matrices, O(log T) depth and
  O(T·S³) work (the algorithm of ``jax.lax.associative_scan``) — for an accelerator, where depth
  rather than work is the cost.

``"auto"`` takes the banded recursion on a CPU — measured faster there at every size, long chains
of few states included (``benchmarks/structured.py``; docs/results.md) — and the parallel scan
on a GPU for T ≥ 64 and S ≤ 128 (a choice no GPU measurement has confirmed yet).

The other structure, a dependency tree over the source, is :class:`DependencyTree`
(:mod:`ppl_attention.pyro.trees`, re-exported here).

Exact posterior marginals are ∂ log p(y | x) / ∂ emissions; the Viterbi path the argmax of the
max-plus semiring (with back-pointers, or on the parallel path as ∂ of the max-plus score); exact
posterior draws by forward filtering, backward sampling.
"""

from __future__ import annotations

import torch

from ..core.chain_paths import choose_path
from ..core.errors import UserError
from ..core.numerics import LOG_ZERO
from .distributions import categorical_draws
from .trees import DependencyTree

__all__ = ["MonotonicAlignment", "DependencyTree", "FLOOR", "logmatmulexp", "associative_scan"]

FLOOR = LOG_ZERO  # finite stand-in for log 0: exp(FLOOR) = 0, and no NaN in gradients


def logmatmulexp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(A ⊗ B)[i, j] = log Σ_k exp(A[i, k] + B[k, j]) for ``[..., S, S]`` matrices, by a max-shifted
    matmul (memory of the operands, not of S³)."""
    ma = a.max(-1, keepdim=True).values
    mb = b.max(-2, keepdim=True).values
    prod = torch.exp(a - ma) @ torch.exp(b - mb)
    return torch.log(prod.clamp_min(torch.finfo(prod.dtype).tiny)) + ma + mb


def maxmatmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(A ⊙ B)[i, j] = max_k A[i, k] + B[k, j] (the max-plus semiring)."""
    return (a.unsqueeze(-1) + b.unsqueeze(-3)).max(-2).values


def associative_scan(op, elems: torch.Tensor, dim: int) -> torch.Tensor:
    """Inclusive prefix scan: out[t] = elems[0] ∘ … ∘ elems[t] along ``dim`` for an associative
    ``op`` — the odd/even recursion of ``jax.lax.associative_scan``, O(log T) levels."""
    elems = elems.movedim(dim, 0)

    def scan(e):
        n = e.shape[0]
        if n < 2:
            return e
        odd = scan(op(e[0:-1:2], e[1::2]))
        if n % 2 == 0:
            even = op(odd[:-1], e[2::2])
        else:
            even = op(odd, e[2::2])
        even = torch.cat([e[:1], even], 0)
        out = torch.empty((n, *e.shape[1:]), dtype=e.dtype, device=e.device)
        out[0::2] = even
        out[1::2] = odd
        return out

    return scan(elems).movedim(0, dim)


def _band_to_dense(trans: torch.Tensor, max_back: int) -> torch.Tensor:
    """``[..., S, W]`` banded log-probabilities → dense ``[..., S, S]`` (FLOOR off the band)."""
    *lead, S, W = trans.shape
    dense = torch.full((*lead, S, S + W), FLOOR, dtype=trans.dtype, device=trans.device)
    i = torch.arange(S, device=trans.device)
    cols = i[:, None] + torch.arange(W, device=trans.device)  # j + max_back, shifted ≥ 0
    dense = dense.scatter(-1, cols.expand(*lead, S, W), trans)
    return dense[..., max_back:max_back + S]


class MonotonicAlignment:
    """The chain of the module docstring. ``init [B, S]``, ``trans [B, T, S, W]`` (step 0
    unused), ``emissions [B, T, S]`` (FLOOR on masked source positions), ``mask [B, T]`` bool with
    ``mask[:, 0]`` True; ``method``: ``"auto"``, ``"sequential"`` or ``"parallel"``."""

    def __init__(self, init, trans, emissions, mask, max_back: int = 0, method: str = "auto"):
        if method not in ("auto", "sequential", "parallel"):
            raise UserError(f"method must be auto, sequential or parallel; got {method!r}")
        B, T, S = emissions.shape
        if init.shape != (B, S) or trans.shape[:3] != (B, T, S) or mask.shape != (B, T):
            raise UserError(f"MonotonicAlignment: init {list(init.shape)}, trans "
                            f"{list(trans.shape)}, emissions {list(emissions.shape)} and mask "
                            f"{list(mask.shape)} do not agree on [B, T, S]")
        self.init, self.trans = init.clamp(min=FLOOR), trans.clamp(min=FLOOR)
        self.emissions, self.mask = emissions.clamp(min=FLOOR), mask.bool()
        self.max_back, self.W = max_back, trans.shape[-1]
        self.method = self.choose(T, S, emissions.device) if method == "auto" else method

    @staticmethod
    def choose(T: int, S: int, device) -> str:
        """The path expected to be faster (see the module docstring)."""
        return choose_path(T, S, accelerator=torch.device(device).type == "cuda")

    @property
    def shape(self):
        return self.emissions.shape

    # --- the forward recursion ------------------------------------------------------------------
    def _banded_steps(self):
        """Per step t, the transition scores lined up with the candidates of each target j:
        ``aligned[t][b, j, d] = trans[b, t, j − d + m, d]`` (FLOOR off the chain), ``[B, S, W]``;
        and the emissions ``[B, S]``. Unbound once, so that the backward pass stacks the T
        gradients once instead of scattering each step into a zero ``[B, T, S, W]`` buffer."""
        S, m, W = self.shape[2], self.max_back, self.W
        tr = torch.nn.functional.pad(self.trans, (0, 0, W - 1 - m, m), value=FLOOR)
        aligned = torch.stack([tr[:, :, W - 1 - d:W - 1 - d + S, d] for d in range(W)], -1)
        return aligned.unbind(1), self.emissions.unbind(1)

    def _step(self, alpha, aligned_t, emis_t, semiring="log"):
        """log α_t (unnormalized) from α_{t−1}: banded, ``[B, S]``. The candidates of target j
        are α_{t−1}[i] + trans[t, i, d] for i = j − d + m, d ∈ {0 … W−1}."""
        S, m, W = alpha.shape[-1], self.max_back, self.W
        padded = torch.nn.functional.pad(alpha, (W - 1 - m, m), value=FLOOR)  # index i + W−1−m
        # padded[:, k:k + S] for k = W−1−d: unfold gives k = 0 … W−1, flipped to d = 0 … W−1
        cands = padded.unfold(-1, S, 1).flip(-2).transpose(-1, -2) + aligned_t  # [B, S(j), W]
        if semiring == "log":
            return cands.logsumexp(-1) + emis_t, None
        best, arg = cands.max(-1)
        return best + emis_t, arg

    def _forward_sequential(self):
        """Normalized filters log p(z_t | x, y≤t) ``[B, T, S]``, log p(y_t | x, y<t) ``[B, T]``."""
        B, T, S = self.shape
        aligned, emis = self._banded_steps()
        keeps = self.mask.unbind(1)
        joint = self.init + emis[0]
        ll0 = joint.logsumexp(-1)
        alpha = joint - ll0[:, None]
        lls = [torch.where(keeps[0], ll0, torch.zeros_like(ll0))]  # a padded row: 0
        filters = [alpha]
        for t in range(1, T):
            joint, _ = self._step(alpha, aligned[t], emis[t])
            ll = joint.logsumexp(-1)
            alpha = torch.where(keeps[t][:, None], joint - ll[:, None], alpha)
            lls.append(torch.where(keeps[t], ll, torch.zeros_like(ll)))
            filters.append(alpha)
        return torch.stack(filters, 1), torch.stack(lls, 1)

    def _elements(self):
        """The scan's elements ``[B, T, S, S]``: M_0 (every row v_0), M_t for t ≥ 1, the
        identity on padded steps."""
        B, T, S = self.shape
        dense = _band_to_dense(self.trans, self.max_back) + self.emissions[:, :, None, :]
        first = (self.init + self.emissions[:, 0])[:, None, :].expand(B, S, S)
        eye = torch.full((S, S), FLOOR, dtype=dense.dtype, device=dense.device)
        eye.fill_diagonal_(0.0)
        dense = torch.where(self.mask[:, :, None, None], dense, eye)
        return torch.cat([first[:, None], dense[:, 1:]], 1)

    def _forward_parallel(self):
        prefix = associative_scan(logmatmulexp, self._elements(), dim=1)[:, :, 0]  # [B, T, S]
        log_z = prefix.logsumexp(-1)  # log p(y_≤t | x)
        ll = torch.cat([log_z[:, :1], log_z[:, 1:] - log_z[:, :-1]], 1)
        ll = torch.where(self.mask, ll, torch.zeros_like(ll))
        return prefix - log_z[..., None], ll

    def forward(self):
        """(filters ``[B, T, S]``, token log-likelihoods ``[B, T]``) by the chosen path."""
        if self.method == "parallel":
            return self._forward_parallel()
        return self._forward_sequential()

    # --- what a tool asks -----------------------------------------------------------------------
    def token_log_likelihood(self) -> torch.Tensor:
        """log p(y_t | x, y<t) ``[B, T]``, 0 on padded steps."""
        return self.forward()[1]

    def log_partition(self) -> torch.Tensor:
        """log p(y | x) = log Σ_z p(z, y | x), ``[B]``."""
        return self.token_log_likelihood().sum(-1)

    def marginals(self) -> torch.Tensor:
        """p(z_t = j | x, y) ``[B, T, S]`` = ∂ log p(y | x) / ∂ emissions (0 on padded steps)."""
        with torch.enable_grad():
            emis = self.emissions.detach().requires_grad_(True)
            twin = MonotonicAlignment(self.init.detach(), self.trans.detach(), emis, self.mask,
                                      self.max_back, self.method)
            (grad,) = torch.autograd.grad(twin.log_partition().sum(), emis)
        return grad.masked_fill(~self.mask[..., None], 0.0)

    def score(self, z: torch.Tensor) -> torch.Tensor:
        """log p(z, y | x) of paths ``z [..., B, T]`` (padded steps ignored), ``[..., B]``."""
        z = z.long()
        lead = z.shape[:-2]
        B, T, S = self.shape
        em = self.emissions.expand(*lead, B, T, S).gather(-1, z.unsqueeze(-1)).squeeze(-1)
        start = self.init.expand(*lead, B, S).gather(-1, z[..., :1]).squeeze(-1)
        d = z[..., 1:] - z[..., :-1] + self.max_back  # [.., B, T−1]
        ok = (d >= 0) & (d < self.W)
        tr = self.trans[:, 1:].expand(*lead, B, T - 1, S, self.W)
        tr = tr.gather(-2, z[..., :-1, None, None].expand(*lead, B, T - 1, 1, self.W))
        tr = tr.squeeze(-2).gather(-1, d.clamp(0, self.W - 1).unsqueeze(-1)).squeeze(-1)
        tr = torch.where(ok, tr, torch.full_like(tr, FLOOR))
        keep = self.mask[:, 1:]
        steps = torch.where(keep, tr + em[..., 1:], torch.zeros_like(tr))
        return start + em[..., 0] + steps.sum(-1)

    def log_prob(self, z: torch.Tensor) -> torch.Tensor:
        """log p(z | x, y) of paths ``z [..., B, T]``, ``[..., B]``."""
        return self.score(z) - self.log_partition()

    def viterbi(self) -> torch.Tensor:
        """The MAP path argmax_z p(z | x, y), ``[B, T]`` (0 on padded steps)."""
        if self.method == "parallel":
            return self._viterbi_parallel()
        B, T, S = self.shape
        m = self.max_back
        aligned, emis = self._banded_steps()
        score = self.init + emis[0]
        backs = []
        for t in range(1, T):
            new, arg = self._step(score, aligned[t], emis[t], semiring="max")
            keep = self.mask[:, t]
            j = torch.arange(S, device=score.device)
            prev = (j - arg + m).clamp(0, S - 1)  # the best i for each j
            backs.append(torch.where(keep[:, None], prev, j.expand(B, S)))
            score = torch.where(keep[:, None], new, score)
        z = torch.empty(B, T, dtype=torch.long, device=score.device)
        z[:, T - 1] = score.argmax(-1)
        for t in range(T - 1, 0, -1):
            z[:, t - 1] = backs[t - 1].gather(-1, z[:, t:t + 1]).squeeze(-1)
        return z.masked_fill(~self.mask, 0)

    def _viterbi_parallel(self) -> torch.Tensor:
        with torch.enable_grad():
            emis = self.emissions.detach().requires_grad_(True)
            twin = MonotonicAlignment(self.init.detach(), self.trans.detach(), emis, self.mask,
                                      self.max_back, "parallel")
            best = associative_scan(maxmatmul, twin._elements(), dim=1)[:, -1, 0].max(-1).values
            (grad,) = torch.autograd.grad(best.sum(), emis)
        return grad.argmax(-1).masked_fill(~self.mask, 0)

    def sample(self, num_samples: int = 1, generator: torch.Generator | None = None
               ) -> torch.Tensor:
        """Exact draws z ~ p(z | x, y) by forward filtering, backward sampling, ``[K, B, T]``
        (0 on padded steps)."""
        filters, _ = self.forward()
        B, T, S = self.shape
        K, m, W = num_samples, self.max_back, self.W
        lengths = self.mask.sum(-1)
        z = torch.zeros(K, B, T, dtype=torch.long, device=filters.device)
        i = torch.arange(S, device=filters.device)
        for t in range(T - 1, -1, -1):
            logits = filters[:, t].expand(K, B, S)
            if t + 1 < T:
                d = z[:, :, t + 1, None] - i + m  # [K, B, S]: the jump from i to z_{t+1}
                ok = (d >= 0) & (d < W)
                tr = self.trans[:, t + 1].expand(K, B, S, W).gather(
                    -1, d.clamp(0, W - 1).unsqueeze(-1)).squeeze(-1)
                inner = (t + 1 < lengths)[None, :, None]
                tr = torch.where(ok, tr, torch.full_like(tr, FLOOR))
                logits = torch.where(inner, logits + tr, logits)
            draw = categorical_draws(logits.softmax(-1).reshape(-1, S), 1, generator).view(K, B)
            z[:, :, t] = torch.where((t < lengths)[None], draw, torch.zeros_like(draw))
        return z
