"""Diagnostics of the word aligners' discrete chains (``chain_diagnostics``): each tracked word
settled, stuck (each chain constant, the chains apart — where indicator R-hat is ∞) or moving,
the chains' disagreement (total variation of their link frequencies), and the ``mixed`` flag
with its advice, on hand-made traces whose answers are known. Planted fault w3 (no word ever
counted stuck): ``python tests/plant_faults.py w3`` → 1 failed."""

import numpy as np

from ppl_attention.numpyro.inference.word_alignment import chain_diagnostics


def _trace(rng, C=2, D=200):
    settled = np.full((C, D, 3), 4)
    stuck = np.stack([np.zeros((D, 1), int), np.full((D, 1), 2)])
    moving = rng.integers(0, 3, (C, D, 6))  # every chain the same distribution
    return np.concatenate([settled, stuck, moving], -1)


def test_settled_stuck_and_moving_words_are_counted():
    d = chain_diagnostics(_trace(np.random.default_rng(0)))
    assert (d["share_settled"], d["share_stuck"], d["share_moving"]) == (0.3, 0.1, 0.6)
    assert d["disagreement_max"] == 1.0  # the stuck word: two chains on two positions
    assert not d["mixed"] and "10.0 % of the tracked words are stuck" in d["advice"]
    assert "--chains" in d["advice"] and "--alpha" in d["advice"]


def test_chains_of_one_distribution_are_mixed():
    rng = np.random.default_rng(1)
    track = np.concatenate([np.full((4, 400, 2), 1), rng.integers(0, 4, (4, 400, 8))], -1)
    d = chain_diagnostics(track)
    assert d["mixed"] and d["advice"] == ""
    assert d["share_stuck"] == 0 and d["disagreement_max"] < 0.15


def test_chains_apart_but_moving_are_not_mixed():
    """Both chains move, around different positions: no stuck word, yet not mixed."""
    rng = np.random.default_rng(2)
    a = rng.choice([0, 1], (1, 300, 1), p=[0.9, 0.1])
    b = rng.choice([0, 1], (1, 300, 1), p=[0.1, 0.9])
    d = chain_diagnostics(np.concatenate([a, b]))
    assert d["share_stuck"] == 0 and d["share_moving"] == 1
    assert d["disagreement_max"] > 0.7 and not d["mixed"]


def test_one_chain_has_nothing_to_compare():
    d = chain_diagnostics(np.zeros((1, 10, 3), int))
    assert d["mixed"] is None and "--chains 2" in d["advice"]


def test_chains_tv_of_link_marginals_against_numpy():
    """``_class_summary``: per target word the largest total variation between two chains'
    link marginals and their mean, written out here over 3 chains' accumulated counts — one
    chain held as :func:`_half_mean`'s float16 marginals (as a finished chain waits for the
    next), two as int16 sums over the kept sweeps."""
    import jax.numpy as jnp

    from ppl_attention.numpyro.inference.word_alignment import _class_summary, _half_mean

    rng = np.random.default_rng(2)
    kept = 10
    m = np.stack([rng.multinomial(kept, [0.2, 0.5, 0.3], size=(2, 3, 4)) for _ in range(3)])
    m = np.moveaxis(m, -1, -2)  # [chains, n, B, S1 = 3, T = 4]
    want = np.zeros((2, 3, 4))
    for a in range(3):
        for b in range(a + 1, 3):
            want = np.maximum(want, 0.5 * np.abs(m[a] - m[b]).sum(-2) / kept)
    cls = {"src_mask": jnp.ones((2, 3, 3), bool), "tgt_mask": jnp.ones((2, 3, 4), bool),
           "cell": jnp.zeros((2, 3, 3, 4), jnp.int32)}
    held = _half_mean(jnp.asarray(m[0], jnp.float32), 1.0 / kept)
    assert held.dtype == jnp.float16
    mean, cells, worst = _class_summary(
        (held, jnp.asarray(m[1], jnp.int16), jnp.asarray(m[2], jnp.int16)),
        (1.0, 1.0 / kept, 1.0 / kept), cls, 1)
    np.testing.assert_allclose(np.asarray(worst), want, atol=1e-3)
    np.testing.assert_allclose(np.asarray(mean), m.mean(0) / kept, atol=1e-3)
    np.testing.assert_allclose(np.asarray(cells), [m.sum() / (3 * kept)], rtol=1e-4)


