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
