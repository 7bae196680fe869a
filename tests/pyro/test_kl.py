"""Every registered closed-form KL against Monte Carlo (200k draws, 3 standard errors)."""

import pytest
import torch
from torch.distributions import Gamma, LogNormal, Weibull, kl_divergence

import ppl_attention as pa
from ppl_attention.pyro import kl as pkl
from ppl_attention.pyro.distributions import MaskedDirichlet

N = 200_000
D = torch.float64


def _mc(p, q, n=N):
    torch.manual_seed(0)
    x = p.sample((n,))
    d = p.log_prob(x) - q.log_prob(x)
    return d.mean(0), d.std(0) / n**0.5


CASES = {
    (Weibull, Gamma): [
        (Weibull(torch.tensor(0.7, dtype=D), torch.tensor(1.5, dtype=D)),
         Gamma(torch.tensor(2.0, dtype=D), torch.tensor(1.0, dtype=D))),
        (Weibull(torch.tensor(0.2, dtype=D), torch.tensor(10.0, dtype=D)),
         Gamma(torch.tensor(0.3, dtype=D), torch.tensor(1.0, dtype=D))),
        (Weibull(torch.tensor(2.0, dtype=D), torch.tensor(3.0, dtype=D)),
         Gamma(torch.tensor(0.5, dtype=D), torch.tensor(3.0, dtype=D))),
    ],
    (LogNormal, LogNormal): [
        (LogNormal(torch.tensor(0.1, dtype=D), torch.tensor(0.5, dtype=D)),
         LogNormal(torch.tensor(-0.3, dtype=D), torch.tensor(1.2, dtype=D))),
        (LogNormal(torch.tensor(-2.0, dtype=D), torch.tensor(0.05, dtype=D)),
         LogNormal(torch.tensor(-1.0, dtype=D), torch.tensor(0.3, dtype=D))),
    ],
    (MaskedDirichlet, MaskedDirichlet): [
        (MaskedDirichlet(torch.tensor([0.5, 2.0, 1.0, 3.0], dtype=D)),
         MaskedDirichlet(torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=D))),
        (MaskedDirichlet(torch.tensor([0.3, 4.0, 9.0, 1.0], dtype=D),
                         torch.tensor([True, True, False, True])),
         MaskedDirichlet(torch.tensor([2.0, 0.7, 5.0, 1.5], dtype=D),
                         torch.tensor([True, True, False, True]))),
    ],
}


def test_every_registered_kl_has_cases():
    assert set(CASES) == set(pkl.REGISTERED)


@pytest.mark.parametrize(
    "p,q", [pair for pairs in CASES.values() for pair in pairs],
    ids=lambda d: type(d).__name__,
)
def test_kl_matches_monte_carlo(p, q):
    analytic = kl_divergence(p, q)
    mc, se = _mc(p, q)
    assert torch.all((analytic - mc).abs() < 3 * se + 1e-6), (analytic, mc, se)
    assert torch.all(analytic > -1e-9)


def test_euler_constant():
    assert abs(pkl.EULER_GAMMA + torch.digamma(torch.tensor(1.0, dtype=D)).item()) < 1e-12


@pytest.mark.parametrize("family", [pa.Weibull(k=5.0, key_dim=3), pa.LogNormal(key_dim=3),
                                    pa.Dirichlet()])
def test_family_kl_is_masked_sum_of_position_kls(family):
    """kl_divergence(q, p) of a family's site: analytic, summed over unmasked positions only,
    and equal to a Monte Carlo estimate of E_q[log q − log p] on the masked site."""
    torch.manual_seed(3)
    scores, keys = torch.randn(2, 5, 4), torch.randn(2, 4, 3)
    mask = torch.tensor([[True] * 4, [True, False, True, False]]).unsqueeze(-2).expand(2, 5, 4)
    with torch.no_grad():
        q = family.posterior(torch.randn(2, 5, 4), mask, values=keys)
        p = family.prior(scores, mask, keys=keys, values=keys)
        kl = kl_divergence(q, p)
        assert kl.shape == (2, 5)
        x = q.sample((50_000,))
        d = q.log_prob(x) - p.log_prob(x)
        mc, se = d.mean(0), d.std(0) / 50_000**0.5
    assert torch.all((kl - mc).abs() < 3 * se + 1e-4), (kl, mc, se)
