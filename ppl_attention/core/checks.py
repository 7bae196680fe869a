"""Argument checks shared by both backends; each raises
:class:`~ppl_attention.core.errors.UserError`
naming the argument."""

from __future__ import annotations

import math

from .errors import UserError


def check_positive(name: str, value) -> float:
    """A finite number > 0, as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise UserError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_int(name: str, value, minimum: int) -> int:
    """An int ≥ ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"{name} must be an int ≥ {minimum}, got {value!r}")
    return value


def check_choice(name: str, value, choices) -> str:
    """One of ``choices``."""
    if value not in choices:
        raise UserError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value


def check_bool(name: str, value) -> bool:
    """True or False."""
    if not isinstance(value, bool):
        raise UserError(f"{name} must be true or false, got {value!r}")
    return value
