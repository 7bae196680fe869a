"""The registry's word aligners (``word-ibm1``, ``word-ibm2``, ``word-hmm``) and the methods for
them: the program's likelihood against a hand computation, ``gibbs`` against ``nuts`` on the
same 60-pair corpus (posterior link marginals within Monte Carlo error), ``vb``'s ELBO never
decreasing, and the conjugate methods refused where they do not apply.
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_attention.common import arviz_api
from ppl_attention.core import method_specs as gm
from ppl_attention.core.errors import UserError
from ppl_attention.data.indexed import index_pairs
from ppl_attention.data.kinds import data_kind
from ppl_attention.numpyro import aligners as al
from ppl_attention.numpyro.families import make_family
from ppl_attention.numpyro.inference import backend, bayes
from ppl_attention.numpyro.inference import word_alignment as wa
from ppl_attention.numpyro.models import word_aligners as W
from ppl_attention.numpyro.models.base import posterior_given
from ppl_attention.numpyro.models.word_aligners import BayesianIBM2

CLASSES = {"ibm1": W.IBM1WordAligner, "ibm2": W.IBM2WordAligner, "hmm": W.HMMWordAligner}


def _data(n_train=60):
    kind = data_kind("pairs")
    data = kind.load({"task": "reorder", "n_train": n_train})
    return kind, data


def _model(name, data, **kw):
    return CLASSES[name](**data.dims, family=make_family("categorical"), **kw)


def _brute_token_ll(model, batch, theta, dist):
    """log p(f | e, θ, δ) per pair, every alignment enumerated (numpy, float64)."""
    spec = model.spec
    out = []
    for r in range(batch.src.shape[0]):
        S = int(batch.src_mask[r].sum())
        T = int(batch.tgt_mask[r].sum())
        e = [model.null] + list(np.asarray(batch.src[r, :S]))
        f = np.asarray(batch.tgt_out[r, :T])
        D = spec.max_jump
        total = 0.0
        for a in itertools.product(range(S + 1), repeat=T):
            w, m = 1.0, -1
            for j, i in enumerate(a):
                w *= theta[e[i], f[j]]
                if spec.model == "ibm1":
                    w /= S + 1
                elif spec.model == "ibm2":
                    w *= dist[spec.null_bucket if i == 0 else int(np.clip(
                        i - 1 - math.floor((j + 0.5) * S / T), -D, D)) + D]
                elif i == 0:
                    w *= dist[spec.null_bucket]
                else:
                    w *= dist[int(np.clip(i - 1 - m, -D, D)) + D]
                    m = i - 1
            total += w
        out.append(math.log(total))
    return np.array(out)


@pytest.mark.parametrize("name", list(CLASSES))
def test_program_likelihood_equals_enumeration(name):
    """The model's ``exact_token_log_likelihood`` (summed per pair) given tables equals the sum
    over every alignment; ``exact_posterior`` leaves NULL's mass off and is 0 on padding."""
    kind, data = _data(20)
    model = _model(name, data, max_jump=2)
    batch = next(iter(kind.batches(data.train, data.vocabs, 4, model=model,
                                   source={"task": "reorder"})))
    from ppl_attention.numpyro.jax_batches import to_jax

    jb = to_jax(batch)
    keep = np.asarray(jb.tgt_mask).sum(-1) <= 6  # short rows: the enumeration stays small
    rng = np.random.default_rng(0)
    theta = rng.dirichlet(np.ones(model.tgt_vocab), model.src_vocab + 1)
    dist = rng.dirichlet(np.ones(model.spec.n_buckets)) if model.spec.n_buckets else None
    globals_ = {"theta": jnp.asarray(theta, jnp.float32)}
    if dist is not None:
        globals_["dist"] = jnp.asarray(dist, jnp.float32)
    from ppl_attention.numpyro.models.base import token_log_likelihood_given

    ll = np.asarray(token_log_likelihood_given(model, {}, jb, globals_)).sum(-1)
    rows = np.flatnonzero(keep)
    assert len(rows) >= 1
    sub = jax.tree.map(lambda x: x[rows], jb)
    expected = _brute_token_ll(model, sub, theta, dist)
    np.testing.assert_allclose(ll[rows], expected, rtol=2e-5)
    post = np.asarray(posterior_given(model, {}, jb, globals_))
    mask = np.asarray(jb.tgt_mask)
    assert np.all(post[~mask] == 0)
    s = post.sum(-1)[mask]
    assert np.all(s <= 1 + 1e-5) and np.all(s > 0.05) and np.any(s < 0.999)  # NULL has some


def _fit(model, train, method, monkeypatch, **options):
    return bayes.fit_global(model, train, method, seed=1, progress=False,
                            method_options=options)


def _link_marginals(model, run, batch):
    """Per chain and draw, p(a_j = i | data, tables of that draw) ``[C, D, B, T, S]``."""
    samples = {k: jnp.asarray(v) for k, v in run.samples.items()}
    C, D = next(iter(samples.values())).shape[:2]
    flat = {k: v.reshape(C * D, *v.shape[2:]) for k, v in samples.items()}
    f = jax.jit(jax.vmap(lambda g: posterior_given(model, {}, batch, g)))
    out = np.asarray(f(flat))
    return out.reshape(C, D, *out.shape[1:])


