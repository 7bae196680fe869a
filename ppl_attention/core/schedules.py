"""Schedules both training loops share: the learning rate, the KL weight of annealed methods,
and which batch a step trains on."""

from __future__ import annotations

import math
import random

__all__ = ["LR_SCHEDULES", "SPANS_STEPS", "kl_annealing", "batch_order"]

#: lr multiplier at ``step`` of ``steps``: constant, or ½(1 + cos(π·step/steps)) (cosine)
LR_SCHEDULES = {
    "constant": lambda step, steps: 1.0,
    "cosine": lambda step, steps: 0.5 * (1.0 + math.cos(math.pi * step / max(1, steps))),
}

#: the schedules that are a function of the run's total steps (a resumed run must keep them)
SPANS_STEPS = frozenset({"cosine"})


def kl_annealing(step: int, rho: float | None, weight: float = 1.0) -> float:
    """The KL weight η·λ(t) of the alignment sites at ``step``: λ(t) = sigmoid(t·ρ − 6) (BAM's
    annealing, ≈ 0.0025 at t = 0) when ``rho`` is given, else 1; η = ``weight``."""
    if rho is None:
        return weight
    return weight / (1.0 + math.exp(-(step * rho - 6.0)))


def batch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The order of ``n`` batches in ``epoch``: a function of (seed, epoch) alone, so a resumed
    run trains on the same batch at every step."""
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order
