"""A structure of the library as the latent site of a user's own model, on both backends:

- the exact likelihood of evidence that factors over the parts, log p(y) = log Z(θ + φ) −
  log Z(θ) (``marginal_log_likelihood``), and the exact posterior, the same structure over
  θ + φ (``posterior``), against brute-force enumeration of every structure (float64, ragged
  lengths), for the linear chain, the semi-Markov CRF, the constituency tree CRF and the
  dependency tree; CTC, whose potentials are normalized per frame, refuses both in one line;
- the score-function ELBO with the exact KL on a model written as a user writes one (a
  ``pyro.sample`` / ``numpyro.sample`` site, a ``pyro.factor`` / ``numpyro.factor`` for the
  evidence, a guide with its own potentials): its gradient, averaged over draws, equals the
  exact gradient of the closed-form ELBO ⟨μ_q, φ⟩ − KL(q ‖ p) — the package's
  ``ScoreFunctionKL_ELBO`` on both backends (NumPyro's under ``SVI`` too) and NumPyro's own
  ``TraceGraph_ELBO`` (which scores the draw and estimates the KL by sampling).

Planted faults (``python tests/plant_faults.py l1 l2 l3 l4 l5``): l1 the posterior's potentials
without the evidence → 6 failed (every structure, both backends); l2 the score-function term of
``ScoreFunctionKL_ELBO`` dropped → the Pyro gradient test fails (fast and full form); l3 the
NumPyro structures without ``has_rsample = False`` (NumPyro then takes them as reparameterized
and its ELBO the zero pathwise gradient of a discrete draw — the defect this test found) → the
NumPyro ``TraceGraph_ELBO`` gradient test fails; l4 the NumPyro ``ScoreFunctionKL_ELBO``
without its score-function term → its gradient test fails; l5 Pyro's estimator summing the
vectorized particles' rewards and scores apart before their product (as it did) → the spread
test fails.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pyro
import pytest
import torch
from brute_force import chain_structures, semi_markov_structures, tree_crf_structures
from on_backends import BACKENDS, arr, conv, make

from ppl_attention.core.errors import UserError
from ppl_attention.core.heads import enumerate_trees

jax.config.update("jax_enable_x64", True)

SHAPES = {  # name: (potentials shape per row, every structure of a length)
    "LinearChainCRF": ((4, 2, 2), lambda L: [e for e, _ in chain_structures(4, 2, L)]),
    "SemiMarkovCRF": ((4, 2, 2, 2), lambda L: [e for e, _ in semi_markov_structures(4, 2, 2, L)]),
    "TreeCRF": ((4, 4, 2), lambda L: [e for e, _ in tree_crf_structures(4, 2, L)]),
}


def _brute(events, theta, phi):
    """log p(y) and p(z | y) of every structure, by enumeration."""
    prior = np.array([(e * theta).sum() for e in events])
    joint = prior + np.array([(e * phi).sum() for e in events])
    log_z = np.logaddexp.reduce(prior)
    log_y = np.logaddexp.reduce(joint) - log_z
    return log_y, joint - np.logaddexp.reduce(joint)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(SHAPES))
def test_exact_likelihood_and_posterior_equal_brute_force(backend, name):
    shape, every = SHAPES[name]
    rng = np.random.default_rng(len(name))
    theta, phi = rng.normal(size=(3, *shape)), rng.normal(size=(3, *shape))
    lengths = np.array([4, 3, 1])
    prior = make(backend, name, theta, lengths)
    log_y = arr(prior.marginal_log_likelihood(conv(backend, phi)))
    post = prior.posterior(conv(backend, phi))
    assert type(post) is type(prior)
    for b, L in enumerate(lengths):
        events = np.array(every(L))
        ref_y, ref_post = _brute(events, theta[b], phi[b])
        assert log_y[b] == pytest.approx(ref_y, abs=1e-10)
        row = make(backend, name, theta[b:b + 1] + phi[b:b + 1], lengths[b:b + 1])
        got = arr(row.log_prob(conv(backend, events[:, None])))[:, 0]
        np.testing.assert_allclose(got, ref_post, atol=1e-10)
        mean = (np.exp(ref_post)[:, None] * events.reshape(len(events), -1)).sum(0)
        np.testing.assert_allclose(arr(post.marginals)[b], mean.reshape(shape), atol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("projective", [True, False])
def test_dependency_trees_take_the_same_two_members(backend, projective):
    """``DependencyTree`` (heads as events) answers the same two members."""
    from ppl_attention.numpyro.trees import DependencyTree as JaxTree
    from ppl_attention.pyro.trees import DependencyTree as TorchTree

    N = 4
    rng = np.random.default_rng(3)
    theta, phi = rng.normal(size=(2, N, N)), rng.normal(size=(2, N, N))
    lengths = np.array([4, 3])
    cls = TorchTree if backend == "pyro" else JaxTree
    prior = cls(conv(backend, theta), conv(backend, lengths), projective=projective)
    log_y = arr(prior.marginal_log_likelihood(conv(backend, phi)))
    for b, L in enumerate(lengths):
        post = cls(conv(backend, theta[b:b + 1]), conv(backend, lengths[b:b + 1]),
                   projective=projective).posterior(conv(backend, phi[b:b + 1]))
        heads = np.array(enumerate_trees(int(L), N, projective=projective, single_root=True))
        arcs = np.zeros((len(heads), N, N))
        for k, h in enumerate(heads):
            for m in range(L):
                arcs[k, h[m], m] = 1.0
        ref_y, ref_post = _brute(arcs, theta[b], phi[b])
        assert log_y[b] == pytest.approx(ref_y, abs=1e-9)
        got = arr(post.log_prob(conv(backend, heads[:, None])))[:, 0]
        np.testing.assert_allclose(got, ref_post, atol=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ctc_refuses_a_posterior_in_one_line(backend):
    cls = (__import__("ppl_attention.pyro.crfs" if backend == "pyro" else
                             "ppl_attention.numpyro.crfs", fromlist=["CTC"])).CTC
    d = cls(conv(backend, np.zeros((1, 5, 3))), conv(backend, np.array([[1, 2]])))
    for call in (d.posterior, d.marginal_log_likelihood):
        with pytest.raises(UserError, match="CTC") as err:
            call(conv(backend, np.zeros((1, 5, 3))))
        assert "\n" not in str(err.value)


# --- the score-function ELBO with the exact KL in a user's model --------------------------------

N_DRAWS = 4000


def _exact_elbo_grad(theta, phi, lam, lengths):
    """∂/∂λ of ⟨μ_q, φ⟩ − KL(q ‖ p) for q = SemiMarkovCRF(λ), p = SemiMarkovCRF(θ)."""
    from ppl_attention.pyro.crfs import SemiMarkovCRF

    lam = torch.tensor(lam, requires_grad=True)
    q, p = SemiMarkovCRF(lam, torch.tensor(lengths)), SemiMarkovCRF(torch.tensor(theta),
                                                                    torch.tensor(lengths))
    elbo = (q.marginals * torch.tensor(phi)).sum() - torch.distributions.kl_divergence(q, p).sum()
    (g,) = torch.autograd.grad(elbo, lam)
    return g.numpy()


def _problem():
    rng = np.random.default_rng(11)
    shape = (2, 3, 2, 2, 2)  # batch 2, n = 3, m = 2, t = 2
    return (rng.normal(size=shape), rng.normal(size=shape), rng.normal(size=shape) * 0.5,
            np.array([3, 2]))


def _user_program(backend):
    """(model, guide) as a user writes them from docs/architecture.md: a ``SemiMarkovCRF``
    site, the evidence as a factor over its segments, a guide with its own potentials λ."""
    theta, phi, lam0, lengths = _problem()
    if backend == "pyro":
        from ppl_attention.pyro.crfs import SemiMarkovCRF

        ppl, arr_ = pyro, torch.tensor
    else:
        from ppl_attention.numpyro.crfs import SemiMarkovCRF

        ppl, arr_ = numpyro, jnp.asarray
    th, ph, L = arr_(theta), arr_(phi), arr_(lengths)

    def model():
        with ppl.plate("batch", 2):
            z = ppl.sample("z", SemiMarkovCRF(th, L))
            ppl.factor("y", (z * ph).sum((-1, -2, -3, -4)))

    def guide():
        lam = ppl.param("lam", arr_(lam0))
        with ppl.plate("batch", 2):
            ppl.sample("z", SemiMarkovCRF(lam, L))

    return model, guide


def _agrees(draws, exact):
    """Mean of per-draw gradients within 5 standard errors of the exact one, on every entry
    the exact gradient does not vanish on (parts past a row's length: exactly 0 both ways)."""
    mean, se = draws.mean(0), draws.std(0) / np.sqrt(len(draws)) + 1e-12
    assert np.all(np.abs(mean - exact) <= 5 * se + 1e-9), np.max(np.abs(mean - exact) / se)
    assert np.abs(exact).max() > 0.05  # the test can fail: the gradient is not ~0


@pytest.mark.parametrize("n_draws", [pytest.param(400, id="fast"),
                                     pytest.param(4000, id="full",
                                                  marks=pytest.mark.statistical)])
def test_score_function_kl_elbo_gradient_is_unbiased_in_a_pyro_model(n_draws):
    from ppl_attention.pyro.inference.elbo import ScoreFunctionKL_ELBO

    theta, phi, lam0, lengths = _problem()
    model, guide = _user_program("pyro")

    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    guide()
    lam = pyro.param("lam").unconstrained()
    elbo = ScoreFunctionKL_ELBO()
    draws = []
    for _ in range(n_draws):  # one draw per estimate: their spread gives the standard error
        lam.grad = None
        elbo.differentiable_loss(model, guide).backward()
        draws.append(-lam.grad.numpy().copy())
    _agrees(np.stack(draws), _exact_elbo_grad(theta, phi, lam0, lengths))


def test_vectorized_particles_are_each_scored_by_their_own_reward():
    """``ScoreFunctionKL_ELBO(num_particles=P, vectorize_particles=True)``: each particle's
    score is multiplied by its own reward, so the estimate's spread falls as 1/√P; when the
    particles' rewards and scores were summed separately before their product, it did not fall
    at all (the cross terms' mean is 0, their variance is not)."""
    from ppl_attention.pyro.inference.elbo import ScoreFunctionKL_ELBO

    theta, phi, lam0, lengths = _problem()
    model, guide = _user_program("pyro")

    def estimates(elbo, k):
        pyro.clear_param_store()
        guide()
        lam = pyro.param("lam").unconstrained()
        out = []
        for _ in range(k):
            lam.grad = None
            elbo.differentiable_loss(model, guide).backward()
            out.append(-lam.grad.numpy().copy())
        return np.stack(out)

    pyro.set_rng_seed(3)
    P = 64
    single = estimates(ScoreFunctionKL_ELBO(), 200).std(0)
    vectorized = estimates(ScoreFunctionKL_ELBO(num_particles=P, vectorize_particles=True,
                                                max_plate_nesting=1), 40)
    live = single > 1e-6
    ratio = vectorized.std(0)[live] / (single[live] / np.sqrt(P))
    assert np.median(ratio) < 2.0, np.median(ratio)
    _agrees(vectorized, _exact_elbo_grad(theta, phi, lam0, lengths))


def test_numpyros_tracegraph_elbo_gradient_is_unbiased_with_a_structured_site():
    from numpyro.infer import TraceGraph_ELBO

    theta, phi, lam0, lengths = _problem()
    model, guide = _user_program("numpyro")

    def neg_elbo(params, key):
        return TraceGraph_ELBO().loss(key, params, model, guide)

    grad = jax.jit(jax.vmap(jax.grad(neg_elbo), in_axes=(None, 0)))
    draws = -np.asarray(grad({"lam": jnp.asarray(lam0)},
                             jax.random.split(jax.random.PRNGKey(0), N_DRAWS))["lam"])
    exact = _exact_elbo_grad(theta, phi, lam0, lengths)
    _agrees(draws, exact)


def test_numpyros_score_function_kl_elbo_gradient_is_unbiased_in_a_user_model():
    """The NumPyro mirror of ``ScoreFunctionKL_ELBO`` (closed-form KL, the draw scored), its
    value the exact ELBO's estimate and its gradient unbiased; it runs under ``SVI``."""
    from numpyro.infer import SVI
    from numpyro.optim import Adam

    from ppl_attention.numpyro.inference import ScoreFunctionKL_ELBO

    theta, phi, lam0, lengths = _problem()
    model, guide = _user_program("numpyro")

    elbo = ScoreFunctionKL_ELBO()
    value_and_grad = jax.jit(jax.vmap(jax.value_and_grad(
        lambda p, k: elbo.loss(k, p, model, guide)), in_axes=(None, 0)))
    values, grads = value_and_grad({"lam": jnp.asarray(lam0)},
                                   jax.random.split(jax.random.PRNGKey(0), N_DRAWS))
    _agrees(-np.asarray(grads["lam"]), _exact_elbo_grad(theta, phi, lam0, lengths))
    from ppl_attention.pyro.crfs import SemiMarkovCRF as TorchCRF

    q, p = TorchCRF(torch.tensor(lam0), torch.tensor(lengths)), TorchCRF(torch.tensor(theta),
                                                                         torch.tensor(lengths))
    exact = float((q.marginals * torch.tensor(phi)).sum()
                   - torch.distributions.kl_divergence(q, p).sum())
    v = -np.asarray(values)
    assert abs(v.mean() - exact) < 5 * v.std() / np.sqrt(len(v))
    svi = SVI(model, guide, Adam(0.05), elbo)
    state = svi.init(jax.random.PRNGKey(2))
    for _ in range(3):
        state, loss = svi.update(state)
    assert np.isfinite(float(loss))


def test_every_structure_is_a_site_numpyros_elbo_can_trace():
    """Each structure (CTC included) as a ``numpyro.sample`` site under ``jax.jit``: the draw's
    log-density is finite and equals ``log_prob`` outside ``jit``."""
    from numpyro import handlers

    from ppl_attention.numpyro import crfs

    rng = np.random.default_rng(2)
    cases = [crfs.LinearChainCRF(jnp.asarray(rng.normal(size=(2, 3, 2, 2)))),
             crfs.SemiMarkovCRF(jnp.asarray(rng.normal(size=(2, 3, 2, 2, 2)))),
             crfs.TreeCRF(jnp.asarray(rng.normal(size=(2, 3, 3, 2)))),
             crfs.CTC(jnp.asarray(rng.normal(size=(2, 6, 3))), jnp.asarray([[1, 2], [2, 2]]))]
    for d in cases:
        def site(key, d=d):
            tr = handlers.trace(handlers.seed(lambda: numpyro.sample("z", d), key)).get_trace()
            return tr["z"]["value"], tr["z"]["fn"].log_prob(tr["z"]["value"])

        value, lp = jax.jit(site)(jax.random.PRNGKey(1))
        assert np.all(np.isfinite(np.asarray(lp)))
        np.testing.assert_allclose(np.asarray(lp), np.asarray(d.log_prob(value)), atol=1e-9)
