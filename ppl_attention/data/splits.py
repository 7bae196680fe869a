"""A split of a data set and a task (three splits), shared by the built-in tasks and corpora."""

from __future__ import annotations

from dataclasses import dataclass, field

from .corpus import Pair

__all__ = ["Links", "Split", "Task"]

Links = set[tuple[int, int]]


@dataclass
class Split:
    pairs: list[Pair]
    gold: list[Links]
    log_likelihood: list[float] | None = None  # exact log p(y | x) per pair, where known
    trees: list[list[int]] | None = None  # gold dependency tree of each source (heads), if any
    decode_metrics: bool = False  # score greedy decoding (prefix and sequence accuracy)
    possible: list[Links] | None = None  # possible gold links (⊇ gold, the sure ones), if any
    segments: bool = False  # each target token's gold links are one source segment (phrases)
    frames: bool = False  # each target frame has one gold source label (durations)


@dataclass
class Task:
    name: str
    train: Split
    valid: Split
    test: Split
    config: dict = field(default_factory=dict)
