"""Shared toy data and SVI loop for the per-family examples.

Data: S = 5 source values (points on a circle); each of N sequences has T = 4 target steps whose
true alignment z_t is drawn from a fixed table p*(z_t); y_t = v_{z_t} + 0.3 · noise. A model
learns the prior table (logits [T, S]); a guide scores source positions by distance to y_t.
"""

from __future__ import annotations

import math

import pyro
import torch
from pyro.distributions import constraints
from pyro.infer import SVI
from pyro.optim import Adam

S, T, N, NOISE = 5, 4, 200, 0.3
TRUE_TABLE = torch.tensor([
    [0.85, 0.05, 0.04, 0.03, 0.03],
    [0.05, 0.05, 0.80, 0.05, 0.05],
    [0.03, 0.04, 0.05, 0.05, 0.83],
    [0.40, 0.05, 0.05, 0.45, 0.05],
])


def make_data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    angles = torch.arange(S) * 2 * math.pi / S
    values = torch.stack([angles.cos(), angles.sin()], -1)  # [S, 2]
    z = torch.multinomial(TRUE_TABLE, N, replacement=True, generator=g).T  # [N, T]
    y = values[z] + NOISE * torch.randn(N, T, 2, generator=g)
    return values, y, z


def guide_scores(values: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """q-scores [N, T, S] = −a · ‖y_t − v_s‖² + b_{t,s}: an amortized inference network."""
    a = pyro.param("q_sharpness", torch.tensor(1.0), constraint=constraints.positive)
    b = pyro.param("q_bias", torch.zeros(T, S))
    return -a * ((y.unsqueeze(-2) - values) ** 2).sum(-1) + b


def prior_logits() -> torch.Tensor:
    return pyro.param("prior_logits", torch.zeros(T, S))


def train(model, guide, elbo, steps: int = 400, lr: float = 0.05, seed: int = 0) -> float:
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    svi = SVI(model, guide, Adam({"lr": lr}), elbo)
    losses = [svi.step() for _ in range(steps)]
    return sum(losses[-20:]) / 20 / (N * T)


def report(name: str, loss_per_token: float) -> None:
    learned = prior_logits().detach().softmax(-1)
    print(f"[{name}] final loss/token {loss_per_token:.3f}")
    print("learned alignment table softmax(logits) (rows t) vs the generating p*(z_t):")
    for t in range(T):
        row = " ".join(f"{p:.2f}" for p in learned[t])
        true = " ".join(f"{p:.2f}" for p in TRUE_TABLE[t])
        print(f"  t={t}: {row}   | true {true}")
    err = (learned - TRUE_TABLE).abs().max().item()
    print(f"max |learned − true| = {err:.3f}")
