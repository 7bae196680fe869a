"""UTF-8 TSV corpora: one pair a line, ``source tokens<TAB>target tokens``, space-split."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..core.errors import DataError
from ..core.files import make_readable

__all__ = ["Pair", "DataError", "read_tsv", "read_sequences", "read_utf8", "write_tsv",
           "atomic_write_text", "write_directory_atomically"]

Pair = tuple[list[str], list[str]]


def read_utf8(path: Path, newline_only: bool = False) -> str:
    """The text of ``path``; a byte that is not UTF-8 is a :class:`DataError` naming file, line
    and column: ``file:LINE: not UTF-8 (byte 0x.. at column C)`` (C counts characters). Lines
    are counted as the caller's reader counts them: ``str.splitlines``, or (``newline_only``)
    split at ``\n`` alone."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        head = raw[:e.start].decode("utf-8") + "?"  # "?" stands in for the bad byte
        lines = head.split("\n") if newline_only else head.splitlines()
        raise DataError(f"{path}:{len(lines)}: not UTF-8 (byte 0x{raw[e.start]:02x} at column "
                        f"{len(lines[-1])})") from None


def read_tsv(path: str | os.PathLike) -> list[Pair]:
    """Read ``source<TAB>target`` lines; blank lines are errors, so line numbers stay aligned with
    a Pharaoh file. Raises :class:`DataError` naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such corpus file")
    pairs: list[Pair] = []
    for n, line in enumerate(read_utf8(path).splitlines(), 1):
        fields = line.split("\t")
        if len(fields) != 2:
            what = "no tab" if len(fields) == 1 else f"{len(fields) - 1} tabs"
            raise DataError(f"{path}:{n}: expected 'source<TAB>target', found {what}: {line!r}")
        src, tgt = fields[0].split(), fields[1].split()
        if not src:
            raise DataError(f"{path}:{n}: empty source side")
        if not tgt:
            raise DataError(f"{path}:{n}: empty target side")
        pairs.append((src, tgt))
    if not pairs:
        raise DataError(f"{path}: no sentence pairs")
    return pairs


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write via a temporary file in the same folder and rename, so a reader never sees half."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        make_readable(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_directory_atomically(path: str | os.PathLike, fill) -> Path:
    """Make the directory ``path`` whole or not at all: ``fill(tmp)`` writes a temporary
    sibling, which then replaces ``path`` by renames (an earlier ``path`` is moved aside first
    and removed last), so a reader never sees a half-written directory."""
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        make_readable(tmp)
        fill(tmp)
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def write_tsv(path: str | os.PathLike, pairs: list[Pair]) -> None:
    atomic_write_text(path, "".join(f"{' '.join(s)}\t{' '.join(t)}\n" for s, t in pairs))


def read_sequences(path: str | os.PathLike, side: str = "target") -> list[list[str]]:
    """Single sequences for a sequence model: a one-column file (space-separated tokens a
    line), or a ``source<TAB>target`` corpus read on ``side`` ("source" or "target"). An empty
    sequence or a line with more than one tab is a :class:`DataError` naming file and line."""
    if side not in ("source", "target"):
        raise DataError(f"side must be 'source' or 'target', got {side!r}")
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such corpus file")
    seqs = []
    for n, line in enumerate(read_utf8(path).splitlines(), 1):
        fields = line.split("\t")
        if len(fields) > 2:
            raise DataError(f"{path}:{n}: expected one column or 'source<TAB>target', found "
                            f"{len(fields) - 1} tabs: {line!r}")
        field = fields[0] if len(fields) == 1 or side == "source" else fields[1]
        tokens = field.split()
        if not tokens:
            what = "line" if len(fields) == 1 else f"{side} side"
            raise DataError(f"{path}:{n}: empty {what} (a sequence needs at least one token)")
        seqs.append(tokens)
    if not seqs:
        raise DataError(f"{path}: no sequences")
    return seqs
