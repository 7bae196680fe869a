"""Which path ``MonotonicAlignment`` takes under ``method="auto"`` — one rule for both backends.

On a CPU the banded sequential recursion (O(T·S·W) work) was faster than the parallel prefix
scan (O(T·S³) work, O(log T) depth) at every size measured (``benchmarks/structured.py``,
docs/results.md), long chains over few states included. On an accelerator the rule comes from
the measurement ``benchmarks/gpu.py`` writes into ``gpu_rule.json`` beside this module (the
smallest T, per largest S, from which the scan was faster on that GPU); until a GPU has been
measured it is the unmeasured guess that the scan's depth pays for chains of T ≥ 64 over up to
128 states.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

__all__ = ["choose_path", "gpu_rule", "RULE_FILE", "UNMEASURED"]

RULE_FILE = Path(__file__).with_name("gpu_rule.json")
#: the rule before any GPU was measured: parallel for T ≥ min_T and S ≤ max_S
UNMEASURED = {"min_T": 64, "max_S": 128, "measured_on": None}


@functools.cache
def gpu_rule() -> dict:
    """``{"min_T", "max_S", "measured_on"}``: the measured rule, else :data:`UNMEASURED`."""
    try:
        rule = json.loads(RULE_FILE.read_text())
        return {"min_T": int(rule["min_T"]), "max_S": int(rule["max_S"]),
                "measured_on": rule.get("measured_on")}
    except (OSError, ValueError, KeyError, TypeError):
        return dict(UNMEASURED)


def choose_path(T: int, S: int, accelerator: bool) -> str:
    """``"parallel"`` or ``"sequential"`` for a chain of T steps over S states."""
    if accelerator:
        rule = gpu_rule()
        return "parallel" if T >= rule["min_T"] and S <= rule["max_S"] else "sequential"
    return "sequential"
