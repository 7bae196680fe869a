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


def edit_distance(a: list, b: list) -> int:
    """Levenshtein distance between two token sequences (unit costs)."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def wer_per(hypotheses: dict[str, list[str]], references: dict[str, list[list[str]]]
            ) -> tuple[float, float]:
    """Word error rate and phone error rate over the words of ``hypotheses``.

    A word is correct when its hypothesis equals any of its reference pronunciations; PER is
    Σ_w min_r edit(h_w, r) / Σ_w |r*_w| with r*_w the closest reference (ties: the shorter).
    """
    if not hypotheses:
        raise ValueError("no hypotheses to score")
    wrong, edits, length = 0, 0, 0
    for word, hyp in hypotheses.items():
        refs = references.get(word)
        if not refs:
            raise ValueError(f"no reference pronunciation for {word!r}")
        wrong += hyp not in refs
        d, n = min((edit_distance(hyp, r), len(r)) for r in refs)
        edits += d
        length += n
    return wrong / len(hypotheses), edits / max(1, length)
