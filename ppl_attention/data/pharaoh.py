"""Pharaoh alignments as fast_align / eflomal / awesome-align write them: one line per pair,
``i-j`` pairs (0-based source index i, target index j) separated by spaces."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .corpus import DataError, Pair, atomic_write_text, read_utf8

Links = set[tuple[int, int]]
_INDEX = re.compile(r"[0-9]+")  # ASCII digits: str.isdigit also takes "²", which int() refuses


def parse_pharaoh_line(line: str, where: str) -> Links:
    links: Links = set()
    for item in line.split():
        parts = item.split("-")
        if len(parts) != 2 or not all(_INDEX.fullmatch(x) for x in parts):
            raise DataError(f"{where}: malformed alignment pair {item!r} (expected i-j)")
        links.add((int(parts[0]), int(parts[1])))
    return links


def read_pharaoh(path: str | os.PathLike, pairs: list[Pair] | None = None) -> list[Links]:
    """Read alignments; with ``pairs`` check the line count and that every index is in range."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such alignment file")
    lines = read_utf8(path).splitlines()
    if pairs is not None and len(lines) != len(pairs):
        raise DataError(
            f"{path}: {len(lines)} alignment lines but the corpus has {len(pairs)} pairs"
        )
    out = []
    for n, line in enumerate(lines, 1):
        links = parse_pharaoh_line(line, f"{path}:{n}")
        if pairs is not None:
            S, T = len(pairs[n - 1][0]), len(pairs[n - 1][1])
            for i, j in sorted(links):
                if i >= S or j >= T:
                    raise DataError(
                        f"{path}:{n}: pair {i}-{j} out of range (source length {S}, "
                        f"target length {T})"
                    )
        out.append(links)
    return out


def links_of_own_line(line: str) -> Links:
    """The links of a line :func:`format_pharaoh` wrote in this run — unchecked, twice as fast
    as :func:`parse_pharaoh_line`, never for a line read from a file."""
    return {(int(i), int(j)) for i, j in (item.split("-") for item in line.split())}


def format_pharaoh(links: Links) -> str:
    return " ".join(f"{i}-{j}" for i, j in sorted(links, key=lambda p: (p[1], p[0])))


def write_pharaoh(path: str | os.PathLike, alignments: list[Links]) -> None:
    atomic_write_text(path, "".join(format_pharaoh(a) + "\n" for a in alignments))


def format_scores(scores: dict) -> str:
    """One line of link posteriors, ``i-j:p`` per link in Pharaoh order and ``null-j:p`` for a
    target word aligned to nothing (p: its NULL posterior), p to 4 decimals."""
    return " ".join(f"{'null' if i < 0 else i}-{j}:{p:.4f}"
                    for (i, j), p in sorted(scores.items(), key=lambda x: (x[0][1], x[0][0])))


def parse_scores_line(line: str, where: str) -> dict:
    """The inverse of :func:`format_scores` (``{(i or -1, j): p}``), refusing a malformed item."""
    out = {}
    for item in line.split():
        link, _, p = item.partition(":")
        parts = link.split("-")
        try:
            i = -1 if parts[0] == "null" else int(parts[0])
            key, value = (i, int(parts[1])), float(p)
        except (ValueError, IndexError):
            raise DataError(f"{where}: malformed link score {item!r} (expected i-j:p or "
                            f"null-j:p)") from None
        if len(parts) != 2 or not 0 <= value <= 1:
            raise DataError(f"{where}: malformed link score {item!r} (expected i-j:p, p in "
                            f"[0, 1])")
        out[key] = value
    return out
