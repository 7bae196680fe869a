"""A parallel corpus indexed for word aligners at scale (NumPy; the NumPyro side's Gibbs and
variational samplers read it).

Every sentence pair's source gets the NULL word in front (position 0), so a target word may
align to nothing. The translation table is kept **sparse**: only the (source word, target word)
pairs that co-occur in some sentence pair — the *cells* c = 0 … C − 1 — can have more than the
prior's mass, so a table is a vector over cells (``cell_src [C]``, ``cell_tgt [C]``), and each
sentence pair carries the cell of each of its (source position, target position) cells
(``cell [B, S1, T]``). Pairs are grouped by their padded lengths (multiples of ``multiple``)
into *shape classes* of stacked batches ``[n_batches, batch, S1, T]``, so a sweep over the
corpus is one compiled program: one scan per shape class. Each class costs its scan's
compilation (about a second per program on a CPU) whatever its size, so a group of fewer than
``merge_below`` pairs (a quarter batch by default) joins the smallest larger class whose shape
holds it — a few pairs padded further instead of one more compiled scan in every program — and
the small groups no class holds share one. A group of a few batches (fewer than
``JOIN_BELOW_BATCHES``) joins a class of at least that many batches that holds it, where there
is one: preferring a class whose last batch has room, it often pads fewer cells than it saves
(the 100k-pair corpus of ``benchmarks/aligners.py``, reverse direction: 11 classes to 7, 1 %
fewer cells).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import UserError

__all__ = ["ShapeClass", "IndexedCorpus", "index_corpus", "index_pairs"]


@dataclass
class ShapeClass:
    """Stacked batches of one padded shape: ``src [n, B, S1]`` (source word ids, NULL's id at
    position 0), ``src_mask [n, B, S1]`` (position 0 True), ``tgt [n, B, T]``, ``tgt_mask``,
    ``cell [n, B, S1, T]`` (0 where masked), ``index [n, B]`` (the corpus position of each
    row, −1 for a filler row)."""

    src: np.ndarray
    src_mask: np.ndarray
    tgt: np.ndarray
    tgt_mask: np.ndarray
    cell: np.ndarray
    index: np.ndarray

    @property
    def shape(self) -> tuple[int, int, int, int]:
        n, B, S1 = self.src.shape
        return n, B, S1, self.tgt.shape[-1]


@dataclass
class IndexedCorpus:
    """The corpus of the module docstring: ``n_src`` source words (NULL's id is ``null``),
    ``n_tgt`` target words, cells, shape classes, and each pair's lengths."""

    n_src: int
    n_tgt: int
    null: int
    cell_src: np.ndarray
    cell_tgt: np.ndarray
    classes: list[ShapeClass]
    src_len: np.ndarray
    tgt_len: np.ndarray

    @property
    def n_cells(self) -> int:
        return len(self.cell_src)

    @property
    def n_pairs(self) -> int:
        return len(self.src_len)

    def cells_per_source(self) -> np.ndarray:
        """k_e: the number of distinct target words co-occurring with each source word."""
        return np.bincount(self.cell_src, minlength=self.n_src)

    def release_batches(self) -> None:
        """Drop the host copies of the classes' batch arrays (``src`` … ``cell``) once a
        sampler holds them on its device; ``index`` and the lengths stay, which is all
        :func:`~ppl_attention.numpyro.inference.word_alignment.links_from_marginals` reads."""
        for c in self.classes:
            c.src = c.src_mask = c.tgt = c.tgt_mask = c.cell = None

    def nbytes(self) -> int:
        return sum(a.nbytes for c in self.classes for a in vars(c).values()
                   if a is not None) + \
            self.cell_src.nbytes + self.cell_tgt.nbytes


def _ceil(x: np.ndarray, m: int) -> np.ndarray:
    return ((x + m - 1) // m) * m


def _keys(s, sm, y, ym, n_tgt):
    """The key source id · n_tgt + target id of every real cell, and where they are."""
    real = sm[:, :, None] & ym[:, None, :]
    return (s.astype(np.int64)[:, :, None] * n_tgt + y[:, None, :])[real], real


#: a length group of fewer batches than this joins a class of at least as many batches that
#: holds it (module docstring)
JOIN_BELOW_BATCHES = 3


def _merge_small_groups(groups: list, merge_below: int, batch: int, share: bool = True) -> list:
    """(S1, T, rows) groups with the groups of fewer than ``merge_below`` rows moved into a
    group of at least ``merge_below`` rows whose S1 and T are both as large: the smallest (S1·T)
    one whose last batch has room for them, else the smallest one (one more batch of it). With
    ``share``, the small groups no such host holds (every group of a small text; the longest or
    most lopsided pairs of a large one) share one class, of their largest S1 and T; without, each
    keeps its own."""
    hosts = {(s1, t): [rows] for s1, t, rows in groups if len(rows) >= merge_below}
    own = []
    for s1, t, rows in groups:
        if len(rows) >= merge_below:
            continue
        fits = [k for k in hosts if k[0] >= s1 and k[1] >= t]
        if fits:
            held = {k: sum(len(r) for r in hosts[k]) for k in fits}
            more = {k: _ceil(n + len(rows), batch) > _ceil(n, batch)  # a batch more
                    for k, n in held.items()}
            hosts[min(fits, key=lambda k: (more[k], k[0] * k[1], k))].append(rows)
        else:
            own.append((s1, t, rows))
    merged = [(s1, t, np.concatenate(parts)) for (s1, t), parts in hosts.items()]
    if own and share:
        own = [(max(g[0] for g in own), max(g[1] for g in own),
                np.concatenate([g[2] for g in own]))]
    return sorted(merged + own, key=lambda g: (g[0], g[1]))


def index_corpus(src: list[np.ndarray], tgt: list[np.ndarray], n_src: int, n_tgt: int,
                 batch: int = 1024, multiple: int = 8,
                 merge_below: int | None = None) -> IndexedCorpus:
    """Index sentence pairs given as id arrays (``src[k]`` the source word ids of pair k, in
    ``[0, n_src)``; ``tgt[k]`` its target word ids, in ``[0, n_tgt)``). NULL gets the id
    ``n_src`` (one more row of the translation table). ``merge_below``: groups of fewer pairs
    join a larger class that holds them, or share one (module docstring; default
    ``batch // 4``, 0: never); a group of fewer than :data:`JOIN_BELOW_BATCHES` batches joins a
    class of at least as many that holds it, if there is one."""
    if len(src) != len(tgt) or not src:
        raise UserError(f"index_corpus: {len(src)} sources and {len(tgt)} targets")
    src_len = np.array([len(s) for s in src], dtype=np.int64)
    tgt_len = np.array([len(t) for t in tgt], dtype=np.int64)
    return _index_flat(np.concatenate(src).astype(np.int32), src_len,
                       np.concatenate(tgt).astype(np.int32), tgt_len, n_src, n_tgt, batch,
                       multiple, merge_below)


def _padded(flat: np.ndarray, lengths: np.ndarray, rows: np.ndarray, n_rows: int, width: int,
            at: int, fill: int) -> tuple[np.ndarray, np.ndarray]:
    """``[n_rows, width]`` ids and mask of the sentences ``rows`` (their words ``flat[offset
    …]``, ``lengths`` long) from column ``at`` on; the rows past ``len(rows)`` filler."""
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    n = lengths[rows]
    row = np.repeat(np.arange(len(rows)), n)
    col = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    ids = np.full((n_rows, width), fill, np.int32)
    mask = np.zeros((n_rows, width), bool)
    ids[row, at + col] = flat[np.repeat(offsets[rows], n) + col]
    mask[row, at + col] = True
    return ids, mask


def _index_flat(src_ids: np.ndarray, src_len: np.ndarray, tgt_ids: np.ndarray,
                tgt_len: np.ndarray, n_src: int, n_tgt: int, batch: int, multiple: int,
                merge_below: int | None) -> IndexedCorpus:
    """:func:`index_corpus` of the pairs' ids laid end to end (``src_ids [Σ src_len]``, each
    pair's ``src_len`` of them in turn; the targets likewise): no Python work per pair."""
    null = n_src
    if (src_len == 0).any() or (tgt_len == 0).any():
        k = int(np.flatnonzero((src_len == 0) | (tgt_len == 0))[0])
        raise UserError(f"pair {k + 1}: an empty side")
    S1 = _ceil(src_len + 1, multiple)
    T = _ceil(tgt_len, multiple)
    order = np.lexsort((T, S1))
    groups = []
    for s1 in np.unique(S1):
        for t in np.unique(T[S1 == s1]):
            rows = order[(S1[order] == s1) & (T[order] == t)]
            groups.append((int(s1), int(t), rows))
    merge_below = batch // 4 if merge_below is None else merge_below
    if merge_below > 0:  # a few batches: a host that holds them, if one is large enough
        groups = _merge_small_groups(groups, max(JOIN_BELOW_BATCHES * batch, merge_below), batch,
                                     share=False)
    groups = _merge_small_groups(groups, merge_below, batch)
    # every (source id, target id) of every real cell, as one key, for the cell index
    keys, parts = [], []
    for s1, t, rows in groups:
        n_b = (len(rows) + batch - 1) // batch
        B = min(batch, len(rows))
        n_rows = n_b * B
        s, sm = _padded(src_ids, src_len, rows, n_rows, s1, 1, null)
        sm[:len(rows), 0] = True  # NULL, in front of every real row's source
        y, ym = _padded(tgt_ids, tgt_len, rows, n_rows, t, 0, 0)
        idx = np.full(n_rows, -1, np.int64)
        idx[:len(rows)] = rows
        key, real = _keys(s, sm, y, ym, n_tgt)
        keys.append(key)
        parts.append((s, sm, y, ym, idx, n_b, B, real))
    # a hash table's codes (pandas.factorize): linear time, and no sort's int64 copies of a
    # 100k-pair corpus's 34M keys
    import pandas as pd

    keys = np.concatenate(keys)
    inverse, unique = pd.factorize(keys, sort=False)
    del keys
    unique = np.asarray(unique, np.int64)
    inverse = inverse.astype(np.int32)
    classes, at = [], 0
    for s, sm, y, ym, idx, n_b, B, real in parts:
        n_real = int(real.sum())
        cell = np.zeros(real.shape, np.int32)
        cell[real] = inverse[at: at + n_real]
        at += n_real
        shape = (n_b, B)
        classes.append(ShapeClass(s.reshape(*shape, -1), sm.reshape(*shape, -1),
                                  y.reshape(*shape, -1), ym.reshape(*shape, -1),
                                  cell.reshape(*shape, *cell.shape[1:]), idx.reshape(shape)))
    return IndexedCorpus(n_src + 1, n_tgt, null, (unique // n_tgt).astype(np.int32),
                         (unique % n_tgt).astype(np.int32), classes, src_len, tgt_len)


def index_pairs(pairs, batch: int = 1024, multiple: int = 8, src_vocab=None, tgt_vocab=None,
                merge_below: int | None = None):
    """(:class:`IndexedCorpus`, source words, target words) of token pairs: ids in order of
    first appearance — after ``src_vocab`` / ``tgt_vocab`` (lists of words, e.g. saved tables'),
    which keep their ids 0 … n − 1 whether the pairs use them or not; ``batch``,
    ``multiple``, ``merge_below`` as :func:`index_corpus`."""
    src_ids, src_words, src_len = _word_ids([s for s, _ in pairs], src_vocab)
    tgt_ids, tgt_words, tgt_len = _word_ids([t for _, t in pairs], tgt_vocab)
    if not len(src_len):
        raise UserError("index_corpus: 0 sources and 0 targets")
    corpus = _index_flat(src_ids, src_len, tgt_ids, tgt_len, len(src_words), len(tgt_words),
                         batch, multiple, merge_below)
    return corpus, src_words, tgt_words


def _word_ids(sentences: list[list[str]], vocab) -> tuple[np.ndarray, list[str], np.ndarray]:
    """The sentences' word ids laid end to end, the vocabulary (``vocab``'s words first, with
    their ids 0 … n − 1, then the others in order of first appearance) and the lengths — one
    hash table over all the words (pandas.factorize), not a dictionary lookup per word."""
    import pandas as pd

    vocab = list(vocab) if vocab is not None else []
    lengths = np.fromiter(map(len, sentences), np.int64, len(sentences))
    words = np.empty(len(vocab) + int(lengths.sum()), object)
    words[:len(vocab)] = vocab
    words[len(vocab):] = [w for s in sentences for w in s]
    codes, uniques = pd.factorize(words, sort=False)
    if (codes[:len(vocab)] != np.arange(len(vocab))).any():
        raise UserError("index_pairs: the vocabulary given holds a word twice")
    return codes[len(vocab):].astype(np.int32), list(uniques), lengths
