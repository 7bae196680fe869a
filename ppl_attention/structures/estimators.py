"""Gradient estimators of E_q[f(z)] for a structure's distribution q = p(· | θ), written once over
an operation table: the ways to train a structured latent, set side by side on one objective.

For a structure (:class:`~.structure.Structure`, a dependency tree of either backend) with
potentials θ and a downstream function ``f`` of its event — ``f(events [n, *batch, *event]) →
[n, *batch]``, differentiable where a relaxation needs it —, :func:`gradient_draws` returns
``n`` single-draw estimates of ∇_θ E_q[f(z)] ``[n, *θ.shape]``:

- ``"score-function"``: (f(z_k) − b_k) ∇_θ log q(z_k), with the leave-one-out baseline
  b_k = mean of f over the other n − 1 draws (Kool, van Hoof & Welling 2019) — unbiased;
- ``"perturbed"``, ``"straight-through"``, ``"imle"``: the relaxations of
  :mod:`.perturbation` (options ``temperature``, ``noise``, ``noise_scale``, ``lam``), each
  ∇_θ f(z̃(θ, ε_k)) at its own noise — biased;
- ``"sparsemap"``: ∇_θ Σ_k p_k f(z_k) over SparseMAP's support (:mod:`.sparsemap`) — exact,
  deterministic, for SparseMAP's own distribution (another q: its "bias" against q = p(· | θ)
  is the difference between the two objectives, not noise).

:func:`exact_gradient` is ∇_θ Σ_z q(z) f(z) over every structure ``events [M, *batch, *event]``
(brute force, for the small models the estimators are measured on). ``benchmarks/
estimators.py`` tabulates bias (cosine and relative L2 error against it), variance per draw and
time per gradient; ``tests/structures/test_estimators.py`` holds the unbiased ones unbiased.
"""

from __future__ import annotations

from ..core.errors import UserError
from .perturbation import KINDS

__all__ = ["ESTIMATORS", "gradient_draws", "exact_gradient", "expectation"]

ESTIMATORS = ("score-function", *KINDS, "sparsemap")


def _dot(ops, event, theta, event_dims):
    x = event * theta
    for _ in range(event_dims):
        x = x.sum(-1)
    return x


def _log_prob(structure, theta, events):
    """log q(z) = ⟨z, θ⟩ − log Z(θ) of ``events [n, *batch, *event]`` at potentials θ
    ``[n, *batch, *event]``."""
    q = structure.at(theta)
    return _dot(structure.ops, events, theta, structure.event_dims) - q.log_z()


def expectation(structure, f, events):
    """E_q[f(z)] ``[*batch]`` over every structure ``events [M, *batch, *event]`` (each a
    structure of its row): Σ_z q(z) f(z), q(z) = exp(⟨z, θ⟩ − log Z)."""
    ops = structure.ops
    theta = structure.log_potentials
    th = ops.expand(theta[None], (events.shape[0],) + tuple(theta.shape))
    return (ops.exp(_log_prob(structure, th, events)) * f(events)).sum(0)


def exact_gradient(structure, f, events):
    """∇_θ E_q[f(z)] ``[*θ.shape]`` with every structure ``events`` enumerated."""
    ops = structure.ops
    return ops.grad(lambda th: expectation(structure.at(th), f, events),
                    ops.stop_gradient(structure.log_potentials))


def gradient_draws(structure, f, estimator: str, n: int, key=None, *, temperature: float = 1.0,
                   noise: str = "gumbel", noise_scale: float = 1.0, lam: float = 10.0,
                   max_active: int = 10):
    """``n`` single-draw estimates of ∇_θ E_q[f(z)], ``[n, *θ.shape]`` (module docstring);
    ``key``: NumPyro's PRNG key (torch: its generator)."""
    if estimator not in ESTIMATORS:
        raise UserError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {estimator!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or (
            estimator == "score-function" and n < 2):
        raise UserError(f"gradient_draws: n must be an integer ≥ "
                        f"{2 if estimator == 'score-function' else 1}, got {n!r}")
    ops = structure.ops
    theta = ops.stop_gradient(structure.log_potentials)
    if estimator == "sparsemap":
        def objective(th):
            q = structure.at(th)
            events, probs, _, _ = q.sparsemap_support(max_active)
            return (probs * f(events)).sum(0)
        g = ops.grad(objective, theta)
        return ops.expand(g[None], (n,) + tuple(theta.shape))
    thn = ops.expand(theta[None], (n,) + tuple(theta.shape))
    if estimator == "score-function":
        z = ops.stop_gradient(structure.sample_events(n, key))
        fz = ops.stop_gradient(f(z))  # [n, *batch]
        baseline = (fz.sum(0) - fz) / (n - 1)
        return ops.grad(lambda th: (fz - baseline) * _log_prob(structure, th, z), thn)
    settings = dict(temperature=temperature, noise=noise, noise_scale=noise_scale, lam=lam)
    return ops.grad(lambda th: f(structure.at(th).relaxed_sample(estimator, key=key,
                                                                  **settings)), thn)
