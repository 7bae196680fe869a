"""Pure metrics on plain Python data (no torch, no Pyro)."""

from __future__ import annotations

Links = set[tuple[int, int]]


def aer(predicted: list[Links], sure: list[Links], possible: list[Links] | None = None) -> float:
    """Alignment error rate (Och & Ney 2003): 1 − (|A∩S| + |A∩P|) / (|A| + |S|), P ⊇ S.

    With no separate possible links (P = S) this is 1 − 2|A∩S| / (|A| + |S|).
    """
    if len(predicted) != len(sure):
        raise ValueError(f"{len(predicted)} predicted alignments but {len(sure)} gold ones")
    possible = possible or sure
    a_s = a_p = n_a = n_s = 0
    for a, s, p in zip(predicted, sure, possible):
        a_s += len(a & s)
        a_p += len(a & (p | s))
        n_a += len(a)
        n_s += len(s)
    if n_a + n_s == 0:
        return 0.0
    return 1.0 - (a_s + a_p) / (n_a + n_s)
