"""Dependency trees in CoNLL-U (https://universaldependencies.org/format.html): one word a line,
ten tab-separated columns, a blank line after each sentence. Written here with the ID, FORM and
HEAD columns filled (HEAD 1-based, 0 for the root) and ``_`` elsewhere, which every CoNLL-U
reader accepts."""

from __future__ import annotations

from ..core.trees import conll_heads

__all__ = ["format_conllu"]


def format_conllu(words: list[str], heads: list[int], sent_id: int | None = None) -> str:
    """One sentence: ``words`` and their ``heads`` (0-based, the root's child its own index)."""
    lines = [] if sent_id is None else [f"# sent_id = {sent_id}"]
    lines.append("# text = " + " ".join(words))
    for m, (word, head) in enumerate(zip(words, conll_heads(heads, len(words))), 1):
        lines.append(f"{m}\t{word}\t_\t_\t_\t_\t{head}\t_\t_\t_")
    return "\n".join(lines) + "\n\n"