def _mean_and_mcse(x):
    """Per link, the mean over chains and draws and its Monte Carlo standard error (sd /
    √ESS, ArviZ's bulk ESS)."""
    C, D = x.shape[:2]
    flat = x.reshape(C, D, -1)
    vary = flat.std((0, 1)) > 1e-6
    ess = np.full(flat.shape[-1], float(C * D))
    if vary.any():
        idata = arviz_api.from_dict(posterior={"p": flat[:, :, vary]})
        ess[vary] = np.asarray(arviz_api.ess(idata)["p"].values)
    return flat.mean((0, 1)), flat.std((0, 1)) / np.sqrt(np.maximum(ess, 1.0))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ibm1", "ibm2"])
def test_gibbs_agrees_with_nuts(name, monkeypatch):
    """On 60 pairs, the posterior link marginals of blocked Gibbs and of NUTS on the same
    model differ by no more than their Monte Carlo errors allow (|Δ| ≤ 4·√(se_g² + se_n²)
    + 0.005 for 99 % of the links; a ~3σ difference on every link would fail)."""
    kind, data = _data(60)
    model = _model(name, data)
    train = kind.batches(data.train, data.vocabs, 64, model=model, source={"task": "reorder"})
    batch = bayes.one_batch(train[:1])
    gibbs = _fit(model, train, "gibbs", monkeypatch, warmup=200, samples=500, chains=4)
    nuts = _fit(model, train, "nuts", monkeypatch, warmup=400, samples=500, chains=2)
    mg, sg = _mean_and_mcse(_link_marginals(model, gibbs, batch))
    mn, sn = _mean_and_mcse(_link_marginals(model, nuts, batch))
    real = np.asarray(batch.tgt_mask)[:, :, None] & np.asarray(batch.src_mask)[:, None, :]
    real = real.reshape(-1)
    diff = np.abs(mg - mn)[real]
    bound = 4 * np.sqrt(sg ** 2 + sn ** 2)[real] + 0.005
    assert np.mean(diff <= bound) >= 0.99, (np.mean(diff <= bound), diff.max())
    assert diff.max() < 0.1


CORPUS = [("a b c d".split(), "x y z".split()), ("b c".split(), "y w z v".split()),
          ("a d".split(), "x w".split()), ("c a b".split(), "z x y y".split())] * 5


@pytest.mark.parametrize("name", [m for m in al.ALIGNERS
                                  if "vb" in al.ALIGNER_KINDS[m].methods])
def test_vb_elbo_never_decreases(name):
    """Each coordinate-ascent sweep of ``vb`` raises the ELBO (to float32 rounding), on the
    sparse corpus path and with a small α (where a wrong update overshoots)."""
    corpus, _, _ = index_pairs(CORPUS, batch=8, multiple=4)
    spec = al.aligner(name, alpha=0.05, gamma=0.5, max_jump=2)
    res = wa.run_vb(spec, corpus, iterations=25, tol=0.0, progress=False)
    elbo = np.asarray(res["elbo"])
    # it stops early only where two sweeps give the same ELBO
    assert len(elbo) >= 10 or elbo[-1] == elbo[-2]
    assert np.all(np.diff(elbo) >= -1e-5 * np.abs(elbo[1:])), np.diff(elbo).min()
    assert elbo[-1] > elbo[0] + 1.0  # it moved


def test_registry_vb_elbo_and_draws(monkeypatch):
    """``vb`` through the registry: the ELBO history never decreases and the draws of θ are
    rows of the simplex."""
    kind, data = _data(40)
    model = _model("hmm", data)
    train = kind.batches(data.train, data.vocabs, 64, model=model, source={"task": "reorder"})
    run = _fit(model, train, "vb", monkeypatch, iterations=30, samples=50)
    elbo = np.asarray(run.extra["elbo"])
    assert np.all(np.diff(elbo) >= -1e-5 * np.abs(elbo[1:]))
    theta = run.samples["theta"]
    assert theta.shape == (1, 50, model.src_vocab + 1, model.tgt_vocab)
    np.testing.assert_allclose(theta.sum(-1), 1.0, rtol=1e-4)
    assert run.samples["dist"].shape == (1, 50, model.spec.n_buckets)


def test_conjugate_methods_are_refused_elsewhere():
    """``gibbs`` and ``vb`` take a model that declares ``conjugate``; a conjugate model's own
    refusals name the methods it takes; training options do not apply."""
    with pytest.raises(UserError, match="declares `conjugate`"):
        backend.check(BayesianIBM2, "gibbs")
    with pytest.raises(UserError, match="declares `conjugate`"):
        backend.check(BayesianIBM2, "vb")
    backend.check(W.HMMWordAligner, "gibbs")
    backend.check(W.HMMWordAligner, "nuts")
    with pytest.raises(UserError, match="gibbs, vb"):
        backend.check(W.HMMWordAligner, "exact")
    assert "gibbs" not in gm.global_methods_for(BayesianIBM2)
    assert {"gibbs", "vb", "nuts"} <= set(gm.global_methods_for(W.IBM1WordAligner))
    with pytest.raises(UserError, match="--steps does not apply to gibbs"):
        bayes.check_options("gibbs", {"steps": 10})
    with pytest.raises(UserError, match="--lr does not apply to vb"):
        bayes.check_options("vb", {"lr": 0.1})