def test_chains_tv_stays_at_most_one_under_float16_rounding():
    """Two chains with disjoint links, one held in float16 whose rounding makes its word's
    marginals sum past 1 (0.7 and 0.3 both round up): their total variation is exactly 1 (the
    unnormalized values give 1.0001, which the final clip alone would hide) and the mean sums
    to 1 (the unnormalized chains' mean does not: planted fault z11)."""
    import jax.numpy as jnp

    from ppl_attention.numpyro.inference.word_alignment import _class_summary, _half_mean

    a = np.zeros((1, 1, 3, 1), np.float32)
    a[..., 0, 0], a[..., 1, 0] = 0.7, 0.3
    held = _half_mean(jnp.asarray(a), 1.0)
    assert float(np.asarray(held, np.float32).sum()) > 1.0001  # the rounding this is about
    b = np.zeros((1, 1, 3, 1), np.int16)
    b[..., 2, 0] = 4  # four kept sweeps, all on the third position
    cls = {"src_mask": jnp.ones((1, 1, 3), bool), "tgt_mask": jnp.ones((1, 1, 1), bool),
           "cell": jnp.zeros((1, 1, 3, 1), jnp.int32)}
    mean, _, worst = _class_summary((held, jnp.asarray(b)), (1.0, 0.25), cls, 1)
    assert float(worst.max()) <= 1.0
    np.testing.assert_allclose(np.asarray(worst), [[[1.0]]], atol=1e-6)
    np.testing.assert_allclose(np.asarray(mean).sum(-2), [[[1.0]]], atol=1e-6)


def test_corpus_wide_disagreement_flags_a_run():
    """Tracked words that all agree, but 2 % of the corpus's words whose chains' marginals lie
    further apart than the limit: not mixed, and the advice says so."""
    rng = np.random.default_rng(1)
    track = np.concatenate([np.full((4, 400, 2), 1), rng.integers(0, 4, (4, 400, 8))], -1)
    agreement = {"words": 5000, "marginal_tv_mean": 0.02, "marginal_tv_max": 0.9,
                 "share_marginal_tv_over": 0.02, "rao_blackwellized": True}
    d = chain_diagnostics(track, agreement)
    assert not d["mixed"] and d["words"] == 5000
    assert "2.0 % of the corpus's target words have chains' link marginals" in d["advice"]
    assert chain_diagnostics(track, {**agreement, "share_marginal_tv_over": 0.005})["mixed"]
    # drawn-link frequencies (HMM): reported, not held to the limit
    d = chain_diagnostics(track, {**agreement, "rao_blackwellized": False})
    assert d["mixed"] and d["share_marginal_tv_over"] == 0.02


def test_run_gibbs_reports_agreement_over_every_target_word():
    from ppl_attention.data.indexed import index_pairs
    from ppl_attention.numpyro import aligners as al
    from ppl_attention.numpyro.inference import word_alignment as wa

    pairs = [(["a", "b"], ["x", "y"]), (["c"], ["z"]), (["a", "c"], ["x", "z", "w"])] * 4
    corpus, _, _ = index_pairs(pairs, batch=4, multiple=4)
    res = wa.run_gibbs(al.aligner("ibm1", alpha=0.5), corpus, chains=3, warmup=2, samples=5,
                       track=4, progress=False)
    a = res["agreement"]
    assert a["words"] == sum(len(t) for _, t in pairs) and a["rao_blackwellized"]
    assert 0 <= a["marginal_tv_mean"] <= a["marginal_tv_max"] <= 1
    one = wa.run_gibbs(al.aligner("hmm", null_prior=0.0), corpus, chains=1, warmup=1, samples=2,
                       track=4, progress=False)
    assert one["agreement"] is None
