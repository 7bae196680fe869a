"""``DependencyTree``: a distribution over the dependency trees of a sentence (a latent syntactic
structure), exact in everything it computes.

Given log-potentials ``scores [..., N, N]`` — ``scores[..., h, m]`` the arc h → m (word h heads
word m), the diagonal ``scores[..., m, m]`` the arc root → m, torch-struct's ``DependencyCRF``
convention — and the sentence ``lengths [...]``, a tree z (a set of arcs in which every word has
one head and every word reaches the root) has

    p(z | θ) = exp(Σ_{(h→m) ∈ z} θ_hm) / Z(θ),     Z(θ) = Σ_z exp(Σ_{(h→m) ∈ z} θ_hm).

A tree is written ``heads [..., N]``: ``heads[m] = h``, ``heads[m] = m`` for the root's child;
words at or past a row's length belong to no tree and hold their own index.

Two kinds of trees:

- ``projective=True``: arcs do not cross. Z by Eisner's first-order inside recursion in the log
  semiring (Eisner 1996; written once for both backends in :mod:`ppl_attention.structures.eisner`),
  O(N³) work, one batched tensor operation per span width: for a span
  s..t of width k the incomplete items (an arc between s and t over the best split) and the
  complete items (a head with its finished half-subtrees),

      I→[s,t] = I←[s,t] − θ_ts + θ_st = ⊕_{s≤r<t} C→[s,r] ⊗ C←[r+1,t] ⊗ θ_(st or ts),
      C←[s,t] = ⊕_{s≤r<t} C←[s,r] ⊗ I←[r,t],     C→[s,t] = ⊕_{s<r≤t} I→[s,r] ⊗ C→[r,t];

  with one root child (``single_root``) Z = ⊕_m C←[0,m] ⊗ C→[m,L−1] ⊗ θ_mm; with several, the
  same recursion over the sentence with the root prepended, Z = C→[root, L−1].
- ``projective=False``: every spanning arborescence. Z by the matrix-tree theorem (Koo, Globerson,
  Carreras & Collins 2007): with A_hm = exp θ_hm (h ≠ m) and r_m = exp θ_mm, Z = det L̂ where
  L̂ = diag(r + Σ_h A_h·) − A for several root children, and for one the Laplacian
  diag(Σ_h A_h·) − A with its first row replaced by r. Each column is shifted by its largest
  score first (every tree has exactly one arc into each word, so Z scales by exp Σ_m c_m): stable
  in float32 at N = 64.

Everything else follows from log Z, by automatic differentiation (no hand-written outside pass):
arc marginals μ_hm = p((h→m) ∈ z) = ∂ log Z / ∂θ_hm (differentiable again: the deterministic
structured attention of Kim et al. 2017 backpropagates through them), the entropy
H = log Z − Σ μ θ, KL(p ‖ q) = Σ μ^p (θ^p − θ^q) − log Z_p + log Z_q. The MAP tree is the
backward pass of the same recursion in the max-plus semiring (projective; Eisner's Viterbi), or
Chu–Liu–Edmonds (non-projective, on the host). Exact draws: projective ones top-down through
the inside chart — the backward pass of the recursion where each ⊕ node passes its incoming
indicator to one child drawn in proportion to its weight (Gumbel-max); non-projective ones
word by word from the exact marginals conditioned on the heads drawn so far.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pyro.distributions import TorchDistribution
from torch.distributions import constraints, register_kl

from ..core.errors import NonFiniteScores, UserError
from ..core.heads import check_trees, chu_liu_edmonds, enumerate_trees
from ..core.numerics import LOG_ZERO
from ..structures import torch_ops
from ..structures.eisner import eisner_value
from ..structures.sparsemap import DEFAULT_MAX_ACTIVE
from ..structures.trainable import Trainable
from .distributions import categorical_draws
from .sparse import SparseMAP

__all__ = ["DependencyTree", "heads_to_arcs", "arcs_to_heads", "tree_log_likelihood",
           "tree_posterior", "FLOOR"]

FLOOR = LOG_ZERO  # finite log 0 (as in MonotonicAlignment): no NaN in gradients


def heads_to_arcs(heads: torch.Tensor, dtype=None) -> torch.Tensor:
    """``heads [..., N]`` → arc indicators ``[..., N, N]`` (``[h, m]`` = 1 when h heads m; the
    diagonal marks the root's child)."""
    N = heads.shape[-1]
    return F.one_hot(heads.long(), N).transpose(-1, -2).to(dtype or torch.get_default_dtype())


def arcs_to_heads(arcs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Arc indicators ``[..., N, N]`` → heads ``[..., N]`` (padded positions their own index)."""
    N = arcs.shape[-1]
    idx = torch.arange(N, device=arcs.device)
    heads = arcs.argmax(-2)
    return torch.where(idx < lengths.unsqueeze(-1), heads, idx.expand(heads.shape))


def _eisner_log_partition(theta, lengths, single_root: bool, semiring: str = "log"):
    """log Z (or its max / sampled counterpart) of projective trees, ``[...]``: the structure
    library's one Eisner recursion (:func:`~ppl_attention.structures.eisner.eisner_value`) on
    PyTorch."""
    return eisner_value(torch_ops, semiring, theta, lengths, single_root)


def _matrix_tree_log_partition(theta, lengths, single_root: bool, full: bool = False):
    """log Z of non-projective trees by the matrix-tree theorem, ``[...]``; ``full``: every row
    is N long (no padding to mask: the same value, fewer operations)."""
    n = theta.shape[-1]
    if full:
        shift = theta.detach().amax(-2)  # over the heads and the root, per word
        shifted = theta - shift.unsqueeze(-2)
        r = shifted.diagonal(0, -2, -1).exp()
        shifted.diagonal(0, -2, -1).fill_(-float("inf"))  # no self-arcs: exp gives exactly 0
        A = shifted.exp()
        if single_root:
            lap = torch.diag_embed(A.sum(-2)) - A
            lap.select(-2, 0).copy_(r)  # the first row replaced by the root's weights
        else:
            lap = torch.diag_embed(A.sum(-2) + r) - A
        return torch.linalg.slogdet(lap).logabsdet + shift.sum(-1)
    eye = torch.eye(n, dtype=torch.bool, device=theta.device)
    idx = torch.arange(n, device=theta.device)
    real = idx < lengths.unsqueeze(-1)  # [..., n]
    arc_ok = real.unsqueeze(-1) & real.unsqueeze(-2) & ~eye
    candidates = torch.where(arc_ok | (eye & real.unsqueeze(-2)), theta,
                             torch.full_like(theta, FLOOR))
    shift = torch.where(real, candidates.max(-2).values, torch.zeros_like(theta[..., 0])).detach()
    A = torch.where(arc_ok, (theta - shift.unsqueeze(-2)).exp(), torch.zeros_like(theta))
    r = torch.where(real, (theta.diagonal(0, -2, -1) - shift).exp(), torch.zeros_like(shift))
    cols = A.sum(-2)
    if single_root:
        lap = torch.diag_embed(cols) - A
        lap = torch.cat([r.unsqueeze(-2), lap[..., 1:, :]], -2)
    else:
        lap = torch.diag_embed(cols + r) - A
    pad = eye & ~real.unsqueeze(-2)
    lap = torch.where(pad, torch.ones_like(lap), lap)
    return torch.linalg.slogdet(lap).logabsdet + shift.sum(-1)


class DependencyTree(Trainable, TorchDistribution):
    """Trees of the module docstring. ``scores [..., N, N]`` (float), ``lengths [...]`` (int,
    1 ≤ L ≤ N; default N); ``projective``, ``single_root``. A sample is ``heads [..., N]``.

    The relaxations and SparseMAP (:mod:`ppl_attention.structures.trainable`) run on the arc
    indicators ``[..., N, N]``: ``relaxed_sample`` returns relaxed arcs, ``sparsemap()`` a
    sparse distribution over trees (heads).

    ``batch_shape = scores.shape[:-2]``, ``event_shape = (N,)``. Scores of padded arcs (a head
    or modifier at or past the length) are ignored, whatever their value; a non-finite score at a
    real arc is refused (with validation on, Pyro's default).
    """

    arg_constraints: dict = {}
    has_enumerate_support = True

    def __init__(self, scores: torch.Tensor, lengths: torch.Tensor | None = None, *,
                 projective: bool = True, single_root: bool = True, validate_args=None):
        if not isinstance(scores, torch.Tensor) or scores.dim() < 2 \
                or scores.shape[-1] != scores.shape[-2]:
            shape = list(getattr(scores, "shape", []))
            raise UserError(f"DependencyTree: scores must be square [..., N, N], got {shape}")
        N = scores.shape[-1]
        batch_shape = scores.shape[:-2]
        given = lengths is not None
        if not given:
            lengths = torch.full(batch_shape, N, dtype=torch.long, device=scores.device)
        else:
            lengths = torch.as_tensor(lengths, device=scores.device)
            if lengths.is_floating_point() or lengths.dtype == torch.bool:
                raise UserError(f"DependencyTree: lengths must be integers, got {lengths.dtype}")
            try:
                lengths = lengths.long().expand(batch_shape)
            except RuntimeError:
                raise UserError(f"DependencyTree: lengths of shape {list(lengths.shape)} do not "
                                f"broadcast to the batch shape {list(batch_shape)}") from None
        checks = scores.device.type != "meta"
        shortest = N  # without lengths every row is N long
        if checks and lengths.numel() and given:
            shortest, longest = (int(v) for v in torch.aminmax(lengths))
            if shortest < 1 or longest > N:
                bad = int(lengths[(lengths < 1) | (lengths > N)].flatten()[0])
                raise UserError(f"DependencyTree: every length must be in 1 … N = {N}, got {bad}")
        self.projective, self.single_root = bool(projective), bool(single_root)
        self.lengths = lengths
        #: every row N long (known when the lengths have values): nothing to mask
        self._full = checks and shortest == N
        real_arc = None
        if not self._full:
            real = torch.arange(N, device=scores.device) < lengths.unsqueeze(-1)  # [..., N]
            real_arc = real.unsqueeze(-1) & real.unsqueeze(-2)
        super().__init__(batch_shape, torch.Size([N]), validate_args=validate_args)
        # one reduction finds whether every score is finite and at or above log 0 (NaN fails
        # both comparisons); only if not are the real arcs' looked at, and the scores floored
        in_range = False
        if checks and scores.numel():
            lo, hi = torch.stack(torch.aminmax(scores.detach())).tolist()  # one sync
            in_range = lo >= FLOOR and hi < float("inf")
        if checks and self._validate_args and not in_range:
            bad = ~torch.isfinite(scores) if self._full else real_arc & ~torch.isfinite(scores)
            if bad.any():
                where = [int(i) for i in bad.nonzero()[0]]
                raise NonFiniteScores(f"DependencyTree: scores must be finite at real arcs; "
                                f"{int(bad.sum())} are not (first at index {where}; give padded "
                                f"positions through lengths=)")
        self.scores = scores
        floored = scores if in_range else scores.clamp(min=FLOOR)
        self.theta = floored if self._full else \
            torch.where(real_arc, floored, torch.zeros_like(scores))
        self._log_z = None

    # --- shapes and support -------------------------------------------------------------------
    @property
    def N(self) -> int:
        return self.event_shape[0]

    @property
    def _real(self) -> torch.Tensor:
        """``[..., N]``: position m lies within its row's length."""
        return torch.arange(self.N, device=self.lengths.device) < self.lengths.unsqueeze(-1)

    @constraints.dependent_property(is_discrete=True, event_dim=1)
    def support(self):
        return constraints.independent(constraints.integer_interval(0, self.N - 1), 1)

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        new = self._get_checked_instance(DependencyTree, _instance)
        N = self.N
        new.projective, new.single_root = self.projective, self.single_root
        new.lengths = self.lengths.expand(batch_shape)
        new._full = self._full
        new.scores = self.scores.expand(batch_shape + (N, N))
        new.theta = self.theta.expand(batch_shape + (N, N))
        new._log_z = None if self._log_z is None else self._log_z.expand(batch_shape)
        super(DependencyTree, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _same_kind(self, theta) -> DependencyTree:
        return DependencyTree(theta, self.lengths, projective=self.projective,
                              single_root=self.single_root, validate_args=False)

    # --- log Z and what follows from it ------------------------------------------------------
    def _partition(self, theta, semiring: str = "log"):
        if self.projective:
            return _eisner_log_partition(theta, self.lengths, self.single_root, semiring)
        if semiring != "log":
            raise UserError("only projective trees have a max/sample semiring here")
        return _matrix_tree_log_partition(theta, self.lengths, self.single_root, self._full)

    @property
    def log_partition(self) -> torch.Tensor:
        """log Z(θ) ``[...]``."""
        if self._log_z is None:
            self._log_z = self._partition(self.theta)
        return self._log_z

    @property
    def marginals(self) -> torch.Tensor:
        """Arc marginals μ ``[..., N, N]``: ``[h, m]`` = p(h heads m), diagonal p(m is the root's
        child); every real column sums to 1, padded rows and columns are exactly 0.
        Differentiable in the scores when they require grad (second-order autograd)."""
        return self._marginals(self.theta)

    def _marginals(self, theta):
        if torch.is_grad_enabled() and theta.requires_grad:
            log_z = self._partition(theta)
            (mu,) = torch.autograd.grad(log_z.sum(), theta, create_graph=True)
            return mu
        with torch.enable_grad():
            leaf = theta.detach().requires_grad_(True)
            (mu,) = torch.autograd.grad(self._partition(leaf).sum(), leaf)
        return mu

    def score(self, heads: torch.Tensor) -> torch.Tensor:
        """Σ_{(h→m) ∈ z} θ_hm of trees ``heads [..., N]``, ``[...]``."""
        heads = heads.long()
        shape = torch.broadcast_shapes(heads.shape[:-1], self.batch_shape)
        theta = self.theta.expand(shape + (self.N, self.N))
        arc = theta.gather(-2, heads.expand(shape + (self.N,)).unsqueeze(-2)).squeeze(-2)
        return torch.where(self._real.expand(arc.shape), arc, torch.zeros_like(arc)).sum(-1)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """log p(z) = score(z) − log Z for ``heads [..., N]`` (checked to be trees of this
        kind and these lengths, validation on)."""
        if self._validate_args and value.device.type != "meta":
            self._validate_sample(value)
            shape = torch.broadcast_shapes(value.shape[:-1], self.batch_shape)
            check_trees(value.expand(shape + (self.N,)).detach().cpu().numpy(),
                        self.lengths.expand(shape).cpu().numpy(), projective=self.projective,
                        single_root=self.single_root)
        return self.score(value) - self.log_partition

    def entropy(self) -> torch.Tensor:
        """H(p) = log Z − Σ_hm μ_hm θ_hm, exact, ``[...]``; computed with every column shifted by
        its largest real score c_m (each tree has one arc into each word, so log Z and Σ μ θ
        both fall by Σ c_m): no cancellation between two large numbers in float32."""
        c = torch.where(self._real, self.theta.masked_fill(
            ~(self._real.unsqueeze(-1) & self._real.unsqueeze(-2)), FLOOR).max(-2).values,
            torch.zeros_like(self.theta[..., 0])).detach()
        return (self.log_partition - c.sum(-1)) - (self.marginals * (self.theta - c.unsqueeze(-2))
                                                   ).masked_fill(~self._real.unsqueeze(-2),
                                                                 0.0).sum((-1, -2))

    # --- ways to train through it (structures/trainable.py), on the arc indicators -----------
    ops = torch_ops
    event_dims = 2

    @property
    def log_potentials(self) -> torch.Tensor:
        return self.theta

    @property
    def trainable(self) -> DependencyTree:
        return self

    def aux(self) -> tuple:
        return (self.lengths,)

    def marginals_at(self, theta: torch.Tensor) -> torch.Tensor:
        """Arc marginals at arc scores ``theta`` (these lengths and kind; differentiable)."""
        return self.at(theta)._marginals(theta)

    def at(self, theta: torch.Tensor) -> DependencyTree:
        """The same kind of tree over other arc scores (draws on the left of the batch)."""
        return DependencyTree(theta, self.lengths.expand(theta.shape[:-2]),
                              projective=self.projective, single_root=self.single_root,
                              validate_args=False)

    def log_z(self) -> torch.Tensor:
        return self.log_partition

    def sample_events(self, n: int, key=None) -> torch.Tensor:
        """``n`` exact draws as arc indicators ``[n, ..., N, N]`` (padded words: none)."""
        heads = self.sample((n,))
        real = self._real.to(self.theta.dtype)
        return heads_to_arcs(heads, self.theta.dtype) * real.unsqueeze(-1) * real.unsqueeze(-2)

    def argmax_at(self, theta: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Arc indicators ``[..., N, N]`` of the MAP tree at ``theta`` with ``lengths``."""
        theta = theta.detach()
        if self.projective:
            with torch.enable_grad():
                leaf = theta.requires_grad_(True)
                (arcs,) = torch.autograd.grad(_eisner_log_partition(
                    leaf, lengths.expand(theta.shape[:-2]), self.single_root, "max").sum(), leaf)
            return arcs
        tree = DependencyTree(theta, lengths.expand(theta.shape[:-2]), projective=False,
                              single_root=self.single_root, validate_args=False)
        return heads_to_arcs(tree.argmax(), theta.dtype)

    def sparse_values(self, events: torch.Tensor) -> torch.Tensor:
        """SparseMAP's slots (arc indicators) as heads ``[K, ..., N]``."""
        return arcs_to_heads(events, self.lengths.expand(events.shape[:-2]))

    def sparsemap(self, max_active: int | None = None, max_iter: int | None = None,
                  statistics=None) -> SparseMAP:
        """SparseMAP's sparse distribution over these trees (heads); ``statistics`` as the
        structures' (:meth:`ppl_attention.structures.distribution.StructuredDistribution.
        sparsemap`)."""
        return SparseMAP(self, max_active or DEFAULT_MAX_ACTIVE, max_iter, statistics=statistics)

    # --- the MAP tree and exact draws ---------------------------------------------------------
    def argmax(self) -> torch.Tensor:
        """The MAP tree ``heads [..., N]``: Eisner's Viterbi (projective) or Chu–Liu–Edmonds
        (non-projective, on the host)."""
        if self.projective:
            with torch.enable_grad():
                leaf = self.theta.detach().requires_grad_(True)
                (arcs,) = torch.autograd.grad(self._partition(leaf, "max").sum(), leaf)
            return arcs_to_heads(arcs, self.lengths)
        theta = self.theta.detach().cpu().to(torch.float64).numpy()
        flat = theta.reshape(-1, self.N, self.N)
        lens = self.lengths.reshape(-1).cpu().numpy()
        heads = np.stack([chu_liu_edmonds(s, int(L), single_root=self.single_root)
                          for s, L in zip(flat, lens)]) if flat.shape[0] else \
            np.zeros((0, self.N), np.int64)
        return torch.as_tensor(heads.reshape(self.batch_shape + (self.N,)),
                               device=self.scores.device)

    @property
    def mode(self) -> torch.Tensor:
        return self.argmax()

    def sample(self, sample_shape=()) -> torch.Tensor:
        """Exact draws ``heads [*sample_shape, ..., N]`` (module docstring)."""
        shape = torch.Size(sample_shape) + self.batch_shape
        theta = self.theta.detach().expand(shape + (self.N, self.N))
        lengths = self.lengths.expand(shape)
        if self.projective:
            with torch.enable_grad():
                leaf = theta.clone().requires_grad_(True)
                log_z = _eisner_log_partition(leaf, lengths, self.single_root, "sample")
                (arcs,) = torch.autograd.grad(log_z.sum(), leaf)
            return arcs_to_heads(arcs, lengths)
        return self._sample_sequential(theta.clone(), lengths)

    def _sample_sequential(self, theta, lengths) -> torch.Tensor:
        N = self.N
        idx = torch.arange(N, device=theta.device)
        heads = idx.expand(theta.shape[:-1]).clone()
        real = idx < lengths.unsqueeze(-1)
        for m in range(N):
            mu = DependencyTree(theta, lengths, projective=False, single_root=self.single_root,
                                validate_args=False).marginals[..., :, m]
            probs = mu.clamp_min(0).reshape(-1, N)
            probs = torch.where(probs.sum(-1, keepdim=True) > 0, probs,
                                F.one_hot(torch.tensor(m, device=theta.device), N).to(probs))
            h = categorical_draws(probs, 1).view(mu.shape[:-1])
            h = torch.where(real[..., m], h, torch.full_like(h, m))
            heads[..., m] = h
            keep = idx == h.unsqueeze(-1)  # only the drawn head of m remains possible
            theta[..., :, m] = torch.where(keep | ~real[..., m:m + 1], theta[..., :, m],
                                           torch.full_like(theta[..., :, m], FLOOR))
        return heads

    def posterior(self, emission) -> DependencyTree:
        """p(z | x, y) for an emission that factors over arcs (:func:`tree_posterior`); the
        same member as the structure library's distributions."""
        return tree_posterior(self, emission)

    def marginal_log_likelihood(self, emission):
        """log p(y | x) = log Z(θ + φ) − log Z(θ) ``[...]`` (:func:`tree_log_likelihood`)."""
        return tree_log_likelihood(self, emission)

    def enumerate_support(self, expand: bool = True) -> torch.Tensor:
        """Every tree ``[n_trees, ..., N]`` (brute force; all rows of one length ≤ 7)."""
        lens = self.lengths.unique()
        if lens.numel() != 1:
            raise UserError("DependencyTree.enumerate_support needs every row of one length "
                            f"(got lengths {sorted(int(v) for v in lens)})")
        trees = enumerate_trees(int(lens[0]), self.N, projective=self.projective,
                                single_root=self.single_root)
        out = torch.as_tensor(trees, device=self.scores.device)
        out = out.view((-1,) + (1,) * len(self.batch_shape) + (self.N,))
        return out.expand((-1,) + self.batch_shape + (self.N,)) if expand else out


@register_kl(DependencyTree, DependencyTree)
def kl_dependency_tree(p: DependencyTree, q: DependencyTree) -> torch.Tensor:
    """KL(p ‖ q) = Σ_hm μ^p_hm (θ^p_hm − θ^q_hm) − log Z_p + log Z_q, exact, for trees of the
    same kind on the same lengths."""
    if (p.projective, p.single_root, p.N) != (q.projective, q.single_root, q.N):
        raise UserError("KL(DependencyTree ‖ DependencyTree) needs trees of the same kind "
                        f"(projective, single_root, N): {(p.projective, p.single_root, p.N)} "
                        f"vs {(q.projective, q.single_root, q.N)}")
    shape = torch.broadcast_shapes(p.batch_shape, q.batch_shape)
    if p.scores.device.type != "meta" and not torch.equal(p.lengths.expand(shape),
                                                          q.lengths.expand(shape)):
        raise UserError("KL(DependencyTree ‖ DependencyTree) needs the same lengths on both sides")
    return (p.marginals * (p.theta - q.theta)).sum((-1, -2)) - p.log_partition + q.log_partition


def tree_posterior(prior: DependencyTree, emission: torch.Tensor) -> DependencyTree:
    """p(z | x, y) for an emission that factors over arcs, log p(y | z, x) = Σ_{(h→m) ∈ z}
    emission[h, m] (``[..., N, N]``, the diagonal for root arcs): the tree of θ + φ."""
    return prior._same_kind(prior.theta + emission)


def tree_log_likelihood(prior: DependencyTree, emission: torch.Tensor) -> torch.Tensor:
    """log p(y | x) = log Σ_z p(z | x) p(y | z, x) = log Z(θ + φ) − log Z(θ) ``[...]`` for an
    emission that factors over arcs (see :func:`tree_posterior`); exact, differentiable."""
    return tree_posterior(prior, emission).log_partition - prior.log_partition
