"""What a corpus-scale run leaves behind: nothing of a corpus's arrays once its result is read
(NumPyro's own caches would otherwise hold every chain's link accumulators), tokens shared
between lines, and the allocator settings that stand aside for the user's own."""

from __future__ import annotations

import jax
import numpy as np

from ppl_attention.core import allocator
from ppl_attention.data.indexed import index_pairs
from ppl_attention.data.parallel import parse_parallel
from ppl_attention.numpyro import aligners as al
from ppl_attention.numpyro.inference import word_alignment as wa

TEXT = ("das haus ist klein ||| the house is small\n"
        "das haus ist gross ||| the house is big\n"
        "ein buch ||| a book\n"
        "das buch ist klein ||| the book is small\n")


def _live_shapes():
    return {tuple(a.shape) for a in jax.live_arrays()}


def test_run_gibbs_leaves_no_accumulator_alive():
    """After ``run_gibbs`` returns (and its result is dropped), no device array of a class's
    accumulator shape ``[n, B, S1, T]`` nor of its cell ids is alive: every chain's ``MCMC``
    was released, though NumPyro's module-level cache still holds the ``MCMC`` objects."""
    corpus, _, _ = index_pairs(parse_parallel(TEXT * 5), batch=4, multiple=4)
    shapes = {c.cell.shape for c in corpus.classes}
    for model in ("hmm", "fertility"):
        res = wa.run_gibbs(al.aligner(model), corpus, chains=2, warmup=1, samples=2, track=4,
                           progress=False, init_sweeps=1)
        assert len(res["marginals"]) == len(corpus.classes)
        del res
        left = shapes & _live_shapes()
        assert not left, f"{model}: arrays of shape {left} still alive after run_gibbs"


def test_tokens_are_shared_between_lines():
    pairs = parse_parallel(TEXT)
    assert pairs[0][0][0] is pairs[1][0][0] is pairs[3][0][0]  # "das"
    assert pairs[2][1][1] is pairs[3][1][1]  # "book"
    assert [w for s, t in pairs for w in s + t] == [w for line in TEXT.splitlines()
                                                   for w in line.replace("|||", "").split()]


def test_allocator_settings_stand_aside_for_the_users(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert allocator.tune_allocator() is False
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    applied = allocator.tune_allocator()
    assert applied is (allocator._libc() is not None and hasattr(allocator._libc(), "mallopt"))
    assert isinstance(allocator.return_free_memory(), bool)
    x = np.ones(1 << 20)  # the allocator still serves and frees after both calls
    assert float(x.sum()) == float(1 << 20)
