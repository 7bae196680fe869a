"""The differentiable draws of every structure (ppl_attention/structures/perturbation.py) on
both backends, against brute force at a given noise ε (common random numbers): perturbed
marginals at τ are the softmax over every structure of ⟨z, θ + ε⟩/τ averaged into parts, and
tend to the perturbed MAP as τ → 0; straight-through's forward is the perturbed MAP and its
gradient the perturbed marginals'; implicit MLE's forward is the perturbed MAP and its backward
(z*(θ + ε) − z*(θ + ε − λg)) / λ; both backends give the same numbers; bad settings are refused.

Planted fault shown caught once (p1): the temperature multiplied instead of divided
(``(theta + eps) * temperature``) — ``test_perturbed_marginals_equal_brute_force`` fails on
both backends.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from brute_force import chain_structures, dependency_trees

from ppl_attention.core.errors import UserError
from ppl_attention.numpyro import crfs as jax_crfs
from ppl_attention.numpyro.trees import DependencyTree as JaxTree
from ppl_attention.pyro import crfs as torch_crfs
from ppl_attention.pyro.trees import DependencyTree as TorchTree

jax.config.update("jax_enable_x64", True)

BACKENDS = ["pyro", "numpyro"]


def _chain(backend, theta, lengths):
    cls = torch_crfs.LinearChainCRF if backend == "pyro" else jax_crfs.LinearChainCRF
    conv = torch.tensor if backend == "pyro" else jnp.asarray
    return cls(conv(theta), conv(lengths))


def _np(x):
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _setting(seed=0):
    rng = np.random.default_rng(seed)
    theta = rng.standard_normal((2, 4, 3, 3))
    eps = rng.gumbel(size=theta.shape)
    return theta, np.array([4, 3]), eps


def _brute(theta, lengths, eps, tau):
    """Per row: (the softmax-weighted mean event at (θ + ε)/τ, the best event at θ + ε)."""
    means, best = [], []
    for b, L in enumerate(lengths):
        evs = np.array([ev for ev, _ in chain_structures(4, 3, int(L))])
        s = (evs * (theta[b] + eps[b])).sum((1, 2, 3))
        w = np.exp((s - s.max()) / tau)
        means.append((w[:, None, None, None] * evs).sum(0) / w.sum())
        best.append(evs[s.argmax()])
    return np.stack(means), np.stack(best)


@pytest.mark.parametrize("tau", [1.0, 0.3])
@pytest.mark.parametrize("backend", BACKENDS)
def test_perturbed_marginals_equal_brute_force(backend, tau):
    theta, lengths, eps = _setting()
    d = _chain(backend, theta, lengths)
    z = _np(d.relaxed_sample("perturbed", tau, perturbation=eps))
    ref, _ = _brute(theta, lengths, eps, tau)
    np.testing.assert_allclose(z, ref, atol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_perturbed_marginals_tend_to_the_perturbed_map(backend):
    theta, lengths, eps = _setting(1)
    d = _chain(backend, theta, lengths)
    _, best = _brute(theta, lengths, eps, 1.0)
    gaps = [np.abs(_np(d.relaxed_sample("perturbed", tau, perturbation=eps)) - best).max()
            for tau in (1.0, 0.1, 0.01)]
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 1e-3, gaps


@pytest.mark.parametrize("backend", BACKENDS)
def test_straight_through_and_imle(backend):
    theta, lengths, eps = _setting(2)
    _, best = _brute(theta, lengths, eps, 1.0)
    w = np.random.default_rng(3).standard_normal(theta.shape)
    lam = 2.0
    if backend == "pyro":
        def grad(kind, **kw):
            th = torch.tensor(theta, requires_grad=True)
            z = torch_crfs.LinearChainCRF(th, torch.tensor(lengths)).relaxed_sample(
                kind, 0.5, perturbation=torch.tensor(eps), **kw)
            (g,) = torch.autograd.grad((z * torch.tensor(w)).sum(), th)
            return z.detach().numpy(), g.numpy()
    else:
        def grad(kind, **kw):
            def f(th):
                z = jax_crfs.LinearChainCRF(th, jnp.asarray(lengths)).relaxed_sample(
                    kind, 0.5, perturbation=jnp.asarray(eps), **kw)
                return (z * w).sum(), z
            (_, z), g = jax.value_and_grad(f, has_aux=True)(jnp.asarray(theta))
            return np.asarray(z), np.asarray(g)
    z, g = grad("straight-through")
    np.testing.assert_allclose(z, best, atol=1e-12)  # the hard perturbed MAP forward
    _, g_soft = grad("perturbed")
    np.testing.assert_allclose(g, g_soft, atol=1e-10)  # the relaxation's gradient backward
    z, g = grad("imle", lam=lam)
    np.testing.assert_allclose(z, best, atol=1e-12)
    _, target = _brute(theta - lam * w, lengths, eps, 1.0)  # the MAP at θ + ε − λ·∂L/∂z
    np.testing.assert_allclose(g, (best - target) / lam, atol=1e-12)


def test_both_backends_agree_on_a_tree():
    rng = np.random.default_rng(4)
    theta, eps, lengths = rng.standard_normal((3, 5, 5)), rng.gumbel(size=(3, 5, 5)), [5, 4, 2]
    outs = []
    for tree, conv in ((TorchTree, torch.tensor), (JaxTree, jnp.asarray)):
        d = tree(conv(theta), conv(np.array(lengths)))
        outs.append([_np(d.relaxed_sample(k, 0.4, perturbation=conv(eps)))
                     for k in ("perturbed", "straight-through", "imle")])
    for a, b in zip(*outs):
        np.testing.assert_allclose(a, b, atol=1e-10)
    # the hard draws are trees: one head per real word
    hard = outs[0][1]
    for r, L in enumerate(lengths):
        assert np.allclose(hard[r][:, :L].sum(0), 1) and np.allclose(hard[r][:, L:], 0)
        heads = tuple(int(h) for h in hard[r][:L, :L].argmax(0)) + tuple(range(L, 5))
        assert list(heads) in dependency_trees(5, L)


def test_bad_settings_are_refused():
    theta, lengths, eps = _setting()
    d = _chain("pyro", theta, lengths)
    for kw, what in (({"temperature": 0.0}, "temperature"), ({"temperature": -1.0},
                     "temperature"), ({"lam": 0.0}, "imle_lambda"), ({"noise": "normal"},
                     "noise"), ({"noise_scale": 0}, "noise_scale")):
        with pytest.raises(UserError, match=what):
            d.relaxed_sample("perturbed", **kw)
    with pytest.raises(UserError, match="relaxation must be one of"):
        d.relaxed_sample("gumbel-softmax")
    with pytest.raises(UserError, match="perturbation of shape"):
        d.relaxed_sample("perturbed", perturbation=torch.tensor(eps[:1]))
