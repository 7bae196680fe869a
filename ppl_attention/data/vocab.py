"""Token ↔ id maps with the four specials ``<unk> <pad> <bos> <eos>``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from ..core.errors import UserError

UNK, PAD, BOS, EOS = "<unk>", "<pad>", "<bos>", "<eos>"
SPECIALS = (UNK, PAD, BOS, EOS)


class Vocab:
    def __init__(self, tokens: Iterable[str]):
        self.itos: list[str] = list(SPECIALS) + [t for t in tokens if t not in SPECIALS]
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise UserError("duplicate tokens in vocabulary")
        self.unk, self.pad, self.bos, self.eos = (self.stoi[s] for s in SPECIALS)

    @classmethod
    def build(cls, sentences: Iterable[list[str]], min_count: int = 1) -> Vocab:
        counts = Counter(t for s in sentences for t in s)
        return cls(sorted(t for t, c in counts.items() if c >= min_count))

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: list[str]) -> tuple[list[int], int]:
        """Ids and the number of tokens that were unknown (mapped to ``<unk>``)."""
        ids = [self.stoi.get(t, self.unk) for t in tokens]
        return ids, sum(1 for t in tokens if t not in self.stoi)

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[i] for i in ids]

    def to_list(self) -> list[str]:
        return list(self.itos)

    @classmethod
    def from_list(cls, itos: list[str]) -> Vocab:
        if list(itos[: len(SPECIALS)]) != list(SPECIALS):
            raise UserError(f"vocabulary must start with {SPECIALS}")
        return cls(itos[len(SPECIALS):])
