"""``attend``: the one primitive that writes an attention alignment as a named Pyro sample site.

Tools that need to see what a model attended to — MAP alignments of a sampled family, posterior
draws of weights in ``analyze`` — run the model or guide under :func:`recording`, which collects
an :class:`AttendRecord` per ``attend`` call; nothing is recorded otherwise.

The checks that read the tensors' values (finite scores, a 0/1 mask, a position left for every
query) run while Pyro's validation is on, its default; ``pyro.enable_validation(False)`` skips
them, as it skips Pyro's own: each one waits for an accelerator, and a meta tensor has no values.
Shape checks always run.
"""

from __future__ import annotations

import pyro
import torch
from pyro.infer.util import is_validation_enabled

from ..core.errors import NonFiniteScores, UserError
from ..core.records import AttendRecord, record, recording
from ..core.site_shapes import check_site_plates
from .families import Family, make_family

__all__ = ["attend", "broadcast_source_mask", "recording", "AttendRecord"]


def _shape(t) -> list[int]:
    return list(t.shape)


def broadcast_source_mask(mask, scores: torch.Tensor, arg: str = "mask") -> torch.Tensor:
    """Return ``mask`` as a bool tensor of ``scores``' shape ``[..., T, S]``.

    ``mask`` may have scores' rank (``[..., T or 1, S]``) or one less (``[..., S]``: one source
    mask shared by all T queries, the usual padding mask ``[batch, S]``). Raises ``ValueError``
    when it does not broadcast, or (Pyro's validation on) when some query would have no position
    left to attend to.
    """
    if mask is None:
        return torch.ones(scores.shape, dtype=torch.bool, device=scores.device)
    mask = torch.as_tensor(mask, device=scores.device)
    if mask.dtype != torch.bool:
        if is_validation_enabled() and not ((mask == 0) | (mask == 1)).all():
            raise UserError(f"{arg} must be boolean or 0/1, got values other than 0 and 1")
        mask = mask.bool()
    given = _shape(mask)
    if mask.dim() == scores.dim() - 1:
        mask = mask.unsqueeze(-2)
    try:
        mask = mask.expand(scores.shape)
    except RuntimeError:
        raise UserError(
            f"{arg} of shape {given} does not broadcast to scores {_shape(scores)} "
            f"(expected [..., S] or [..., T, S] with S={scores.shape[-1]})"
        ) from None
    if not is_validation_enabled():
        return mask
    empty = ~mask.any(-1)
    if empty.any():
        first = [int(i) for i in empty.nonzero()[0]]
        raise UserError(
            f"{arg} hides every source position for {int(empty.sum())} querie(s) "
            f"(first at index {first} of scores {_shape(scores)}); every query needs at least "
            f"one unmasked position"
        )
    return mask


def _check_inputs(scores, values) -> None:
    if not isinstance(scores, torch.Tensor) or not isinstance(values, torch.Tensor):
        raise UserError(
            f"scores and values must be torch tensors, got {type(scores).__name__} and "
            f"{type(values).__name__}"
        )
    if scores.dim() < 2:
        raise UserError(f"scores must be [..., T, S], got shape {_shape(scores)}")
    if values.dim() < 2:
        raise UserError(f"values must be [..., S, dv], got shape {_shape(values)}")
    if scores.shape[-1] != values.shape[-2]:
        raise UserError(
            f"scores and values disagree on the source length S: scores {_shape(scores)} has "
            f"S={scores.shape[-1]}, values {_shape(values)} has S={values.shape[-2]}"
        )
    if not is_validation_enabled():
        return
    bad = ~torch.isfinite(scores)
    if bad.any():
        n_nan = int(torch.isnan(scores).sum())
        raise NonFiniteScores(
            f"scores must be finite: {n_nan} NaN and {int(bad.sum()) - n_nan} ±inf entries in "
            f"scores {_shape(scores)} (exclude positions with mask=, not with -inf)"
        )


