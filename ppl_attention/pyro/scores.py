"""Alignment scores: queries ``[..., T, dq]`` and keys ``[..., S, dk]`` → logits ``[..., T, S]``.

Every module here is a plain ``torch.nn.Module``; the families in :mod:`ppl_attention.pyro.families`
turn the logits into a distribution over where to attend.

=============  ==========================================  ==============================
name           score e(q_t, k_s)                           reference
=============  ==========================================  ==============================
``additive``   vᵀ tanh(W q_t + U k_s + b)                  Bahdanau et al. 2015, eq. (6)
``bilinear``   q_tᵀ W k_s                                  Luong et al. 2015 ("general")
``dot``        q_tᵀ k_s                                    Luong et al. 2015 ("dot")
``scaled-dot`` q_tᵀ k_s / √d                               Vaswani et al. 2017, eq. (1)
``multi-head`` H heads of scaled dot on projections        Vaswani et al. 2017, §3.2.2
=============  ==========================================  ==============================

Arc scores of a dependency tree over the keys (the ``tree`` families): :class:`BiaffineArcScore`,
keys ``[..., S, dk]`` (and optionally queries ``[..., T, dq]``) → ``[..., S, S]`` (``[..., T, S,
S]``), the biaffine scorer of Dozat & Manning (2017) with the root arcs on the diagonal.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..core.errors import UserError

__all__ = [
    "AdditiveScore",
    "BilinearScore",
    "DotScore",
    "ScaledDotScore",
    "MultiHeadScore",
    "BiaffineArcScore",
    "SCORES",
    "make_score",
]


def _check_qk(queries: torch.Tensor, keys: torch.Tensor, dq: int | None, dk: int | None) -> None:
    if queries.dim() < 2 or keys.dim() < 2:
        raise UserError(
            f"queries and keys need at least 2 dims ([..., T, dq] and [..., S, dk]); "
            f"got queries {list(queries.shape)} and keys {list(keys.shape)}"
        )
    if dq is not None and queries.shape[-1] != dq:
        raise UserError(f"queries: last dim should be {dq}, got shape {list(queries.shape)}")
    if dk is not None and keys.shape[-1] != dk:
        raise UserError(f"keys: last dim should be {dk}, got shape {list(keys.shape)}")


class AdditiveScore(nn.Module):
    """Bahdanau's additive score ``e_ts = vᵀ tanh(W q_t + U k_s + b)``.

    Shapes: queries ``[..., T, dq]``, keys ``[..., S, dk]`` → scores ``[..., T, S]``.
    Memory is O(T·S·hidden) for the broadcast sum.
    """

    def __init__(self, query_dim: int, key_dim: int, hidden: int | None = None):
        super().__init__()
        hidden = hidden or max(query_dim, key_dim)
        self.query_dim, self.key_dim = query_dim, key_dim
        self.W = nn.Linear(query_dim, hidden, bias=True)
        self.U = nn.Linear(key_dim, hidden, bias=False)
        self.v = nn.Linear(hidden, 1, bias=False)

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        _check_qk(queries, keys, self.query_dim, self.key_dim)
        return self.from_projected(queries, self.project_keys(keys))

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """U k_s ``[..., S, h]``: the part of the score that depends on the keys alone, computed
        once per source when a decoder scores one query a step."""
        return self.U(keys)

    def from_projected(self, queries: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        """Scores ``[..., T, S]`` from queries and :meth:`project_keys`'s output."""
        wq = self.W(queries).unsqueeze(-2)  # [..., T, 1, h]
        return self.v(torch.tanh(wq + projected.unsqueeze(-3))).squeeze(-1)


