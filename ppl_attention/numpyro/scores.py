"""Alignment scores for the NumPyro mirror: the same names, shapes and maths as
:mod:`ppl_attention.pyro.scores`, as stateless objects over parameter dicts keyed like the torch
modules' ``state_dict()`` (``"W.weight"``, ``"U.weight"``, ``"v.weight"``, …).

``score = AdditiveScore(dq, dk); params = score.init(key); e = score(params, queries, keys)``:
queries ``[..., T, dq]``, keys ``[..., S, dk]`` → scores ``[..., T, S]`` (multi-head:
``[..., H, T, S]``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ..core.errors import UserError
from .nn import Params, init_linear, linear

__all__ = ["AdditiveScore", "BilinearScore", "DotScore", "ScaledDotScore", "MultiHeadScore",
           "BiaffineArcScore", "SCORES", "make_score"]


def _check_qk(queries, keys, dq, dk) -> None:
    if queries.ndim < 2 or keys.ndim < 2:
        raise UserError(
            f"queries and keys need at least 2 dims ([..., T, dq] and [..., S, dk]); "
            f"got queries {list(queries.shape)} and keys {list(keys.shape)}")
    if dq is not None and queries.shape[-1] != dq:
        raise UserError(f"queries: last dim should be {dq}, got shape {list(queries.shape)}")
    if dk is not None and keys.shape[-1] != dk:
        raise UserError(f"keys: last dim should be {dk}, got shape {list(keys.shape)}")


class AdditiveScore:
    """``e_ts = vᵀ tanh(W q_t + U k_s + b)`` (Bahdanau et al. 2015, eq. 6)."""

    def __init__(self, query_dim: int, key_dim: int, hidden: int | None = None):
        self.query_dim, self.key_dim = query_dim, key_dim
        self.hidden = hidden or max(query_dim, key_dim)

    def init(self, key) -> Params:
        k1, k2, k3 = jax.random.split(key, 3)
        return {**init_linear(k1, "W", self.query_dim, self.hidden),
                **init_linear(k2, "U", self.key_dim, self.hidden, bias=False),
                **init_linear(k3, "v", self.hidden, 1, bias=False)}

    def __call__(self, params: Params, queries, keys):
        _check_qk(queries, keys, self.query_dim, self.key_dim)
        return self.from_projected(params, queries, self.project_keys(params, keys))

    def project_keys(self, params: Params, keys):
        """U k_s ``[..., S, h]``: the keys-only part, computed once per source by a decoder."""
        return linear(params, "U", keys)

    def from_projected(self, params: Params, queries, projected):
        wq = linear(params, "W", queries)[..., :, None, :]
        return linear(params, "v", jnp.tanh(wq + projected[..., None, :, :]))[..., 0]


class BilinearScore:
    """``e_ts = q_tᵀ W k_s`` (Luong et al. 2015, "general")."""

    def __init__(self, query_dim: int, key_dim: int):
        self.query_dim, self.key_dim = query_dim, key_dim

    def init(self, key) -> Params:
        return init_linear(key, "W", self.key_dim, self.query_dim, bias=False)

    def __call__(self, params: Params, queries, keys):
        _check_qk(queries, keys, self.query_dim, self.key_dim)
        return self.from_projected(params, queries, self.project_keys(params, keys))

    def project_keys(self, params: Params, keys):
        return linear(params, "W", keys)

    def from_projected(self, params: Params, queries, projected):
        return queries @ jnp.swapaxes(projected, -1, -2)


class DotScore:
    """``e_ts = q_tᵀ k_s`` (no parameters)."""

    def __init__(self, query_dim: int | None = None, key_dim: int | None = None):
        if query_dim is not None and key_dim is not None and query_dim != key_dim:
            raise UserError(f"dot score needs query_dim == key_dim, got {query_dim} and {key_dim}")
        self.query_dim, self.key_dim = query_dim, key_dim

    def init(self, key) -> Params:
        return {}

    def __call__(self, params: Params, queries, keys):
        _check_qk(queries, keys, self.query_dim, self.key_dim)
        if queries.shape[-1] != keys.shape[-1]:
            raise UserError(f"dot score needs equal query and key sizes: queries "
                             f"{list(queries.shape)}, keys {list(keys.shape)}")
        return self.from_projected(params, queries, keys)

    def project_keys(self, params: Params, keys):
        return keys

    def from_projected(self, params: Params, queries, projected):
        return queries @ jnp.swapaxes(projected, -1, -2)


class ScaledDotScore(DotScore):
    """``e_ts = q_tᵀ k_s / √d`` (Vaswani et al. 2017, eq. 1)."""

    def from_projected(self, params: Params, queries, projected):
        return super().from_projected(params, queries, projected) / math.sqrt(queries.shape[-1])


class MultiHeadScore:
    """H heads of scaled dot product on projections ``Wq``, ``Wk`` → ``[..., H, T, S]``."""

    def __init__(self, query_dim: int, key_dim: int, heads: int = 4, model_dim: int | None = None):
        model_dim = model_dim or query_dim
        if heads < 1 or model_dim % heads:
            raise UserError(f"model_dim={model_dim} must be a positive multiple of heads={heads}")
        self.query_dim, self.key_dim, self.heads = query_dim, key_dim, heads
        self.model_dim, self.head_dim = model_dim, model_dim // heads

    def init(self, key) -> Params:
        k1, k2 = jax.random.split(key)
        return {**init_linear(k1, "Wq", self.query_dim, self.model_dim, bias=False),
                **init_linear(k2, "Wk", self.key_dim, self.model_dim, bias=False)}

    def _split(self, x):
        x = x.reshape(*x.shape[:-1], self.heads, self.head_dim)
        return jnp.moveaxis(x, -2, -3)

    def __call__(self, params: Params, queries, keys):
        _check_qk(queries, keys, self.query_dim, self.key_dim)
        return self.from_projected(params, queries, self.project_keys(params, keys))

    def project_keys(self, params: Params, keys):
        """Per-head key projections ``[..., H, S, d_h]``."""
        return self._split(linear(params, "Wk", keys))

    def from_projected(self, params: Params, queries, projected):
        q = self._split(linear(params, "Wq", queries))
        return q @ jnp.swapaxes(projected, -1, -2) / math.sqrt(self.head_dim)


class BiaffineArcScore:
    """Arc log-potentials of a dependency tree
    (:class:`ppl_attention.pyro.scores.BiaffineArcScore`):
    θ_hm = a_hᵀ U d_m + uᵀ a_h, θ_mm = rᵀ d_m; with queries, head and root tilts per query.
    Params ``head.*``, ``dep.*``, ``U``, ``u``, ``root`` (``Wq.weight``, ``Wr.weight``)."""

    def __init__(self, key_dim: int, hidden: int | None = None, query_dim: int | None = None):
        self.key_dim, self.query_dim = key_dim, query_dim
        self.hidden = hidden or key_dim

    def init(self, key) -> Params:
        k1, k2, k3, k4 = jax.random.split(key, 4)
        h = self.hidden
        p = {**init_linear(k1, "head", self.key_dim, h), **init_linear(k2, "dep", self.key_dim, h),
             "U": jnp.zeros((h, h)), "u": jnp.zeros((h,)), "root": jnp.zeros((h,))}
        if self.query_dim is not None:
            p.update({**init_linear(k3, "Wq", self.query_dim, h, bias=False),
                      **init_linear(k4, "Wr", self.query_dim, h, bias=False)})
        return p

    def __call__(self, params: Params, keys, queries=None):
        _check_qk(keys, keys, self.key_dim, self.key_dim)
        a = jax.nn.relu(linear(params, "head", keys))
        d = jax.nn.relu(linear(params, "dep", keys))
        arcs = (a @ params["U"]) @ jnp.swapaxes(d, -1, -2) + (a @ params["u"])[..., :, None]
        root = d @ params["root"]
        S = keys.shape[-2]
        eye = jnp.eye(S, dtype=bool)
        if queries is None:
            return jnp.where(eye, root[..., None, :], arcs)
        if self.query_dim is None:
            raise UserError("BiaffineArcScore was built without query_dim; queries do not apply")
        _check_qk(queries, keys, self.query_dim, self.key_dim)
        head_tilt = linear(params, "Wq", queries) @ jnp.swapaxes(a, -1, -2)  # [..., T, S(h)]
        root_tilt = linear(params, "Wr", queries) @ jnp.swapaxes(d, -1, -2)  # [..., T, S(m)]
        arcs = arcs[..., None, :, :] + head_tilt[..., :, :, None]
        return jnp.where(eye, (root[..., None, :] + root_tilt)[..., :, None, :], arcs)


SCORES = {"additive": AdditiveScore, "bilinear": BilinearScore, "dot": DotScore,
          "scaled-dot": ScaledDotScore, "multi-head": MultiHeadScore}


def make_score(name: str, query_dim: int, key_dim: int, **kwargs):
    try:
        cls = SCORES[name]
    except KeyError:
        raise UserError(f"unknown score {name!r}; valid: {', '.join(SCORES)}") from None
    return cls(query_dim, key_dim, **kwargs)
