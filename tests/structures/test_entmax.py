"""Sparsemax and α-entmax (ppl_attention/structures/entmax.py) on both backends: equal to an
independent solution of their variational problem (the Euclidean projection for sparsemax, the
Tsallis-regularized argmax by SciPy for α-entmax) and to the ``entmax`` package where it is
installed (an optional test dependency); exact zeros, masked positions exactly 0; Jacobians
that pass ``torch.autograd.gradcheck`` and ``jax.test_util.check_grads`` — in the scores and, for
a learned α, in α.

Planted fault shown caught once (e1): ``entmax_bisect`` without its implicit-gradient Newton step
(τ held constant, ``tau = tau - g / g_tau`` removed) — the value is unchanged, the Jacobian is
not: ``test_jacobians_pass_gradcheck[bisect-pyro]`` and ``[bisect-numpyro]`` fail (the torch
gradcheck reports a Jacobian mismatch, JAX's check_grads a mismatch of the VJP).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.test_util import check_grads
from scipy.optimize import minimize

from ppl_attention.core.errors import UserError
from ppl_attention.structures import jax_ops, torch_ops
from ppl_attention.structures.entmax import entmax, entmax15, entmax_bisect, sparsemax

jax.config.update("jax_enable_x64", True)

BACKENDS = ["pyro", "numpyro"]


def _scores(seed=0, rows=6, S=7, scale=2.0):
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((rows, S)) * scale
    mask = np.ones((rows, S), bool)
    mask[1, 4:] = False  # padding at the end
    mask[2, 1:] = False  # one real position
    mask[3, ::2] = False  # masked in the middle too
    z[4] = z[4, 0]  # ties: every score equal
    return z, mask


def _run(backend, fn, z, mask, *args):
    if backend == "pyro":
        return fn(torch_ops, torch.tensor(z), torch.tensor(mask), *args).numpy()
    return np.asarray(fn(jax_ops, jnp.asarray(z), jnp.asarray(mask), *args))


def _tsallis_argmax(z, alpha):
    """argmax_{p ∈ Δ} ⟨p, z⟩ + Σ_j (p_j − p_j^α) / (α(α − 1)) by SciPy (SLSQP), for one row."""
    S = len(z)

    def neg(p):
        p = np.clip(p, 0, None)
        return -(p @ z + (p - p ** alpha).sum() / (alpha * (alpha - 1)))

    res = minimize(neg, np.full(S, 1 / S), method="SLSQP", bounds=[(0, 1)] * S,
                   constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1}],
                   options={"ftol": 1e-15, "maxiter": 500})
    return np.clip(res.x, 0, None)


def _projection(z):
    """The Euclidean projection of z on the simplex (Held et al.'s sort, written in NumPy)."""
    u = np.sort(z)[::-1]
    css = np.cumsum(u)
    k = np.arange(1, len(z) + 1)
    rho = k[u - (css - 1) / k > 0][-1]
    return np.maximum(z - (css[rho - 1] - 1) / rho, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sparsemax_is_the_projection_with_exact_zeros(backend):
    z, mask = _scores()
    p = _run(backend, sparsemax, z, mask)
    for r in range(len(z)):
        ref = np.zeros(z.shape[1])
        ref[mask[r]] = _projection(z[r][mask[r]])
        np.testing.assert_allclose(p[r], ref, atol=1e-12)
    assert np.all(p[~mask] == 0.0) and (p == 0.0).sum() > (~mask).sum()  # zeros beyond padding
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-12)


@pytest.mark.parametrize("alpha", [1.2, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("backend", BACKENDS)
def test_entmax_solves_its_variational_problem(backend, alpha):
    z, mask = _scores(1)
    for p in (_run(backend, entmax, z, mask, alpha),
              _run(backend, entmax_bisect, z, mask, alpha)):
        for r in range(len(z)):
            ref = np.zeros(z.shape[1])
            ref[mask[r]] = _tsallis_argmax(z[r][mask[r]], alpha)
            np.testing.assert_allclose(p[r], ref, atol=2e-5)
        assert np.all(p[~mask] == 0.0)
        np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_equal_to_the_entmax_package(backend):
    entmax_pkg = pytest.importorskip("entmax", reason="the entmax package is an optional peer")
    z, mask = _scores(2, rows=32, S=9)
    zt = torch.tensor(z).masked_fill(~torch.tensor(mask), -1e30)
    pairs = [(sparsemax, (), entmax_pkg.sparsemax(zt, dim=-1)),
             (entmax15, (), entmax_pkg.entmax15(zt, dim=-1))]
    for a in (1.1, 1.5, 2.5):
        pairs.append((entmax_bisect, (a,), entmax_pkg.entmax_bisect(zt, alpha=a, dim=-1,
                                                                    n_iter=100)))
    for fn, args, ref in pairs:
        p = _run(backend, fn, z, mask, *args)
        np.testing.assert_allclose(p, ref.numpy(), atol=1e-9)
        assert np.array_equal(p == 0, ref.numpy() == 0)  # the same exact zeros


JACOBIAN_CASES = {"sparsemax": (sparsemax, ()), "entmax15": (entmax15, ()),
                  "bisect": (entmax_bisect, (1.3,))}


@pytest.mark.parametrize("case", list(JACOBIAN_CASES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_jacobians_pass_gradcheck(backend, case):
    fn, args = JACOBIAN_CASES[case]
    z, mask = _scores(3)
    z[4] += np.linspace(0, 0.3, z.shape[1])  # no ties (the Jacobian is a subgradient there)
    if backend == "pyro":
        zt = torch.tensor(z, requires_grad=True)
        mt = torch.tensor(mask)
        assert torch.autograd.gradcheck(lambda x: fn(torch_ops, x, mt, *args), (zt,))
        if case != "bisect":  # the sorted forms are exact twice over (attention through them)
            assert torch.autograd.gradgradcheck(lambda x: fn(torch_ops, x, mt, *args), (zt,))
        return
    mj = jnp.asarray(mask)
    check_grads(lambda x: fn(jax_ops, x, mj, *args), (jnp.asarray(z),), order=1,
                modes=["fwd", "rev"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_learned_alpha_has_its_exact_gradient(backend):
    z, mask = _scores(4)
    z[4] += np.linspace(0, 0.3, z.shape[1])
    alpha = np.full((len(z), 1), 1.4)
    if backend == "pyro":
        zt, at = torch.tensor(z, requires_grad=True), torch.tensor(alpha, requires_grad=True)
        mt = torch.tensor(mask)
        assert torch.autograd.gradcheck(lambda x, a: entmax_bisect(torch_ops, x, mt, a),
                                        (zt, at))
        return
    mj = jnp.asarray(mask)
    check_grads(lambda x, a: entmax_bisect(jax_ops, x, mj, a),
                (jnp.asarray(z), jnp.asarray(alpha)), order=1, modes=["rev"])


def test_alpha_at_most_one_is_refused():
    z, mask = _scores()
    for bad in (1.0, 0.5, float("nan"), True):
        with pytest.raises(UserError, match="alpha"):
            entmax(torch_ops, torch.tensor(z), torch.tensor(mask), bad)


def test_a_score_on_the_support_edge_gets_one_jacobian_on_both_backends():
    """Scores −λ·|t − i| on a grid of relative positions (the tutorial model's diagonal prior,
    λ = exp(log 4)) put a score exactly on the threshold (sparsemax: τ_1 = z_1 − 1 = z_2), where
    the map is not differentiable: Pyro in float64 and NumPyro in float32 must take the same
    side (the score left out), so that a twin's gradients agree. Planted fault (sm3):
    sparsemax's p = max(z − τ, 0) instead of z − τ above the edge — a tie gives half a
    derivative (torch's and JAX's max split it), and the backends' Jacobians differ.
    (1.5-entmax is differentiable there: p = [z/2 − τ]²₊ has derivative 0 on the edge from
    either side.)"""
    fn = sparsemax
    pos = (np.arange(4) + 0.5) / 4
    grid = np.abs(pos[:, None] - pos[None, :])
    w = np.random.default_rng(0).standard_normal((4, 4))

    def torch_jacobian_product():
        lam = torch.tensor(4.0, dtype=torch.float64).log().exp()
        z = (-lam * torch.tensor(grid)).requires_grad_(True)
        (fn(torch_ops, z) * torch.tensor(w)).sum().backward()
        return z.grad.numpy()

    def jax_jacobian_product():
        lam = jnp.exp(jnp.log(jnp.float32(4.0)))
        z = -lam * jnp.asarray(grid, jnp.float32)
        return np.asarray(jax.grad(lambda z: (fn(jax_ops, z) * jnp.asarray(w, jnp.float32))
                                   .sum())(z))

    np.testing.assert_allclose(jax_jacobian_product(), torch_jacobian_product(), atol=1e-5)
