"""SparseMAP (ppl_attention/structures/sparsemap.py, the distributions of pyro/sparse.py and
numpyro/sparse.py) on a linear chain, a semi-Markov segmentation and a projective dependency
tree, on both backends, against a brute-force solution of its quadratic programme: every
structure enumerated, min ½‖Zᵀp − θ‖² over the simplex solved by SciPy. The marginals μ = Zᵀp
agree; every active structure is a structure of the row; the probabilities sum to 1; the
backward pass is the derivative of the solution (gradcheck / check_grads at a point where the
active set is stable, whose forward is the brute-force one); an enumerated ``log_prob`` gives
each slot its own probability; draws follow the probabilities; KL(q ‖ p) is exact.

Planted fault shown caught once (sm1): the final KKT solve of the active set left out (the
search loop's probabilities returned, with no gradient) — ``test_backward_is_the_derivative``
fails on both backends (a zero Jacobian against gradcheck's finite differences).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from brute_force import chain_events, dependency_trees, semi_markov_events
from jax.test_util import check_grads
from scipy.optimize import minimize

from ppl_attention.numpyro import crfs as jax_crfs
from ppl_attention.numpyro.trees import DependencyTree as JaxTree
from ppl_attention.pyro import crfs as torch_crfs
from ppl_attention.pyro.trees import DependencyTree as TorchTree
from ppl_attention.pyro.trees import heads_to_arcs

jax.config.update("jax_enable_x64", True)

BACKENDS = ["pyro", "numpyro"]


def _qp(Z, theta):
    """argmin_{μ ∈ conv(Z)} ½‖μ − θ‖² by SciPy over the weights of the rows of ``Z [M, D]``."""
    M = len(Z)
    res = minimize(lambda p: 0.5 * np.sum((Z.T @ p - theta) ** 2), np.full(M, 1 / M),
                   jac=lambda p: Z @ (Z.T @ p - theta), bounds=[(0, None)] * M,
                   constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1,
                                 "jac": lambda p: np.ones(M)}],
                   method="SLSQP", options={"ftol": 1e-16, "maxiter": 2000})
    return Z.T @ res.x


def _chain(seed=0):
    rng = np.random.default_rng(seed)
    theta = rng.standard_normal((3, 4, 3, 3)) * 0.7
    return "LinearChainCRF", theta, np.array([4, 3, 1])


def _semi_markov(seed=1):
    rng = np.random.default_rng(seed)
    theta = rng.standard_normal((2, 4, 2, 2, 2)) * 0.7
    return "SemiMarkovCRF", theta, np.array([4, 3])


def _tree(seed=2):
    rng = np.random.default_rng(seed)
    return "DependencyTree", rng.standard_normal((3, 4, 4)) * 0.7, np.array([4, 3, 2])


CASES = {"chain": _chain, "semi-markov": _semi_markov, "tree": _tree}


def _dist(backend, name, theta, lengths):
    if name == "DependencyTree":
        cls = TorchTree if backend == "pyro" else JaxTree
    else:
        cls = getattr(torch_crfs if backend == "pyro" else jax_crfs, name)
    if backend == "pyro":
        return cls(torch.tensor(theta), torch.tensor(lengths))
    return cls(jnp.asarray(theta), jnp.asarray(lengths))


def _np(x):
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _events(name, shape, L):
    """Every structure of a row of length L as flat events ``[M, D]`` (brute force)."""
    if name == "LinearChainCRF":
        ev = chain_events(shape, L)
    elif name == "SemiMarkovCRF":
        ev = semi_markov_events(shape, L)
    else:
        N = shape[-1]
        real = np.arange(N) < L
        ev = [heads_to_arcs(torch.tensor(h), torch.float64).numpy() * np.outer(real, real)
              for h in dependency_trees(N, L)]
    return np.asarray(ev, dtype=np.float64).reshape(len(ev), -1)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_equals_the_brute_force_quadratic_programme(backend, case):
    name, theta, lengths = CASES[case]()
    d = _dist(backend, name, theta, lengths)
    q = d.sparsemap()
    probs, mu, values = _np(q.probs), _np(q.marginals), _np(q.values)
    event = theta.shape[1:]
    floored = _np(d.trainable.log_potentials)
    assert np.all(_np(q.converged))
    for b, L in enumerate(lengths):
        Z = _events(name, event, int(L))
        ref = _qp(Z, floored[b].ravel())
        np.testing.assert_allclose(mu[b].ravel(), ref, atol=2e-5)
        assert probs[:, b].min() >= 0 and abs(probs[:, b].sum() - 1) < 1e-9
        active = probs[:, b] > 0
        assert active.sum() == int(_np(q.active)[b])
        got = values[active, b]
        real = np.arange(event[-1]) < L
        flat = got.reshape(len(got), -1) if name != "DependencyTree" else np.stack(
            [(heads_to_arcs(torch.tensor(h), torch.float64).numpy() * np.outer(real, real)
              ).ravel() for h in got])
        for row in flat:  # every active structure is one of the row's structures
            assert np.any(np.all(Z == row, 1))
        assert len({tuple(r) for r in flat}) == len(flat)  # each once


def _qp_statistic(Z, F, theta):
    """argmax_{μ ∈ conv(Z)} ⟨θ, μ⟩ − ½‖A μ‖² by SciPy over the weights of the rows of ``Z [M,
    D]``, ``F = Z Aᵀ [M, F]`` their statistics: the optimal statistic A μ (unique)."""
    M = len(Z)
    c = Z @ theta
    res = minimize(lambda p: 0.5 * np.sum((F.T @ p) ** 2) - p @ c, np.full(M, 1 / M),
                   jac=lambda p: F @ (F.T @ p) - c, bounds=[(0, None)] * M,
                   constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1,
                                 "jac": lambda p: np.ones(M)}],
                   method="SLSQP", options={"ftol": 1e-16, "maxiter": 2000})
    return F.T @ res.x


@pytest.mark.parametrize("statistic", ["event", "coverage"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_segment_selection_equals_the_brute_force_quadratic_programme(backend, statistic):
    """The segment family's potentials (:mod:`ppl_attention.structures.segment_selection`):
    most parts are no selection's (LOG_ZERO), which the search's tolerance must not count —
    regularized on the event, and on the coverage the potentials score (a few structures
    active at near-zero scores, where the event's quadratic fills the slots)."""
    from ppl_attention.structures import jax_ops, torch_ops
    from ppl_attention.structures.segment_selection import (
        coverage,
        coverage_statistics,
        selection_potentials,
    )

    rng = np.random.default_rng(7)
    scores, lengths, m = rng.standard_normal((3, 5)) * 0.6, np.array([5, 4, 2]), 2
    ops = torch_ops if backend == "pyro" else jax_ops
    conv = torch.tensor if backend == "pyro" else jnp.asarray
    cls = torch_crfs.SemiMarkovCRF if backend == "pyro" else jax_crfs.SemiMarkovCRF
    d = cls(selection_potentials(ops, conv(scores), m), conv(lengths))
    stats = coverage_statistics(ops) if statistic == "coverage" else None
    q = d.sparsemap(16, statistics=stats)
    assert np.all(_np(q.converged))
    floored = _np(d.trainable.log_potentials)
    live = np.where(floored > -1e29, floored, 0.0)
    got = _np(coverage(ops, q.marginals))
    for b, L in enumerate(lengths):
        Z = _events("SemiMarkovCRF", floored.shape[1:], int(L))
        Z = Z[(Z * (floored[b].ravel() <= -1e29)).sum(1) == 0]  # the selections (parts allowed)
        C = np.stack([_np(coverage(ops, conv(z.reshape(floored.shape[1:])))) for z in Z])
        F = C if statistic == "coverage" else Z
        ref = _qp_statistic(Z, F, live[b].ravel())
        want = ref  # the optimal coverage; on the event, the optimal μ's coverage:
        if statistic == "event":  # any weights p with Zᵀp = μ give it (coverage is linear)
            want = C.T @ np.linalg.lstsq(Z.T, ref, rcond=None)[0]
        np.testing.assert_allclose(got[b], want, atol=2e-5)
        assert int(_np(q.active)[b]) >= 2  # these scores are no vertex's: never one structure


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_is_the_derivative(backend, case):
    name, theta, lengths = CASES[case]()
    w = np.random.default_rng(5).standard_normal(theta.shape)
    if backend == "pyro":
        def f(th):
            return (_dist_t(name, th, lengths).sparsemap().marginals * torch.tensor(w)).sum()

        x = torch.tensor(theta, requires_grad=True)
        assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-5)
        return

    def g(th):
        d = JaxTree(th, jnp.asarray(lengths)) if name == "DependencyTree" else \
            getattr(jax_crfs, name)(th, jnp.asarray(lengths))
        return (d.sparsemap().marginals * w).sum()

    check_grads(g, (jnp.asarray(theta),), order=1, modes=["rev"], eps=1e-6, atol=1e-5)


