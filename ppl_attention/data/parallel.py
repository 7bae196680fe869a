"""Plain parallel text as fast_align and eflomal read it — one sentence pair a line,
``source tokens ||| target tokens``, space-split — and gold alignments with sure and possible
links (Pharaoh: ``i-j`` a sure link, ``i?j`` a possible one; 0-based source index i, target
index j), checked against the corpus before any work.

Lines are counted as those tools count them: split at ``\\n`` only (a form feed or a Unicode
line separator inside a sentence is a character of it), a final newline ending the last line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .corpus import DataError, Pair, atomic_write_text, read_utf8
from .pharaoh import Links

__all__ = ["SEPARATOR", "read_parallel", "parse_parallel", "format_parallel", "write_parallel",
           "read_gold", "parse_gold_line", "format_gold"]

SEPARATOR = "|||"
_INDEX = re.compile(r"[0-9]+")


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def parse_parallel(text: str, where: str = "<text>") -> list[Pair]:
    """The pairs of ``source ||| target`` lines; a line without the separator, with more than
    one, or with an empty side is a :class:`DataError` naming ``where:LINE``. Each distinct
    token is one string object, shared by every line that holds it (a corpus's memory is its
    vocabulary plus one pointer per token, not one string per token)."""
    pairs: list[Pair] = []
    seen: dict[str, str] = {}
    one = seen.setdefault
    for n, line in enumerate(_lines(text), 1):
        parts = line.split(f" {SEPARATOR} ") if f" {SEPARATOR} " in line else line.split(SEPARATOR)
        if len(parts) == 1:
            raise DataError(f"{where}:{n}: no '{SEPARATOR}' between source and target: "
                            f"{line[:80]!r}")
        if len(parts) > 2:
            raise DataError(f"{where}:{n}: {len(parts) - 1} '{SEPARATOR}' separators (expected "
                            f"one, 'source {SEPARATOR} target')")
        src = [one(w, w) for w in parts[0].split()]
        tgt = [one(w, w) for w in parts[1].split()]
        if not src:
            raise DataError(f"{where}:{n}: empty source side")
        if not tgt:
            raise DataError(f"{where}:{n}: empty target side")
        pairs.append((src, tgt))
    if not pairs:
        raise DataError(f"{where}: no sentence pairs")
    return pairs


def read_parallel(path: str | os.PathLike) -> list[Pair]:
    """:func:`parse_parallel` of a UTF-8 file (a byte that is not UTF-8 named by its line)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such parallel text file")
    return parse_parallel(read_utf8(path, newline_only=True), str(path))


def format_parallel(pairs: list[Pair]) -> str:
    return "".join(f"{' '.join(s)} {SEPARATOR} {' '.join(t)}\n" for s, t in pairs)


def write_parallel(path: str | os.PathLike, pairs: list[Pair]) -> None:
    atomic_write_text(path, format_parallel(pairs))


def parse_gold_line(line: str, where: str) -> tuple[Links, Links]:
    """(sure, possible) links of one Pharaoh line: ``i-j`` sure, ``i?j`` possible (the possible
    set includes the sure links, P ⊇ S, as the AER of Och & Ney 2003 reads it)."""
    sure: Links = set()
    possible: Links = set()
    for item in line.split():
        sep = "-" if "-" in item else "?"
        parts = item.split(sep)
        if len(parts) != 2 or not all(_INDEX.fullmatch(x) for x in parts):
            raise DataError(f"{where}: malformed link {item!r} (expected i-j, sure, or i?j, "
                            f"possible)")
        link = (int(parts[0]), int(parts[1]))
        (sure if sep == "-" else possible).add(link)
    return sure, possible | sure


def read_gold(path: str | os.PathLike, pairs: list[Pair], prefix: bool = False
              ) -> tuple[list[Links], list[Links]]:
    """Sure and possible links of each pair of ``pairs`` from a Pharaoh file: one line per
    pair (``prefix``: of the first pairs — the gold of the test sentences put first in a
    larger corpus, as aligners are evaluated), every index inside its sentence — else a
    :class:`DataError` naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such alignment file")
    lines = _lines(read_utf8(path, newline_only=True))
    if len(lines) > len(pairs) or (len(lines) != len(pairs) and not prefix) or not lines:
        raise DataError(f"{path}: {len(lines)} alignment lines but the corpus has {len(pairs)} "
                        f"pairs" + (" (at most one line per pair, at least one)" if prefix
                                    else ""))
    sure, possible = [], []
    for n, (line, (src, tgt)) in enumerate(zip(lines, pairs), 1):
        s, p = parse_gold_line(line, f"{path}:{n}")
        for i, j in sorted(p):
            if i >= len(src) or j >= len(tgt):
                raise DataError(f"{path}:{n}: link {i}-{j} outside the sentence (source length "
                                f"{len(src)}, target length {len(tgt)})")
        sure.append(s)
        possible.append(p)
    return sure, possible


def format_gold(sure: Links, possible: Links) -> str:
    """One Pharaoh line: sure links ``i-j``, the other possible ones ``i?j``, by target index."""
    items = [(j, i, "-") for i, j in sure] + [(j, i, "?") for i, j in possible - sure]
    return " ".join(f"{i}{sep}{j}" for j, i, sep in sorted(items))
