"""What an ``attend`` call leaves for the tools, on both backends: under :func:`recording`,
every ``attend`` (Pyro's :func:`ppl_attention.attend` or NumPyro's
:func:`ppl_attention.numpyro.attend`) appends an :class:`AttendRecord`; nothing is recorded
otherwise. Tools that need what a program attended to — the MAP alignment of a sampled family,
draws of attention weights in ``analyze`` — run a model or guide under it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

__all__ = ["AttendRecord", "recording", "record"]


@dataclass
class AttendRecord:
    """One ``attend`` call: the site ``name``, model or guide side, the ``scores`` and ``mask``
    ``[..., T, S]``, the returned ``weights`` and the site ``value`` (None when deterministic),
    and the ``family`` — arrays of the backend that ran it."""

    name: str
    guide: bool
    scores: object
    mask: object
    weights: object
    value: object | None
    family: object


_RECORDERS: list[list[AttendRecord]] = []


@contextlib.contextmanager
def recording():
    """``with recording() as calls:`` — every ``attend`` inside appends its
    :class:`AttendRecord` to ``calls``."""
    calls: list[AttendRecord] = []
    _RECORDERS.append(calls)
    try:
        yield calls
    finally:
        _RECORDERS.pop()


def record(*args) -> None:
    """Called by ``attend``: append a record when a :func:`recording` is active."""
    if _RECORDERS:
        _RECORDERS[-1].append(AttendRecord(*args))