def _dist_t(name, th, lengths):
    if name == "DependencyTree":
        return TorchTree(th, torch.tensor(lengths))
    return getattr(torch_crfs, name)(th, torch.tensor(lengths))


@pytest.mark.parametrize("backend", BACKENDS)
def test_enumerated_log_prob_and_draws(backend):
    name, theta, lengths = _chain(7)
    theta = theta * 0.3  # several structures active
    d = _dist(backend, name, theta, lengths)
    q = d.sparsemap()
    lp = _np(q.log_prob(q.enumerate_support()))
    probs = _np(q.probs)
    assert np.all(np.where(probs > 0, np.abs(np.exp(lp) - probs), 0) < 1e-12)
    assert np.all(lp[probs == 0] <= -1e29)  # the finite log 0 of an empty slot
    n = 4000
    draws = _np(q.sample((n,)) if backend == "pyro" else q.sample(jax.random.PRNGKey(0), (n,)))
    for b in range(len(lengths)):
        values = _np(q.values)[:, b]
        counts = np.array([np.all(draws[:, b] == v, axis=tuple(range(1, v.ndim + 1))).sum()
                           for v in values])
        # a structure held by several slots is counted in each: compare per distinct value
        for k in np.flatnonzero(probs[:, b] > 0):
            same = np.all(values == values[k], axis=tuple(range(1, values.ndim)))
            p = probs[same, b].sum()
            assert abs(counts[k] / n - p) <= 4 * np.sqrt(p * (1 - p) / n) + 1e-3
    kl = _np(torch.distributions.kl_divergence(q, d) if backend == "pyro" else
             jax_kl(q, d))
    ref = (probs * (np.where(probs > 0, np.log(np.where(probs > 0, probs, 1)), 0)
                    - _np(d.log_prob(q.values)))).sum(0)
    np.testing.assert_allclose(kl, ref, rtol=1e-9, atol=1e-12)


def jax_kl(q, p):
    from numpyro.distributions.kl import kl_divergence

    return kl_divergence(q, p)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_singular_working_set_is_solved_by_least_norm(backend):
    """The KKT system of an affinely dependent working set is singular (LU fails: it stopped a
    tree-sparsemap run in training); ``solve`` then gives the least-squares solution of least
    norm, and leaves the regular rows of the batch as LU solves them."""
    a = np.array([[[1.0, 1.0], [1.0, 1.0]], [[2.0, 0.0], [0.0, 4.0]]])
    b = np.array([[2.0, 2.0], [2.0, 2.0]])
    if backend == "pyro":
        from ppl_attention.structures import torch_ops as ops

        x = ops.solve(torch.tensor(a), torch.tensor(b)).numpy()
    else:
        from ppl_attention.structures import jax_ops as ops

        x = np.asarray(ops.solve(jnp.asarray(a), jnp.asarray(b)))
    np.testing.assert_allclose(x, [[1.0, 1.0], [1.0, 0.5]], atol=1e-12)
