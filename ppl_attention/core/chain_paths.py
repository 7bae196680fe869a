"""Which path ``MonotonicAlignment`` takes under ``method="auto"`` — one rule for both backends.

On a CPU the banded sequential recursion (O(T·S·W) work) was faster than the parallel prefix
scan (O(T·S³) work, O(log T) depth) at every size measured (``benchmarks/structured.py``,
docs/results.md), long chains over few states included. On an accelerator the scan's depth is
expected to pay for chains of T ≥ 64 over up to 128 states (not yet measured on one)."""

from __future__ import annotations

__all__ = ["choose_path"]


def choose_path(T: int, S: int, accelerator: bool) -> str:
    """``"parallel"`` or ``"sequential"`` for a chain of T steps over S states."""
    if accelerator:
        return "parallel" if T >= 64 and S <= 128 else "sequential"
    return "sequential"
