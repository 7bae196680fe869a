"""``attend`` for NumPyro: the same signature and behaviour as :func:`ppl_attention.attend`,
writing the alignment as a ``numpyro.sample`` site. Works under ``jax.jit``: the shape checks are
static; the value checks (finite scores, a real position for every query) run only on concrete
arrays, since a traced array has no values to check.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro

from ..core.errors import NonFiniteScores, UserError
from ..core.records import AttendRecord, record, recording
from ..core.site_shapes import check_site_plates
from .families import Family, make_family

__all__ = ["attend", "broadcast_source_mask", "recording", "AttendRecord", "FAMILY_PARAM"]

#: the ``numpyro.param`` a family with parameters registers when ``attend`` is not given them
FAMILY_PARAM = "family"


def _concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def broadcast_source_mask(mask, scores, arg: str = "mask"):
    """``mask`` ([..., S] or [..., T or 1, S]) as a bool array of ``scores``' shape."""
    if mask is None:
        return jnp.ones(scores.shape, bool)
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        if _concrete(mask) and not bool(((mask == 0) | (mask == 1)).all()):
            raise UserError(f"{arg} must be boolean or 0/1, got values other than 0 and 1")
        mask = mask.astype(bool)
    given = list(mask.shape)
    if mask.ndim == scores.ndim - 1:
        mask = mask[..., None, :]
    try:
        mask = jnp.broadcast_to(mask, scores.shape)
    except ValueError:
        raise UserError(f"{arg} of shape {given} does not broadcast to scores "
                         f"{list(scores.shape)} (expected [..., S] or [..., T, S] with "
                         f"S={scores.shape[-1]})") from None
    if _concrete(mask):
        empty = ~mask.any(-1)
        if bool(empty.any()):
            raise UserError(f"{arg} hides every source position for {int(empty.sum())} "
                             f"querie(s); every query needs at least one unmasked position")
    return mask


def _check_inputs(scores, values) -> None:
    if scores.ndim < 2:
        raise UserError(f"scores must be [..., T, S], got shape {list(scores.shape)}")
    if values.ndim < 2:
        raise UserError(f"values must be [..., S, dv], got shape {list(values.shape)}")
    if scores.shape[-1] != values.shape[-2]:
        raise UserError(f"scores and values disagree on the source length S: scores "
                         f"{list(scores.shape)}, values {list(values.shape)}")
    if _concrete(scores) and not bool(jnp.isfinite(scores).all()):
        raise NonFiniteScores(f"scores must be finite (exclude positions with mask=, not with "
                              f"-inf); got {int((~jnp.isfinite(scores)).sum())} non-finite "
                              f"entries")


def _plates() -> list:
    """``(name, dim, size)`` of each plate around the call, read from NumPyro's handler stack
    (it has no public accessor; where a NumPyro version keeps it elsewhere, none: the check is
    then left to NumPyro's own broadcasting error)."""
    stack = getattr(numpyro.primitives, "_PYRO_STACK", ())
    return [(h.name, h.dim, h.subsample_size) for h in stack if isinstance(h, numpyro.plate)]


