"""Dependency trees in CoNLL-U (https://universaldependencies.org/format.html): one word a line,
ten tab-separated columns, a blank line after each sentence. Written here with the ID, FORM and
HEAD columns filled (HEAD 1-based, 0 for the root) and ``_`` elsewhere, which every CoNLL-U
reader accepts."""

from __future__ import annotations

from pathlib import Path

from ..core.errors import DataError
from ..core.heads import conll_heads, parse_conll_heads, tree_problem

__all__ = ["format_conllu", "read_conllu"]


def format_conllu(words: list[str], heads: list[int], sent_id: int | None = None) -> str:
    """One sentence: ``words`` and their ``heads`` (0-based, the root's child its own index)."""
    lines = [] if sent_id is None else [f"# sent_id = {sent_id}"]
    lines.append("# text = " + " ".join(words))
    for m, (word, head) in enumerate(zip(words, conll_heads(heads, len(words))), 1):
        lines.append(f"{m}\t{word}\t_\t_\t_\t_\t{head}\t_\t_\t_")
    return "\n".join(lines) + "\n\n"


def read_conllu(path: str | Path, pairs: list | None = None) -> list[list[int]]:
    """The trees of a CoNLL-U file as heads (0-based, the root's child its own index), one list
    per sentence, in file order. Comment lines (``#``), multiword tokens (``1-2``) and empty
    nodes (``1.1``) are skipped, as CoNLL-U readers do. With ``pairs``, sentence k must have as
    many words as the source of pair k (and FORMs equal to its tokens). Refused, naming the file
    and the line: a line without ten tab-separated columns, an ID out of sequence, a HEAD that is
    no word of the sentence, heads that are no tree, a sentence count or length that differs
    from ``pairs``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: missing") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None
    trees, words, column, start = [], [], [], None

    def close(line_no: int) -> None:
        nonlocal words, column, start
        if not column:
            return
        heads = parse_conll_heads(column)
        problem = tree_problem(heads, len(heads), projective=False, single_root=False)
        if problem is not None:
            raise DataError(f"{path}:{start}: the sentence's HEAD column is not a tree "
                            f"({problem})")
        k = len(trees)
        if pairs is not None:
            if k >= len(pairs):
                raise DataError(f"{path}:{start}: sentence {k + 1}, but the data has "
                                f"{len(pairs)} pairs")
            src = list(pairs[k][0])
            if len(src) != len(words):
                raise DataError(f"{path}:{start}: sentence {k + 1} has {len(words)} words, its "
                                f"source has {len(src)}")
            if [w for w in words] != src and not all(w == "_" for w in words):
                raise DataError(f"{path}:{start}: sentence {k + 1}'s FORMs differ from its "
                                f"source ({' '.join(words)} against {' '.join(src)})")
        trees.append(heads)
        words, column, start = [], [], None

    for n, line in enumerate(text.split("\n"), 1):
        line = line.rstrip("\r")
        if not line.strip():
            close(n)
            continue
        if line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            raise DataError(f"{path}:{n}: {len(cols)} tab-separated columns, CoNLL-U has 10")
        if "-" in cols[0] or "." in cols[0]:
            continue
        if not cols[0].isdigit() or int(cols[0]) != len(column) + 1:
            raise DataError(f"{path}:{n}: ID {cols[0]!r}, expected {len(column) + 1}")
        if not cols[6].isdigit():
            raise DataError(f"{path}:{n}: HEAD {cols[6]!r} is not a number")
        start = start or n
        words.append(cols[1])
        column.append(int(cols[6]))
    close(len(text.split("\n")))
    if pairs is not None and len(trees) != len(pairs):
        raise DataError(f"{path}: {len(trees)} sentences, the data has {len(pairs)} pairs")
    return trees
