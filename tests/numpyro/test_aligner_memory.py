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


def _live_shapes(before=frozenset()):
    """Shapes of the live device arrays not among ``before`` (ids of arrays alive earlier:
    another test's arrays in the same process are not this run's)."""
    return {tuple(a.shape) for a in jax.live_arrays() if id(a) not in before}


def test_run_gibbs_leaves_no_accumulator_alive():
    """After ``run_gibbs`` returns (and its result is dropped), no device array of a class's
    accumulator shape ``[n, B, S1, T]`` nor of its cell ids is alive: the chains' accumulators
    are freed, and the fertility aligner's HMM start's ``MCMC`` released, though NumPyro's
    module-level cache still holds that ``MCMC`` object."""
    corpus, _, _ = index_pairs(parse_parallel(TEXT * 5), batch=4, multiple=4)
    shapes = {c.cell.shape for c in corpus.classes}
    for model in ("hmm", "fertility"):
        earlier = jax.live_arrays()  # held, so that no new array takes one of their ids
        before = frozenset(id(a) for a in earlier)
        res = wa.run_gibbs(al.aligner(model), corpus, chains=2, warmup=1, samples=2, track=4,
                           progress=False, init_sweeps=1)
        assert len(res["marginals"]) == len(corpus.classes)
        del res
        left = shapes & _live_shapes(before)
        del earlier
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


def _small_corpus():
    """A 12-pair corpus on the device, with 6 tracked target words: ``(corpus, sizes, data,
    track)``."""
    corpus, _, _ = index_pairs(parse_parallel(TEXT * 3), batch=4, multiple=4)
    sizes, data = wa.device_corpus(corpus)
    return corpus, sizes, data, wa._track_indices(corpus, 6, 0)


def test_donated_chains_are_numpyros_mcmc():
    """``donated_chains`` runs the kernel as NumPyro's ``MCMC`` does: from the same key, the
    same kept draws (warm-up and thinning included) and the same final accumulators. Its
    ``samples`` are the draws *kept* (``samples · thinning`` sweeps after the warm-up, as
    ``wordalign --samples`` and ``--thin`` say); NumPyro's ``num_samples`` counts the sweeps."""
    corpus, sizes, data, track = _small_corpus()
    spec = al.aligner("ibm2", alpha=0.5, null_prior=0.0)
    key = jax.random.PRNGKey(3)
    mcmc = wa.gibbs_chains(spec, sizes, data, track, chains=1, warmup=2, samples=3 * 2,
                           thinning=2, progress=False, key=key)
    want = mcmc.get_samples(group_by_chain=True)
    want_marg = mcmc.last_state.marg
    (z, marg), = wa.donated_chains(wa.ConjugateGibbs(spec, sizes), [key], (data, track),
                                   warmup=2, samples=3, thinning=2, progress=False)
    assert set(z) == set(want)
    for name in z:
        assert z[name].shape == want[name].shape, name
        np.testing.assert_allclose(z[name], np.asarray(want[name]), rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    for got, ref in zip(marg, want_marg):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-6)


def test_chains_side_by_side_are_the_chains_one_after_another():
    """``donated_chains(parallel=2)`` (two threads, ``run_gibbs``'s default; three chains, so
    one waits for a thread) yields, in the keys' order, exactly what each key's chain yields
    alone: the same kept draws and the same final accumulators; and ``run_gibbs`` gives the
    same marginals and traces either way."""
    corpus, sizes, data, track = _small_corpus()
    spec = al.aligner("hmm", alpha=0.5, null_prior=0.0)
    keys = list(jax.random.split(jax.random.PRNGKey(5), 3))
    kernel = wa.ConjugateGibbs(spec, sizes)
    both = list(wa.donated_chains(kernel, keys, (data, track), warmup=2, samples=3,
                                  progress=False, parallel=2))
    for key, (z, marg) in zip(keys, both):
        (z1, marg1), = wa.donated_chains(kernel, [key], (data, track), warmup=2, samples=3,
                                         progress=False, parallel=1)
        for name in z:
            np.testing.assert_array_equal(z[name], z1[name], err_msg=name)
        for got, ref in zip(marg, marg1):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
    runs = [wa.run_gibbs(al.aligner("fertility", null_prior=0.0), corpus, chains=2, warmup=1,
                         samples=2, track=4, progress=False, init_sweeps=1,
                         parallel_chains=parallel)
            for parallel in (2, 1)]
    for a, b in zip(runs[0]["marginals"], runs[1]["marginals"]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(runs[0]["traces"]["loglik"], runs[1]["traces"]["loglik"])


def test_a_failing_chain_stops_the_chains_beside_it():
    """A chain that fails (here its ``init``, once the sweep is compiled) raises its own error
    from ``donated_chains``; the chain beside it still starts (its ``init`` runs), and the
    call returns rather than waiting on it."""
    import pytest

    corpus, sizes, data, track = _small_corpus()
    keys = list(jax.random.split(jax.random.PRNGKey(5), 2))
    started = []

    class FailsOnFirstKey(wa.ConjugateGibbs):
        def init(self, rng_key, *args, **kwargs):
            if isinstance(rng_key, jax.core.Tracer):  # the shapes the sweep compiles for
                return super().init(rng_key, *args, **kwargs)
            started.append(rng_key)
            if np.array_equal(np.asarray(rng_key), np.asarray(keys[0])):
                raise RuntimeError("chain 1 failed")
            return super().init(rng_key, *args, **kwargs)

    kernel = FailsOnFirstKey(al.aligner("ibm1", alpha=0.5), sizes)
    with pytest.raises(RuntimeError, match="chain 1 failed"):
        list(wa.donated_chains(kernel, keys, (data, track), warmup=2, samples=200,
                               progress=False, parallel=2))
    assert len(started) == 2