class BilinearScore(nn.Module):
    """Luong's "general" score ``e_ts = q_tᵀ W k_s``.

    Shapes: queries ``[..., T, dq]``, keys ``[..., S, dk]`` → scores ``[..., T, S]``.
    """

    def __init__(self, query_dim: int, key_dim: int):
        super().__init__()
        self.query_dim, self.key_dim = query_dim, key_dim
        self.W = nn.Linear(key_dim, query_dim, bias=False)

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        _check_qk(queries, keys, self.query_dim, self.key_dim)
        return self.from_projected(queries, self.project_keys(keys))

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """W k_s ``[..., S, dq]``."""
        return self.W(keys)

    def from_projected(self, queries: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        return queries @ projected.transpose(-1, -2)


class DotScore(nn.Module):
    """Luong's dot score ``e_ts = q_tᵀ k_s`` (needs ``dq == dk``; no parameters)."""

    def __init__(self, query_dim: int | None = None, key_dim: int | None = None):
        super().__init__()
        if query_dim is not None and key_dim is not None and query_dim != key_dim:
            raise UserError(f"dot score needs query_dim == key_dim, got {query_dim} and {key_dim}")
        self.query_dim, self.key_dim = query_dim, key_dim

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        _check_qk(queries, keys, self.query_dim, self.key_dim)
        if queries.shape[-1] != keys.shape[-1]:
            raise UserError(
                f"dot score needs equal query and key sizes: queries {list(queries.shape)}, "
                f"keys {list(keys.shape)}"
            )
        return self.from_projected(queries, keys)

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        return keys

    def from_projected(self, queries: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        return queries @ projected.transpose(-1, -2)


class ScaledDotScore(DotScore):
    """Scaled dot-product score ``e_ts = q_tᵀ k_s / √d`` (Vaswani et al. 2017, eq. 1)."""

    def from_projected(self, queries: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        return super().from_projected(queries, projected) / math.sqrt(queries.shape[-1])


class MultiHeadScore(nn.Module):
    """H heads of scaled dot product on learned projections.

    ``e^h_ts = (W^h_q q_t)ᵀ (W^h_k k_s) / √d_h`` with ``d_h = model_dim / heads``.
    Shapes: queries ``[..., T, dq]``, keys ``[..., S, dk]`` → scores ``[..., H, T, S]``.
    """

    def __init__(self, query_dim: int, key_dim: int, heads: int = 4, model_dim: int | None = None):
        super().__init__()
        model_dim = model_dim or query_dim
        if heads < 1 or model_dim % heads:
            raise UserError(f"model_dim={model_dim} must be a positive multiple of heads={heads}")
        self.query_dim, self.key_dim, self.heads = query_dim, key_dim, heads
        self.head_dim = model_dim // heads
        self.Wq = nn.Linear(query_dim, model_dim, bias=False)
        self.Wk = nn.Linear(key_dim, model_dim, bias=False)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(*x.shape[:-1], self.heads, self.head_dim)
        return x.movedim(-2, -3)  # [..., H, L, d_h]

    def forward(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        _check_qk(queries, keys, self.query_dim, self.key_dim)
        return self.from_projected(queries, self.project_keys(keys))

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """Per-head key projections ``[..., H, S, d_h]``."""
        return self._split(self.Wk(keys))

    def from_projected(self, queries: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        q = self._split(self.Wq(queries))
        return q @ projected.transpose(-1, -2) / math.sqrt(self.head_dim)


class BiaffineArcScore(nn.Module):
    """Arc log-potentials of a dependency tree from the source encodings (Dozat & Manning 2017,
    eq. 4), optionally tilted by a query:

        θ_hm = a_hᵀ U d_m + uᵀ a_h   (h ≠ m),      θ_mm = rᵀ d_m   (the arc root → m),

    with head and dependent views a_h = relu(W_a k_h + b_a), d_m = relu(W_d k_m + b_d) ``[..., S,
    hidden]``. With ``queries [..., T, dq]`` (``query_dim`` set) each query adds its own head and
    root preferences, θ_t,hm += (W_q q_t)ᵀ a_h and θ_t,mm += (W_r q_t)ᵀ d_m, giving one tree per
    query ``[..., T, S, S]``; without, one tree per source ``[..., S, S]``.
    """

    def __init__(self, key_dim: int, hidden: int | None = None, query_dim: int | None = None):
        super().__init__()
        hidden = hidden or key_dim
        self.key_dim, self.query_dim, self.hidden = key_dim, query_dim, hidden
        self.head = nn.Linear(key_dim, hidden)
        self.dep = nn.Linear(key_dim, hidden)
        self.U = nn.Parameter(torch.zeros(hidden, hidden))
        self.u = nn.Parameter(torch.zeros(hidden))
        self.root = nn.Parameter(torch.zeros(hidden))
        if query_dim is not None:
            self.Wq = nn.Linear(query_dim, hidden, bias=False)
            self.Wr = nn.Linear(query_dim, hidden, bias=False)

    def forward(self, keys: torch.Tensor, queries: torch.Tensor | None = None) -> torch.Tensor:
        _check_qk(keys, keys, self.key_dim, self.key_dim)
        a, d = torch.relu(self.head(keys)), torch.relu(self.dep(keys))  # [..., S, h]
        arcs = (a @ self.U) @ d.transpose(-1, -2) + (a @ self.u).unsqueeze(-1)  # [..., S(h), S(m)]
        root = d @ self.root  # [..., S]
        if queries is None:
            return arcs.diagonal_scatter(root, 0, -2, -1)
        if self.query_dim is None:
            raise UserError("BiaffineArcScore was built without query_dim; queries do not apply")
        _check_qk(queries, keys, self.query_dim, self.key_dim)
        head_tilt = self.Wq(queries) @ a.transpose(-1, -2)  # [..., T, S(h)]
        root_tilt = self.Wr(queries) @ d.transpose(-1, -2)  # [..., T, S(m)]
        arcs = arcs.unsqueeze(-3) + head_tilt.unsqueeze(-1)
        return arcs.diagonal_scatter(root.unsqueeze(-2) + root_tilt, 0, -2, -1)


SCORES = {
    "additive": AdditiveScore,
    "bilinear": BilinearScore,
    "dot": DotScore,
    "scaled-dot": ScaledDotScore,
    "multi-head": MultiHeadScore,
}


def make_score(name: str, query_dim: int, key_dim: int, **kwargs) -> nn.Module:
    """Build a score module by its registry name (``additive``, ``bilinear``, ``dot``, ...)."""
    try:
        cls = SCORES[name]
    except KeyError:
        raise UserError(f"unknown score {name!r}; valid: {', '.join(SCORES)}") from None
    return cls(query_dim, key_dim, **kwargs)
