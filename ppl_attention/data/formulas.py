"""``--task trees``: tree transduction (Kim et al. 2017, §4.1) — random arithmetic formulas over
``+``, ``*`` and the numbers 0–20, read in prefix notation and written in infix notation with
every operation parenthesized:

    source  + * 3 4 5          target  ( ( 3 * 4 ) + 5 )

A formula of depth D has D operators on its deepest path (``--depth D``, 2–6): the first operator
is forced down one random side to depth D, every other operand is a number with probability
½ and another operation otherwise (while depth remains). The gold dependency tree of a source
has each operator heading its two operands and the outermost operator hanging from the root;
the gold links align each target number and operator to its source token, and each parenthesis
to the operator it encloses.
"""

from __future__ import annotations

import random

from ..core.errors import UserError
from .splits import Split, Task

__all__ = ["trees_task", "formula", "DEPTHS"]

DEPTHS = range(1, 9)
OPERATORS = ("+", "*")


def formula(rng: random.Random, depth: int) -> tuple:
    """A random formula of exactly ``depth`` operators on its deepest path, as a nested tuple
    ``(op, left, right)`` with int leaves."""

    def grow(d: int, deep: bool):
        if d == 0 or (not deep and rng.random() < 0.5):
            return rng.randint(0, 20)
        side = rng.randrange(2) if deep else -1
        kids = [grow(d - 1, deep and i == side) for i in range(2)]
        return (rng.choice(OPERATORS), kids[0], kids[1])

    return grow(depth, True)


def _prefix(node, tokens: list, heads: list, head: int | None) -> None:
    """Append the prefix tokens of ``node`` with their heads (the index of the operator each
    hangs from; the outermost operator its own index)."""
    me = len(tokens)
    tokens.append(str(node if isinstance(node, int) else node[0]))
    heads.append(me if head is None else head)
    if not isinstance(node, int):
        _prefix(node[1], tokens, heads, me)
        _prefix(node[2], tokens, heads, me)


def _infix(node, counter: list, out: list, links: set) -> None:
    """Append the infix tokens of ``node`` and their links (source index, target index);
    ``counter`` walks the prefix order in step with :func:`_prefix`."""
    me = counter[0]
    counter[0] += 1
    if isinstance(node, int):
        links.add((me, len(out)))
        out.append(str(node))
        return
    links.add((me, len(out)))
    out.append("(")
    _infix(node[1], counter, out, links)
    links.add((me, len(out)))
    out.append(node[0])
    _infix(node[2], counter, out, links)
    links.add((me, len(out)))
    out.append(")")


def trees_task(n_train: int = 10_000, n_eval: int = 500, seed: int = 0, depth: int = 4) -> Task:
    """The task of the module docstring at one ``depth``: pairs, gold links, gold trees."""
    if isinstance(depth, bool) or not isinstance(depth, int) or depth not in DEPTHS:
        raise UserError(f"--depth must be an int from {DEPTHS.start} to {DEPTHS.stop - 1}, got "
                        f"{depth!r}")

    def split(n: int, part: str) -> Split:
        rng = random.Random(f"trees/{depth}/{seed}/{part}")
        pairs, gold, trees = [], [], []
        for _ in range(n):
            f = formula(rng, depth)
            src, heads = [], []
            _prefix(f, src, heads, None)
            tgt, links = [], set()
            _infix(f, [0], tgt, links)
            pairs.append((src, tgt))
            gold.append(links)
            trees.append(heads)
        return Split(pairs, gold, trees=trees, decode_metrics=True)

    return Task("trees", split(n_train, "train"), split(n_eval, "valid"), split(n_eval, "test"),
                {"depth": depth, "seed": seed})
