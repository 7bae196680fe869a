"""The gradient estimators of ppl_attention/structures/estimators.py against the exact gradient
of E_q[f(z)] (every structure enumerated by brute force), on both backends: the score function
is unbiased on a chain and a tree (the exact gradient inside its confidence interval, drawn in
pairs — the smallest leave-one-out baseline); the relaxed categorical (perturbed marginals:
Gumbel-softmax) has a bias that shrinks as τ → 0; every estimator's draws are finite.

Planted faults shown caught once: (x1) the baseline that leaves the draw out replaced by the
mean of all draws, itself included (``baseline = fz.sum(0) / n``) — the estimate shrinks by
(n − 1)/n, a half for pairs: ``test_score_function_is_unbiased`` fails for every model and
backend; (x2) the temperature multiplied instead of divided in the perturbed marginals —
``test_relaxed_categorical_bias_shrinks_as_the_temperature_falls`` fails on both backends.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from brute_force import chain_events, dependency_trees

from ppl_attention.numpyro import crfs as jax_crfs
from ppl_attention.numpyro.trees import DependencyTree as JaxTree
from ppl_attention.pyro import crfs as torch_crfs
from ppl_attention.pyro.trees import DependencyTree as TorchTree
from ppl_attention.structures.estimators import ESTIMATORS, exact_gradient, gradient_draws

jax.config.update("jax_enable_x64", True)

BACKENDS = ["pyro", "numpyro"]


def _problem(model, seed=0):
    rng = np.random.default_rng(seed)
    if model == "categorical":
        theta = np.zeros((1, 6, 6))
        theta[0, 0] = rng.standard_normal(6)
        events = np.asarray(chain_events((1, 6, 6), 1))
    elif model == "chain":
        theta = rng.standard_normal((4, 3, 3))
        events = np.asarray(chain_events((4, 3, 3), 4))
    else:
        theta = rng.standard_normal((4, 4))
        trees = dependency_trees(4, 4)
        events = np.zeros((len(trees), 4, 4))
        for k, heads in enumerate(trees):
            events[k, heads, np.arange(4)] = 1.0
    W = rng.standard_normal((theta.size, 3)) / 2
    y = rng.standard_normal(3)
    return theta, events, W, y


def _setup(backend, model):
    theta, events, W, y = _problem(model)
    dims = theta.ndim
    if backend == "pyro":
        Wt, yt = torch.as_tensor(W), torch.as_tensor(y)

        def f(ev):
            return ((torch.tanh(ev.reshape(*ev.shape[:ev.ndim - dims], -1) @ Wt) - yt) ** 2
                    ).sum(-1)

        def structure():
            t = torch.as_tensor(theta)
            return TorchTree(t).trainable if model == "tree" else \
                torch_crfs.LinearChainCRF(t).structure

        exact = exact_gradient(structure(), f, torch.as_tensor(events)).numpy()

        def draws(name, n, seed=0, **kw):
            torch.manual_seed(seed)
            return gradient_draws(structure(), f, name, n, **kw).numpy()
        return exact, draws
    Wj, yj = jnp.asarray(W), jnp.asarray(y)

    def f(ev):
        return ((jnp.tanh(ev.reshape(*ev.shape[:ev.ndim - dims], -1) @ Wj) - yj) ** 2).sum(-1)

    def structure():
        t = jnp.asarray(theta)
        return JaxTree(t).trainable if model == "tree" else jax_crfs.LinearChainCRF(t).structure

    exact = np.asarray(exact_gradient(structure(), f, jnp.asarray(events)))
    compiled = {}

    def draws(name, n, seed=0, **kw):  # jitted once per setting (eager JAX traces every call)
        key = (name, n, tuple(sorted(kw.items())))
        if key not in compiled:
            compiled[key] = jax.jit(lambda k: gradient_draws(structure(), f, name, n, k, **kw))
        return np.asarray(compiled[key](jax.random.PRNGKey(seed)))
    return exact, draws


@pytest.mark.parametrize("model", ["chain", "tree"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_score_function_is_unbiased(backend, model):
    """In pairs (each draw's baseline the other's), 1,500 pairs: along three random directions
    the mean is within 4 standard errors of the exact gradient."""
    exact, draws = _setup(backend, model)
    g = np.concatenate([draws("score-function", 2, seed=s).reshape(2, -1)
                        for s in range(1500)]) if backend == "pyro" else \
        _pairs_jax(draws)
    V = np.random.default_rng(1).standard_normal((3, g.shape[1]))
    proj = g @ V.T
    mean, se = proj.mean(0), proj.std(0, ddof=1) / math.sqrt(len(proj))
    assert np.all(np.abs(mean - V @ exact.ravel()) <= 4 * se), (mean, V @ exact.ravel(), se)


def _pairs_jax(draws):
    return np.concatenate([draws("score-function", 2, seed=s).reshape(2, -1)
                           for s in range(1500)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_relaxed_categorical_bias_shrinks_as_the_temperature_falls(backend):
    """Perturbed marginals of a categorical are Gumbel-softmax: a consistent estimator as
    τ → 0 — the bias of the mean gradient (4,000 draws) falls with τ, and at τ = 0.05 it is
    within its Monte Carlo noise of 0."""
    exact, draws = _setup(backend, "categorical")
    norm = np.linalg.norm(exact)
    errors, noises = [], []
    for tau in (1.0, 0.3, 0.05):
        g = draws("perturbed", 4000, temperature=tau).reshape(4000, -1)
        errors.append(np.linalg.norm(g.mean(0) - exact.ravel()) / norm)
        noises.append(np.sqrt(((g - g.mean(0)) ** 2).sum(1).mean() / 4000) / norm)
    assert errors[0] > errors[1] > noises[1], (errors, noises)
    assert errors[2] <= 3 * noises[2], (errors, noises)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_estimator_runs(backend):
    exact, draws = _setup(backend, "tree")
    for name in ESTIMATORS:
        g = draws(name, 50)
        assert g.shape == (50, *exact.shape) and np.all(np.isfinite(g)), name
