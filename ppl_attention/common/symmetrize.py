"""Symmetrization of two directional word alignments (Och & Ney 2003; Koehn, Och & Marcu 2003):
``forward`` aligns each target word to at most one source word, ``reverse`` each source word
to at most one target word; both are given as (source i, target j) links of the same pair.

- ``intersection``: A = F ∩ R (high precision);
- ``union``: F ∪ R (high recall);
- ``grow-diag``: from the intersection, repeatedly add a union link next to (also
  diagonally) a link of A whose source or target word is still unaligned;
- ``grow-diag-final``: then add any directional link whose source *or* target word is
  unaligned;
- ``grow-diag-final-and``: then add a directional link whose source *and* target word are
  both unaligned (Moses' default, and the usual choice with fast_align and eflomal).
"""

from __future__ import annotations

from ..core.errors import UserError

__all__ = ["HEURISTICS", "symmetrize", "symmetrize_corpus"]

Links = set[tuple[int, int]]
NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def _grow_diag(forward: Links, reverse: Links) -> tuple[Links, set, set]:
    a = forward & reverse
    candidates = (forward | reverse) - a  # the union's links not (yet) in A
    src = {i for i, _ in a}
    tgt = {j for _, j in a}
    added = bool(candidates)
    while added:
        added = False
        for i, j in sorted(a):
            for di, dj in NEIGHBOURS:
                link = (i + di, j + dj)
                if link in candidates and (link[0] not in src or link[1] not in tgt):
                    a.add(link)
                    candidates.discard(link)
                    src.add(link[0])
                    tgt.add(link[1])
                    added = True
            if not candidates:
                return a, src, tgt
    return a, src, tgt


def _final(a: Links, src: set, tgt: set, forward: Links, reverse: Links, both: bool) -> Links:
    for direction in (forward, reverse):
        for i, j in sorted(direction - a, key=lambda link: (link[1], link[0])):
            free = (i not in src and j not in tgt) if both else (i not in src or j not in tgt)
            if free:
                a.add((i, j))
                src.add(i)
                tgt.add(j)
    return a


def symmetrize(forward: Links, reverse: Links, heuristic: str = "grow-diag-final-and") -> Links:
    """The symmetrized links of one sentence pair (module docstring)."""
    forward, reverse = set(forward), set(reverse)
    if heuristic == "intersection":
        return forward & reverse
    if heuristic == "union":
        return forward | reverse
    if heuristic not in HEURISTICS:
        raise UserError(f"unknown symmetrization {heuristic!r}; valid: {', '.join(HEURISTICS)}")
    a, src, tgt = _grow_diag(forward, reverse)
    if heuristic == "grow-diag":
        return a
    return _final(a, src, tgt, forward, reverse, both=heuristic == "grow-diag-final-and")


HEURISTICS = ("intersection", "union", "grow-diag", "grow-diag-final", "grow-diag-final-and")


def symmetrize_corpus(forward: list[Links], reverse: list[Links],
                      heuristic: str = "grow-diag-final-and") -> list[Links]:
    if len(forward) != len(reverse):
        raise UserError(f"{len(forward)} forward alignments but {len(reverse)} reverse ones")
    return [symmetrize(f, r, heuristic) for f, r in zip(forward, reverse)]
