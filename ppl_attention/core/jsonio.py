"""Strict JSON for everything the package writes: ``NaN`` and ``Infinity`` are not JSON, so a
number that is not finite is written ``null`` (the figures a run reports are checked finite
before they are written — :mod:`ppl_attention.core.divergence`; what may legitimately be
undefined, as a Pareto k̂ of too few draws or the R-hat of a chain that never moved, says so in
its docs)."""

from __future__ import annotations

import json
import math

__all__ = ["dumps", "plain"]


def plain(obj):
    """``obj`` with every non-finite float replaced by None and NumPy scalars and arrays made
    plain Python (recursively through dicts, lists and tuples)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    tolist = getattr(obj, "tolist", None)  # a NumPy / JAX scalar or array
    if callable(tolist) and type(obj).__module__.split(".")[0] in ("numpy", "jax", "jaxlib"):
        return plain(tolist())
    return obj


def dumps(obj, **kwargs) -> str:
    """``json.dumps`` of :func:`plain` ``(obj)``, refusing anything that is still not JSON."""
    return json.dumps(plain(obj), allow_nan=False, **kwargs)
