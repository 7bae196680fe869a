"""``categorical_draws``: the draws follow each row's probabilities; a row with no mass (a padded
or end-of-sequence token, where a user's ``exact_posterior`` may be all 0) draws position 0
instead of stopping ``torch.multinomial`` ("sum of probabilities <= 0"); a NaN row is not
hidden."""

import pytest
import torch

from ppl_attention.pyro.distributions import categorical_draws


def test_rows_with_no_mass_draw_position_zero_and_the_others_their_probabilities():
    probs = torch.tensor([[0.2, 0.8, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    draws = categorical_draws(probs, 20000, torch.Generator().manual_seed(0))
    assert draws.shape == (3, 20000)
    assert (draws[1] == 0).all() and (draws[2] == 2).all()
    assert abs((draws[0] == 1).double().mean().item() - 0.8) < 0.015
    assert (draws[0] != 2).all()
    assert probs[1].sum() == 0  # the caller's tensor is left as it was
    with pytest.raises(RuntimeError):
        categorical_draws(torch.tensor([[float("nan"), 1.0]]), 3)