def attend(name: str, scores, values, family: Family | str | None = None, mask=None, *,
           guide: bool = False, keys=None, target_mask=None, scale=None, infer: dict | None = None,
           params=None, attention=None):
    """Attend with a latent alignment written as the NumPyro sample site ``name``.

    Arguments as :func:`ppl_attention.attend`, plus ``params``: the family's parameters (the
    BAM contextual prior network, a Markov chain's jumps, a CRF's transitions), which torch
    keeps inside the family module. Without them, a family that has parameters registers them
    itself as ``numpyro.param("family", family.init)`` — one set per model, shared by its
    sites, as a torch model's ``self.family`` is (a model with two such families passes
    ``params=`` itself). Returns ``(context [..., T, dv], weights)``. The caller declares the
    plates (``numpyro.plate("batch", B, dim=-2)``, ``numpyro.plate("target", T, dim=-1)``).
    Under :func:`recording` the call is recorded (:class:`AttendRecord`).
    """
    family = make_family(family)
    if not isinstance(name, str) or not name:
        raise UserError(f"name must be a non-empty string, got {name!r}")
    scores, values = jnp.asarray(scores), jnp.asarray(values)
    if family.tree:
        return _attend_tree(name, scores, values, family, mask, guide=guide, keys=keys,
                            target_mask=target_mask, scale=scale, infer=infer, params=params,
                            attention=attention)
    if attention is not None:
        raise UserError(f"attention= is for the tree families (their scores are arc scores); "
                        f"the {family.name!r} family takes its scores as scores")
    _check_inputs(scores, values)
    check_site_plates(name, tuple(scores.shape), _plates())
    mask = broadcast_source_mask(mask, scores)
    if keys is None:
        keys = values
    elif keys.shape[-2] != scores.shape[-1]:
        raise UserError(f"keys {list(keys.shape)} and scores {list(scores.shape)} disagree on "
                         f"the source length S")
    if params is None and family.has_parameters() and (not guide or family.deterministic):
        if getattr(family, "key_dim", 0) is None:  # a BAM prior network sized by the keys
            family.key_dim = keys.shape[-1]
        params = numpyro.param(FAMILY_PARAM, family.init)
    if guide:
        fn = family.posterior(scores, mask, values=values, scale=scale)
    else:
        fn = family.prior(scores, mask, keys=keys, values=values, params=params)
    if fn is None:
        weights = family.deterministic_weights(scores, mask, params)
        if not guide:
            numpyro.deterministic(name, weights)
        record(name, guide, scores, mask, weights, None, family)
        return weights @ values, weights
    if target_mask is not None:
        target_mask = jnp.asarray(target_mask).astype(bool)
        try:
            jnp.broadcast_to(target_mask, fn.batch_shape)
        except ValueError:
            raise UserError(f"target_mask of shape {list(target_mask.shape)} does not broadcast "
                             f"to the site's batch shape {list(fn.batch_shape)}") from None
        fn = fn.mask(target_mask)
    value = numpyro.sample(name, fn, infer=dict(infer) if infer else {})
    weights = family.weights(value, scores, mask)
    record(name, guide, scores, mask, weights, value, family)
    if getattr(family, "normalizes", False):  # BAM: attention = S / Σ S, 0 where masked
        return weights @ values, weights
    return family.context(value, values), weights


def _attend_tree(name, scores, values, family, mask, *, guide, keys, target_mask, scale, infer,
                 params, attention):
    """``attend`` for the tree families (:func:`ppl_attention.attend`'s tree path)."""
    for arg, given in (("target_mask", target_mask), ("scale", scale), ("keys", keys),
                       ("params", params)):
        if given is not None:
            raise UserError(f"{arg}= does not apply to the {family.name!r} family (its site is a "
                            f"tree per sentence or per query)")
    if scores.ndim < 3 or scores.shape[-1] != scores.shape[-2]:
        raise UserError(f"the {family.name!r} family takes arc scores [..., T or 1, S, S], got "
                        f"scores {list(scores.shape)}")
    S = scores.shape[-1]
    if values.ndim < 2 or values.shape[-2] != S:
        raise UserError(f"values {list(values.shape)} and arc scores {list(scores.shape)} "
                        f"disagree on the source length S={S}")
    mask = jnp.ones(values.shape[:-1], bool) if mask is None else jnp.asarray(mask).astype(bool)
    if mask.shape[-1] != S:
        raise UserError(f"mask {list(mask.shape)} does not end in the source length S={S}")
    weights = None
    if attention is not None:
        attention = jnp.asarray(attention)
        if attention.ndim != scores.ndim - 1 or attention.shape[-1] != S:
            raise UserError(f"attention {list(attention.shape)} must be the query's word scores "
                            f"[..., T, S] beside arc scores {list(scores.shape)}")
        _check_inputs(attention, values)
        weights = family.deterministic_weights(attention, broadcast_source_mask(mask, attention))
    if family.deterministic:
        value, arcs = None, family.tree_distribution(scores, mask).marginals
    else:
        tree = family.posterior(scores, mask) if guide else family.prior(scores, mask)
        value = numpyro.sample(name, tree, infer=dict(infer) if infer else {})
        arcs = family.arcs(value, scores.dtype)
    record(name, guide, scores, mask, weights, value, family)
    if weights is None:  # no query: the tree itself (heads, or the marginals)
        return None, (value if value is not None else arcs)
    return family.tree_context(arcs, values, weights), weights
