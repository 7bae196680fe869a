"""The check both backends' ``attend`` make of its scores against the plates around the call:
a site's batch shape is ``scores.shape[:-1]`` (all but the source axis), so each enclosing
plate's dim must there have the plate's size or 1. Scores of one row per sentence (``[B, S]``
where ``[B, T, S]`` was meant) are then refused naming the site, the scores' shape and the
plate, before the sampler's generic message."""

from __future__ import annotations

from .errors import UserError

__all__ = ["check_site_plates"]


def check_site_plates(name: str, scores_shape: tuple, plates) -> None:
    """``plates``: ``(plate name, dim, size)`` of each plate in context (dim < 0; None: no
    dim)."""
    batch = tuple(scores_shape[:-1])
    for plate, dim, size in plates:
        if dim is None or dim >= 0:
            continue
        have = batch[dim] if -dim <= len(batch) else 1
        if have not in (1, size):
            raise UserError(
                f"attend({name!r}): scores {list(scores_shape)} are [..., T, S], so the site's "
                f"batch shape is {list(batch)}, which has {have} at dim {dim} where plate "
                f"{plate!r} has size {size}: give one row of source scores per target position "
                f"(e.g. [B, T, S] under plates of B at dim -2 and T at dim -1)")
