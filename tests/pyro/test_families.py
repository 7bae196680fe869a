import pytest
import torch
from torch.distributions import Dirichlet, RelaxedOneHotCategorical

import ppl_attention as pa
from ppl_attention.pyro.distributions import MaskedDirichlet, MaskedRelaxedCategorical

D = torch.float64


def _draw_weights(family, scores, n=2000):
    mask = torch.ones(scores.shape, dtype=torch.bool)
    fn = family.posterior(scores, mask, values=None)
    return family.weights(fn.sample((n,)), scores, mask)


def test_weibull_large_k_gives_softmax():
    scores = torch.tensor([[1.0, -0.5, 2.0, 0.3]])
    soft = scores.softmax(-1)
    loose = _draw_weights(pa.Weibull(k=3.0), scores)
    tight = _draw_weights(pa.Weibull(k=2000.0), scores)
    assert (tight - soft).abs().max() < 5e-3
    assert (loose - soft).abs().max() > 0.1  # small k really is random
    assert loose.std(0).mean() > 20 * tight.std(0).mean()


def test_lognormal_small_sigma_gives_softmax():
    scores = torch.tensor([[0.2, 1.5, -1.0]])
    soft = scores.softmax(-1)
    tight = _draw_weights(pa.LogNormal(sigma=1e-3), scores)
    loose = _draw_weights(pa.LogNormal(sigma=1.0), scores)
    assert (tight - soft).abs().max() < 5e-3
    assert (loose - soft).abs().max() > 0.1


@pytest.mark.parametrize("family", [pa.Weibull(k=4.0), pa.LogNormal(sigma=0.3)])
def test_bam_posterior_mean_of_unnormalized_weights_is_softmax(family):
    scores = torch.tensor([[0.5, -1.0, 2.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    fn = family.posterior(scores, mask, values=None)
    torch.manual_seed(0)
    s = fn.sample((200_000,))
    assert torch.allclose(s.mean(0), scores.softmax(-1), atol=5e-3)


def test_masked_dirichlet_equals_torch_dirichlet():
    torch.manual_seed(0)
    a = torch.tensor([0.4, 2.0, 1.3, 5.0], dtype=D)
    x = Dirichlet(a).sample((5,))
    full = MaskedDirichlet(a)
    assert torch.allclose(full.log_prob(x), Dirichlet(a).log_prob(x))
    assert torch.allclose(full.entropy(), Dirichlet(a).entropy())
    mask = torch.tensor([True, False, True, True])
    sub = Dirichlet(a[mask]).sample((5,))
    x = torch.zeros(5, 4, dtype=D)
    x[:, mask] = sub
    masked = MaskedDirichlet(a, mask)
    assert torch.allclose(masked.log_prob(x), Dirichlet(a[mask]).log_prob(sub))
    assert torch.allclose(masked.entropy(), Dirichlet(a[mask]).entropy())
    draws = masked.rsample((1000,))
    assert torch.all(draws[:, 1] == 0)
    assert torch.allclose(draws.mean(0), masked.mean, atol=0.03)


def test_masked_relaxed_equals_torch_relaxed():
    torch.manual_seed(0)
    logits = torch.tensor([0.3, -1.0, 1.2, 0.0], dtype=D)
    tau = 0.7
    d = MaskedRelaxedCategorical(tau, logits)
    x = d.rsample((6,))
    ref = RelaxedOneHotCategorical(torch.tensor(tau, dtype=D), logits=logits)
    assert torch.allclose(d.log_prob(x), ref.log_prob(x.detach().clone()), atol=1e-8)
    mask = torch.tensor([True, True, False, True])
    dm = MaskedRelaxedCategorical(tau, logits, mask)
    xm = dm.rsample((6,))
    assert torch.all(xm[:, 2] == 0)
    ref_sub = RelaxedOneHotCategorical(torch.tensor(tau, dtype=D), logits=logits[mask])
    assert torch.allclose(dm.log_prob(xm), ref_sub.log_prob(xm[:, mask].clone()), atol=1e-8)


def test_relaxed_log_prob_survives_underflow():
    """At τ = 0.05 coordinates underflow to 0 in float32; the carried log keeps log_prob finite
    and equal to the float64 value."""
    torch.manual_seed(1)
    logits = torch.tensor([3.0, -4.0, 0.0, 1.0])
    d = MaskedRelaxedCategorical(0.05, logits)
    x = d.rsample((200,))
    assert (x == 0).any()
    lp = d.log_prob(x)
    assert torch.isfinite(lp).all()
    d64 = MaskedRelaxedCategorical(0.05, logits.double())
    x64 = x._pa_log_value.double().exp()
    x64._pa_log_value = x._pa_log_value.double()
    assert torch.allclose(lp.double(), d64.log_prob(x64), rtol=1e-4, atol=1e-2)


def test_reparameterized_families_have_pathwise_gradients():
    torch.manual_seed(0)
    for family in [pa.RelaxedCategorical(), pa.Dirichlet(), pa.Weibull(), pa.LogNormal()]:
        scores = torch.randn(2, 3, 5, requires_grad=True)
        mask = torch.ones(2, 3, 5, dtype=torch.bool)
        w = family.weights(family.posterior(scores, mask, values=None).rsample(), scores, mask)
        (w * torch.arange(5.0)).sum().backward()
        assert scores.grad is not None and torch.isfinite(scores.grad).all()
        assert scores.grad.abs().sum() > 0, family


@pytest.mark.parametrize(
    "make,arg",
    [
        (lambda: pa.RelaxedCategorical(temperature=0.0), "temperature"),
        (lambda: pa.RelaxedCategorical(temperature=-1.0), "temperature"),
        (lambda: pa.Dirichlet(concentration=0), "concentration"),
        (lambda: pa.Weibull(k=-2.0), "k"),
        (lambda: pa.Weibull(beta=float("nan")), "beta"),
        (lambda: pa.LogNormal(sigma=0.0), "sigma"),
        (lambda: pa.Weibull(prior="flat"), "prior"),
        (lambda: pa.GaussianContext(prior="bogus"), "prior"),
    ],
)
def test_bad_family_arguments(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()


def test_unknown_family_lists_valid_names():
    with pytest.raises(ValueError, match="unknown family 'hardmax'.*categorical"):
        pa.make_family("hardmax")
    with pytest.raises(ValueError, match="unknown family"):
        pa.make_family(3.0)
    assert isinstance(pa.make_family("weibull"), pa.Weibull)
    assert isinstance(pa.make_family(pa.Dirichlet), pa.Dirichlet)


def test_position_log_probs_scores_every_position_of_a_sparse_q():
    """``position_log_probs`` (what analyze / calibrate / diagnose read of a categorical guide):
    every source position of a sparse q under a target mask, not only its enumerated support
    (which is the positions of the largest support in the batch: here 2 of 4)."""
    from ppl_attention.pyro.distributions import position_log_probs
    from ppl_attention.pyro.sparse import SparsemaxCategorical

    p = torch.tensor([[[0.7, 0.3, 0.0, 0.0]], [[0.0, 0.0, 0.4, 0.6]]])
    fn = SparsemaxCategorical(p).mask(torch.tensor([[True], [True]]))
    assert fn.enumerate_support(expand=False).shape[0] == 2
    q = position_log_probs(fn, (2, 1)).exp()
    assert q.shape == (2, 1, 4)
    torch.testing.assert_close(q, p)
