"""Length-bucketed batches with masks.

A :class:`Batch` holds, for B pairs: ``src [B, S]`` ids, ``src_mask [B, S]``, decoder inputs
``tgt_in [B, T]`` (``<bos> y_1 .. y_n``), outputs ``tgt_out [B, T]`` (``y_1 .. y_n <eos>``),
``tgt_mask [B, T]``, the indices of the pairs in the corpus, and gold alignments as a
``[B, T]`` tensor of source positions (−1 where none is known).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from .corpus import Pair
from .vocab import Vocab


@dataclass
class Batch:
    src: torch.Tensor
    src_mask: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    tgt_mask: torch.Tensor
    index: torch.Tensor
    gold: torch.Tensor | None = None
    n_unk: int = 0

    @property
    def size(self) -> int:
        return self.src.shape[0]

    @property
    def n_tokens(self) -> int:
        return int(self.tgt_mask.sum())

    def to(self, device) -> Batch:
        """The same batch with its tensors on ``device``."""
        def move(t):
            return None if t is None else t.to(device)

        return Batch(move(self.src), move(self.src_mask), move(self.tgt_in), move(self.tgt_out),
                     move(self.tgt_mask), move(self.index), move(self.gold), self.n_unk)


def _pad(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return ids, ids != pad if pad >= 0 else None


def collate(pairs: list[Pair], index: list[int], src_vocab: Vocab, tgt_vocab: Vocab,
            gold: list[set[tuple[int, int]]] | None = None) -> Batch:
    n_unk = 0
    srcs, tins, touts = [], [], []
    for s, t in pairs:
        sid, u1 = src_vocab.encode(s)
        tid, u2 = tgt_vocab.encode(t)
        n_unk += u1 + u2
        srcs.append(sid)
        tins.append([tgt_vocab.bos] + tid)
        touts.append(tid + [tgt_vocab.eos])
    src, _ = _pad(srcs, src_vocab.pad)
    src_mask = torch.zeros_like(src, dtype=torch.bool)
    for i, s in enumerate(srcs):
        src_mask[i, : len(s)] = True
    tgt_in, _ = _pad(tins, tgt_vocab.pad)
    tgt_out, _ = _pad(touts, tgt_vocab.pad)
    tgt_mask = torch.zeros_like(tgt_out, dtype=torch.bool)
    for i, t in enumerate(touts):
        tgt_mask[i, : len(t)] = True
    g = None
    if gold is not None:
        g = torch.full(tgt_out.shape, -1, dtype=torch.long)
        for b, links in enumerate(gold):
            for i, j in links:
                g[b, j] = i
    return Batch(src, src_mask, tgt_in, tgt_out, tgt_mask, torch.tensor(index), g, n_unk)


def make_batches(pairs: list[Pair], src_vocab: Vocab, tgt_vocab: Vocab, batch_size: int,
                 gold: list | None = None, shuffle: bool = False, seed: int = 0) -> list[Batch]:
    """Sort by length into buckets of ``batch_size`` (little padding); shuffle bucket order."""
    order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][0]), len(pairs[i][1]), i))
    chunks = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    if shuffle:
        random.Random(seed).shuffle(chunks)
    return [
        collate([pairs[i] for i in c], c, src_vocab, tgt_vocab,
                [gold[i] for i in c] if gold is not None else None)
        for c in chunks
    ]
