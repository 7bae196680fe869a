"""The corpus index and the links read off it, against their definitions pair by pair: every
real row of every shape class holds its pair's word ids (NULL in front), masks and cells (each
cell's source and target words those of its row and column); a vocabulary given twice over is
refused; each pair's best links (:class:`~ppl_attention.numpyro.inference.word_alignment.
BestLinks`) are the argmax of its marginals, NULL left out, and its Pharaoh lines those of the
sets (transposed too); and the symmetrizations equal the textbook transcription below (Koehn,
Och & Marcu 2003) on random link sets.

Planted faults (``python tests/plant_faults.py z9 z10 z12``): z9 the target ids written one
column off, z10 the best links' source positions not shifted past NULL, z12 the transposed
lines left in the untransposed order — each fails a test here.
"""

import random

import numpy as np
import pytest

from ppl_attention.common.symmetrize import HEURISTICS, NEIGHBOURS, symmetrize
from ppl_attention.core.errors import UserError
from ppl_attention.data.indexed import index_pairs
from ppl_attention.data.pharaoh import format_pharaoh
from ppl_attention.numpyro.inference.word_alignment import BestLinks


def _random_pairs(n, seed=0):
    rng = random.Random(seed)
    words = [f"w{k}" for k in range(30)]
    return [([rng.choice(words) for _ in range(rng.randint(1, 13))],
             [rng.choice(words) + "'" for _ in range(rng.randint(1, 11))]) for _ in range(n)]


@pytest.mark.parametrize("batch,merge_below", [(4, None), (3, 0), (16, 5)])
def test_every_row_holds_its_pair(batch, merge_below):
    pairs = _random_pairs(60)
    corpus, src_words, tgt_words = index_pairs(pairs, batch=batch, multiple=4,
                                               merge_below=merge_below, src_vocab=["zz", "w3"])
    assert src_words[:2] == ["zz", "w3"] and len(set(src_words)) == len(src_words)
    seen = []
    for c in corpus.classes:
        n, B, S1, T = c.shape
        for r, k in enumerate(c.index.reshape(-1)):
            s, sm = c.src.reshape(n * B, S1)[r], c.src_mask.reshape(n * B, S1)[r]
            y, ym = c.tgt.reshape(n * B, T)[r], c.tgt_mask.reshape(n * B, T)[r]
            if k < 0:
                assert not sm.any() and not ym.any()
                continue
            seen.append(k)
            src, tgt = pairs[k]
            assert sm.sum() == len(src) + 1 and ym.sum() == len(tgt)
            assert s[0] == corpus.null and [src_words[i] for i in s[1:1 + len(src)]] == src
            assert [tgt_words[j] for j in y[:len(tgt)]] == tgt
            cell = c.cell.reshape(n * B, S1, T)[r]
            for i in range(len(src) + 1):
                for j in range(len(tgt)):
                    assert corpus.cell_src[cell[i, j]] == s[i]
                    assert corpus.cell_tgt[cell[i, j]] == y[j]
    assert sorted(seen) == list(range(len(pairs)))
    keys = set(zip(corpus.cell_src.tolist(), corpus.cell_tgt.tolist()))
    assert len(keys) == corpus.n_cells  # each co-occurring word pair once


def test_a_vocabulary_with_a_word_twice_is_refused():
    with pytest.raises(UserError, match="holds a word twice"):
        index_pairs([(["a"], ["x"])], src_vocab=["a", "b", "a"])


def test_best_links_are_the_argmax_of_the_marginals():
    pairs = _random_pairs(40, seed=1)
    corpus, _, _ = index_pairs(pairs, batch=4, multiple=4)
    rng = np.random.default_rng(0)
    marginals = [rng.dirichlet(np.ones(c.shape[2]), size=c.shape[:2] + (c.shape[3],))
                 .transpose(0, 1, 3, 2).astype(np.float32) for c in corpus.classes]
    expected = [None] * len(pairs)
    for c, m in zip(corpus.classes, marginals):
        for (a, b), k in np.ndenumerate(c.index):
            if k >= 0:
                best = m[a, b].argmax(0)[:len(pairs[k][1])]
                expected[k] = {(int(i) - 1, j) for j, i in enumerate(best) if i > 0}
    best = BestLinks.of(corpus, marginals)
    links = best.sets()
    assert links == expected and any(links)
    # the Pharaoh lines made from the arrays: format_pharaoh of the sets, and of them transposed
    assert best.lines() == [format_pharaoh(a) for a in expected]
    flipped = [{(j, i) for i, j in a} for a in expected]
    assert best.lines(transpose=True) == [format_pharaoh(a) for a in flipped]
    assert sum(" " in line for line in best.lines(transpose=True)) > 10  # lines to sort


def _textbook(forward, reverse, heuristic):
    """Koehn's grow-diag(-final(-and)) as written: each pass over A in order, every neighbour
    of every link that is in the union and brings a new word joins; then the final step."""
    if heuristic == "intersection":
        return forward & reverse
    if heuristic == "union":
        return forward | reverse
    union, a = forward | reverse, forward & reverse
    src, tgt = {i for i, _ in a}, {j for _, j in a}
    added = True
    while added:
        added = False
        for i, j in sorted(a):
            for di, dj in NEIGHBOURS:
                p = (i + di, j + dj)
                if p in union and p not in a and (p[0] not in src or p[1] not in tgt):
                    a.add(p), src.add(p[0]), tgt.add(p[1])
                    added = True
    if heuristic == "grow-diag":
        return a
    for direction in (forward, reverse):
        for i, j in sorted(direction, key=lambda p: (p[1], p[0])):
            free = (i not in src and j not in tgt) if heuristic.endswith("-and") else \
                (i not in src or j not in tgt)
            if free and (i, j) not in a:
                a.add((i, j)), src.add(i), tgt.add(j)
    return a


def test_symmetrizations_equal_the_textbook_on_random_links():
    rng = random.Random(0)
    grew = 0
    for _ in range(3000):
        S, T = rng.randint(1, 7), rng.randint(1, 7)
        f = {(rng.randrange(S), j) for j in range(T) if rng.random() < 0.8}
        r = {(i, rng.randrange(T)) for i in range(S) if rng.random() < 0.8}
        for h in HEURISTICS:
            assert symmetrize(f, r, h) == _textbook(set(f), set(r), h), (f, r, h)
        grew += symmetrize(f, r, "grow-diag") != f & r
    assert grew > 1000  # most cases exercise the growing, not the intersection alone
