"""NULL's fixed weight (``AlignerSpec.null_prior`` ν, ``wordalign --null-prior``; eflomal's
``null_prior``): the buckets' Dirichlet covers the real buckets alone and NULL's entry is log ν
— the draw's moments, E[log δ], the posterior mean and the KL against the Dirichlet of the
real buckets written out here (NumPyro's KL), NULL's count ignored; VB's ELBO under the
fixed weight never decreases (the alignment conditionals and log Σ_a w(a) under it against
brute force: ``test_aligners.test_conditionals_equal_brute_force``).

Planted fault (``python tests/plant_faults.py z1``): z1 NULL's bucket kept in the Dirichlet
→ ``test_fixed_null_buckets_against_the_real_dirichlet`` fails.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.distributions import Dirichlet, kl_divergence

from ppl_attention.core.errors import UserError
from ppl_attention.data.indexed import index_pairs
from ppl_attention.numpyro import aligners as al

NU = 0.2


def test_fixed_null_buckets_against_the_real_dirichlet():
    spec = al.aligner("hmm", max_jump=2, null_prior=NU)  # 5 real buckets and NULL's
    counts = jnp.asarray([3.0, 0.0, 7.0, 1.0, 0.5, 400.0])  # NULL's count: ignored
    a = np.asarray(spec.gamma + counts[:-1])
    draws = jax.vmap(lambda k: al.sample_buckets(k, spec, counts))(
        jax.random.split(jax.random.PRNGKey(0), 20_000))
    np.testing.assert_allclose(np.asarray(draws[:, -1]), math.log(NU), rtol=1e-6)
    real = np.exp(np.asarray(draws[:, :-1], np.float64))
    np.testing.assert_allclose(real.sum(1), 1.0, rtol=1e-5)
    mean = a / a.sum()
    np.testing.assert_allclose(real.mean(0), mean, atol=3e-3)
    np.testing.assert_allclose(real.var(0), mean * (1 - mean) / (a.sum() + 1), rtol=0.06)
    from scipy.special import digamma

    e = np.asarray(al.expected_log_buckets(spec, counts))
    np.testing.assert_allclose(e[:-1], digamma(a) - digamma(a.sum()), rtol=1e-5)
    assert e[-1] == pytest.approx(math.log(NU))
    m = np.asarray(al.posterior_mean_log_buckets(spec, counts))
    np.testing.assert_allclose(m, np.append(np.log(mean), math.log(NU)), rtol=1e-5)
    prior = al.TablePrior(jnp.zeros(0), jnp.zeros(0), jnp.asarray([1.0, 0, 2, 0, 0, 50]))
    a0 = spec.gamma + np.asarray([1.0, 0, 2, 0, 0])
    want = kl_divergence(Dirichlet(jnp.asarray(a0 + np.asarray(counts[:-1]))),
                         Dirichlet(jnp.asarray(a0)))
    np.testing.assert_allclose(float(al.bucket_kl(spec, counts, prior)), float(want),
                               rtol=1e-5)
    _, log_dist = al.uniform_tables(spec, {"n_src": 1, "cell_src": jnp.zeros(1, jnp.int32)})
    np.testing.assert_allclose(np.asarray(log_dist), [math.log(0.2)] * 5 + [math.log(NU)],
                               rtol=1e-6)


def test_vb_under_a_fixed_null_weight():
    """VB's ELBO never decreases under the weights with ν (a Gibbs distribution, not a
    normalized likelihood), and NULL's E[log δ] stays log ν."""
    from ppl_attention.numpyro.inference import word_alignment as wa

    pairs = [("a b c".split(), "x y z".split()), ("b c".split(), "y w z".split()),
             ("a".split(), "x w".split())] * 4
    corpus, _, _ = index_pairs(pairs, batch=4, multiple=4)
    spec = al.aligner("hmm", max_jump=2, null_prior=NU)
    sizes, data = wa.device_corpus(corpus)
    res = wa.vb_sweeps(spec, sizes, data, iterations=8, tol=0.0, progress=False)
    assert np.all(np.diff(res["elbo"]) >= -1e-3 * abs(res["elbo"][0]))
    ld = np.asarray(al.expected_log_buckets(spec, jnp.asarray(res["counts"][1])))
    assert ld[-1] == pytest.approx(math.log(NU))
    assert np.exp(ld[:-1]).sum() < 1  # E[log δ] of the real buckets: sub-normalized


@pytest.mark.parametrize("model", ["ibm1"])
def test_null_prior_refused_without_a_null_bucket(model):
    with pytest.raises(UserError, match="ibm1 has no NULL bucket"):
        al.aligner(model, null_prior=0.2)
    al.aligner(model, null_prior=0.0)
    for bad in (-0.1, float("nan"), True):
        with pytest.raises(UserError, match="null_prior must be a number ≥ 0"):
            al.aligner("hmm", null_prior=bad)
