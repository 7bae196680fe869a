"""Length-bucketed batches with masks.

A :class:`Batch` holds, for B pairs: ``src [B, S]`` ids, ``src_mask [B, S]``, decoder inputs
``tgt_in [B, T]`` (``<bos> y_1 .. y_n``), outputs ``tgt_out [B, T]`` (``y_1 .. y_n <eos>``),
``tgt_mask [B, T]``, the indices of the pairs in the corpus, and gold alignments as a
``[B, T]`` array of source positions (−1 where none is known).

The arrays are made with NumPy and handed over as torch tensors (``array="torch"``, what a
Pyro model reads) or kept as NumPy arrays (``array="numpy"``, what the NumPyro side reads): the
NumPyro side never needs torch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from ..core.errors import UserError
from .corpus import Pair
from .vocab import Vocab

__all__ = ["Batch", "collate", "make_batches", "array_kind", "as_numpy", "ARRAYS", "pair_sides"]

ARRAYS = ("torch", "numpy")


@dataclass
class Batch:
    src: object
    src_mask: object
    tgt_in: object
    tgt_out: object
    tgt_mask: object
    index: object
    gold: object | None = None
    n_unk: int = 0
    #: real-valued features of each source position ``[B, S, F]`` (bags of instances:
    #: :mod:`ppl_attention.data.bags`), or None
    features: object | None = None

    @property
    def size(self) -> int:
        return self.src.shape[0]

    @property
    def n_tokens(self) -> int:
        return int(self.tgt_mask.sum())

    def to(self, device) -> Batch:
        """The same batch with its (torch) tensors on ``device``."""
        def move(t):
            return None if t is None else t.to(device)

        return Batch(move(self.src), move(self.src_mask), move(self.tgt_in), move(self.tgt_out),
                     move(self.tgt_mask), move(self.index), move(self.gold), self.n_unk,
                     move(self.features))


def _pad(seqs: list[list[int]], pad: int) -> np.ndarray:
    ids = np.full((len(seqs), max(len(s) for s in seqs)), pad, dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
    return ids


def _mask(seqs: list[list[int]], width: int) -> np.ndarray:
    return np.arange(width)[None, :] < np.array([len(s) for s in seqs])[:, None]


def collate(pairs: list[Pair], index: list[int], src_vocab: Vocab, tgt_vocab: Vocab,
            gold: list[set[tuple[int, int]]] | None = None, array: str = "torch") -> Batch:
    """One batch of ``pairs`` (their corpus ``index``), as ``array`` ("torch" or "numpy")."""
    if array not in ARRAYS:
        raise UserError(f"array must be one of {', '.join(ARRAYS)}, got {array!r}")
    n_unk = 0
    srcs, tins, touts = [], [], []
    for s, t in pairs:
        sid, u1 = src_vocab.encode(s)
        tid, u2 = tgt_vocab.encode(t)
        n_unk += u1 + u2
        srcs.append(sid)
        tins.append([tgt_vocab.bos] + tid)
        touts.append(tid + [tgt_vocab.eos])
    src = _pad(srcs, src_vocab.pad)
    tgt_in, tgt_out = _pad(tins, tgt_vocab.pad), _pad(touts, tgt_vocab.pad)
    fields = [src, _mask(srcs, src.shape[1]), tgt_in, tgt_out, _mask(touts, tgt_out.shape[1]),
              np.asarray(index, dtype=np.int64)]
    g = None
    if gold is not None:
        g = np.full(tgt_out.shape, -1, dtype=np.int64)
        for b, links in enumerate(gold):
            for i, j in links:
                g[b, j] = i
    if array == "torch":
        import torch

        fields = [torch.as_tensor(f) for f in fields]
        g = None if g is None else torch.as_tensor(g)
    return Batch(*fields, g, n_unk)


def make_batches(pairs: list[Pair], src_vocab: Vocab, tgt_vocab: Vocab, batch_size: int,
                 gold: list | None = None, shuffle: bool = False, seed: int = 0,
                 array: str = "torch") -> list[Batch]:
    """Sort by length into buckets of ``batch_size`` (little padding); shuffle bucket order.
    ``array``: torch tensors (a Pyro model's) or NumPy arrays (the NumPyro side's). Bags of
    instances (:class:`~ppl_attention.data.bags.Bag`, no vocabularies) are batched the same
    way, by their sizes: an example that lays out its own batch has ``collate(examples,
    index, array)``."""
    own_layout = getattr(type(pairs[0]), "collate", None) if pairs else None
    if own_layout is not None:
        order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i]), i))
        chunks = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
        if shuffle:
            random.Random(seed).shuffle(chunks)
        return [own_layout([pairs[i] for i in c], c, array) for c in chunks]
    order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][0]), len(pairs[i][1]), i))
    chunks = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    if shuffle:
        random.Random(seed).shuffle(chunks)
    return [
        collate([pairs[i] for i in c], c, src_vocab, tgt_vocab,
                [gold[i] for i in c] if gold is not None else None, array)
        for c in chunks
    ]


def as_numpy(a) -> np.ndarray:
    """A batch field as NumPy (a torch tensor through the CPU)."""
    return a if isinstance(a, np.ndarray) else a.cpu().numpy()


def array_kind(model) -> str:
    """The arrays a model reads: NumPy for a NumPyro model, torch tensors otherwise."""
    return "numpy" if getattr(model, "backend", "pyro") == "numpyro" else "torch"


def pair_sides(pair, tgt_vocab: Vocab | None) -> tuple[list[str], list[str], list[int]]:
    """What a tool shows of one example, as its batch lays it out: the source positions'
    names, the target positions' names and the target ids. A pair: its source tokens, its
    target tokens then ``<eos>`` and their ids; a bag (:class:`~ppl_attention.data.bags.Bag`):
    ``instance0 …`` and its one label (an example that is not a pair has ``sides()``)."""
    if hasattr(pair, "sides"):
        return pair.sides()
    src, tgt = list(pair[0]), list(pair[1])
    ids, _ = tgt_vocab.encode(tgt)
    return src, tgt + ["<eos>"], ids + [tgt_vocab.eos]