def attend(
    name: str,
    scores: torch.Tensor,
    values: torch.Tensor,
    family: Family | str | None = None,
    mask: torch.Tensor | None = None,
    *,
    guide: bool = False,
    keys: torch.Tensor | None = None,
    target_mask: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    infer: dict | None = None,
    attention: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attend with a latent alignment written as the Pyro sample site ``name``.

    Args:
        name: the site name (unique in the trace, e.g. ``"align"`` inside a target plate or
            ``f"align_{t}"`` in a loop).
        scores: alignment logits ``[..., T, S]`` — in a model from the prior network, in a guide
            from the inference network.
        values: ``[..., S, dv]``, what the context averages or selects.
        family: a :class:`~ppl_attention.pyro.families.Family` (or its registry name); default Soft.
        mask: bool ``[..., S]`` or ``[..., T, S]``, False on padded source positions; those get
            exactly zero weight in every family.
        guide: False in a model (sample the family's prior p(z | x, y<t)); True in a guide
            (sample its posterior q(z | ·) from the guide's own ``scores``).
        keys: ``[..., S, dk]`` for the BAM contextual prior; defaults to ``values``.
        target_mask: bool ``[..., T]``, False on padded target positions: their log-probability
            is masked out (``dist.mask``), so they add nothing to the loss.
        scale: posterior standard deviation ``[..., T, dv]`` for ``GaussianContext`` guides.
        infer: Pyro's ``infer`` dict for the site, e.g. ``{"enumerate": "parallel"}``.
        attention: only for a tree family (``Tree``, ``TreeMarginals``): the query's word scores
            ``[..., T, S]``, while ``scores`` are then the tree's arc scores ``[..., 1, S, S]``
            (one tree per sentence: call ``attend`` inside the batch plate but outside the
            target plate) or ``[..., T, S, S]`` (one per query, inside both) — see
            :class:`~ppl_attention.pyro.families.Tree`. Without it, ``attend`` returns ``(None,
            tree)``: the sampled heads (the arc marginals for ``TreeMarginals``), for a guide
            or a model whose emission reads the tree itself.

    Returns:
        ``(context, weights)``: context ``[..., T, dv]`` (with enumeration dims on the left when
        the site is enumerated) and the weights the family defines — the soft weights
        ``[..., T, S]``, the sampled simplex point, or for ``Categorical`` the index z ``[..., T]``.

    The caller declares the plates: the distribution at the site has batch shape ``[..., T]``
    (``scores.shape[:-1]``), so enclose the call in plates for batch and target positions
    (e.g. ``pyro.plate("batch", B, dim=-2)`` and ``pyro.plate("target", T, dim=-1)``), which
    parallel enumeration and ``infer_discrete`` need.
    """
    family = make_family(family)
    if not isinstance(name, str) or not name:
        raise UserError(f"name must be a non-empty string, got {name!r}")
    if family.tree:
        return _attend_tree(name, scores, values, family, mask, guide=guide, keys=keys,
                            target_mask=target_mask, scale=scale, infer=infer,
                            attention=attention)
    if attention is not None:
        raise UserError(f"attention= is for the tree families (their scores are arc scores); "
                        f"the {family.name!r} family takes its scores as scores")
    _check_inputs(scores, values)
    check_site_plates(name, tuple(scores.shape),
                      [(f.name, f.dim, f.size) for f in pyro.poutine.runtime.get_plates()])
    mask = broadcast_source_mask(mask, scores)
    if keys is None:
        keys = values
    elif keys.shape[-2] != scores.shape[-1]:
        raise UserError(
            f"keys {_shape(keys)} and scores {_shape(scores)} disagree on the source length S"
        )
    if guide:
        fn = family.posterior(scores, mask, values=values, scale=scale)
    else:
        fn = family.prior(scores, mask, keys=keys, values=values)

    if fn is None:
        weights = family.deterministic_weights(scores, mask)
        if not guide:
            pyro.deterministic(name, weights, event_dim=1)
        record(name, guide, scores, mask, weights, None, family)
        return weights @ values, weights

    if target_mask is not None:
        target_mask = torch.as_tensor(target_mask, device=scores.device).bool()
        try:
            target_mask.expand(fn.batch_shape)
        except RuntimeError:
            raise UserError(
                f"target_mask of shape {_shape(target_mask)} does not broadcast to the site's "
                f"batch shape {list(fn.batch_shape)} (scores {_shape(scores)} without S)"
            ) from None
        fn = fn.mask(target_mask)
    value = pyro.sample(name, fn, infer=dict(infer) if infer else {})
    weights = family.weights(value, scores, mask)
    record(name, guide, scores, mask, weights, value, family)
    if family.normalizes:  # BAM: attention = S / Σ S, 0 where masked
        return weights @ values, weights
    return family.context(value, values), weights


def _attend_tree(name, scores, values, family, mask, *, guide, keys, target_mask, scale, infer,
                 attention):
    """``attend`` for the tree families (see :class:`~ppl_attention.pyro.families.Tree`)."""
    for arg, given in (("target_mask", target_mask), ("scale", scale), ("keys", keys)):
        if given is not None:
            raise UserError(f"{arg}= does not apply to the {family.name!r} family (its site is a "
                            f"tree per sentence or per query)")
    if not isinstance(scores, torch.Tensor) or not isinstance(values, torch.Tensor):
        raise UserError("scores and values must be torch tensors")
    if scores.dim() < 3 or scores.shape[-1] != scores.shape[-2]:
        raise UserError(f"the {family.name!r} family takes arc scores [..., T or 1, S, S], got "
                        f"scores {_shape(scores)}")
    S = scores.shape[-1]
    if values.dim() < 2 or values.shape[-2] != S:
        raise UserError(f"values {_shape(values)} and arc scores {_shape(scores)} disagree on "
                        f"the source length S={S}")
    if mask is None:
        mask = torch.ones(values.shape[:-1], dtype=torch.bool, device=scores.device)
    mask = torch.as_tensor(mask, device=scores.device).bool()
    if mask.shape[-1] != S:
        raise UserError(f"mask {_shape(mask)} does not end in the source length S={S}")
    weights = None
    if attention is not None:
        if attention.dim() != scores.dim() - 1 or attention.shape[-1] != S:
            raise UserError(f"attention {_shape(attention)} must be the query's word scores "
                            f"[..., T, S] beside arc scores {_shape(scores)}")
        _check_inputs(attention, values)
        weights = family.deterministic_weights(attention, broadcast_source_mask(mask, attention))
    if family.deterministic:  # TreeMarginals: the exact arc marginals, nothing sampled
        value, arcs = None, family.tree_distribution(scores, mask).marginals
    else:
        tree = family.posterior(scores, mask) if guide else family.prior(scores, mask)
        value = pyro.sample(name, tree, infer=dict(infer) if infer else {})
        arcs = family.arcs(value, scores.dtype)
    record(name, guide, scores, mask, weights, value, family)
    if weights is None:  # no query: the tree itself (heads, or the marginals)
        return None, (value if value is not None else arcs)
    return family.tree_context(arcs, values, weights), weights
