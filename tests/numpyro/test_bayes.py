"""Methods for global latents (nuts, hmc, svi-*) on the Bayesian models of the registry: the
likelihood given the globals against a direct computation, SVI through train / evaluate /
align / analyze (ArviZ InferenceData that az.loo reads), the discrepancy against a reference,
every refusal in one line; NUTS against its own diagnostics in the slow tier.

Planted fault, caught: ``token_log_likelihood_given`` keeping the globals' prior log-density in
the joint (``handlers.block`` removed) — test_likelihood_given_the_globals_is_the_direct_sum
failed.
"""

import importlib.util
import json

import jax.numpy as jnp
import numpy as np
import pytest

from ppl_attention.cli import main
from ppl_attention.data import Vocab, make_batches, make_task
from ppl_attention.numpyro.families import Categorical, MarkovCategorical
from ppl_attention.numpyro.inference.bayes import discrepancy
from ppl_attention.numpyro.jax_batches import to_jax
from ppl_attention.numpyro.models.base import posterior_given, token_log_likelihood_given
from ppl_attention.numpyro.models.word_aligners import BayesianHMMAligner, BayesianIBM2


@pytest.fixture(autouse=True)
def _jax_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PPL_ATTENTION_JAX_CACHE", str(tmp_path_factory.getbasetemp() / "jax"))


def _data(n=5):
    task = make_task("reorder", n_train=20, n_eval=2, seed=5, min_len=3, max_len=5)
    sv = Vocab.build(s for s, _ in task.train.pairs)
    tv = Vocab.build(t for _, t in task.train.pairs)
    (b,) = make_batches(task.train.pairs[:n], sv, tv, n, array="numpy")
    return b, to_jax(b, n + 2, "bucket"), len(sv), len(tv)


def test_likelihood_given_the_globals_is_the_direct_sum():
    b, jb, V_s, V_t = _data()
    m = BayesianIBM2(V_s, V_t, family=Categorical())
    rng = np.random.default_rng(0)
    theta = rng.dirichlet(np.ones(V_t), size=V_s).astype(np.float32)
    g = {"theta": jnp.asarray(theta), "lam": jnp.asarray(3.0)}
    ll = np.asarray(token_log_likelihood_given(m, {}, jb, g))
    post = np.asarray(posterior_given(m, {}, jb, g))
    src, sm = np.asarray(jb.src), np.asarray(jb.src_mask)
    tgt, tm = np.asarray(jb.tgt_out), np.asarray(jb.tgt_mask)
    for r in range(b.size):
        n, mlen = sm[r].sum(), tm[r].sum()
        for t in range(mlen):
            prior = np.exp(-3.0 * np.abs((t + 0.5) / mlen - (np.arange(n) + 0.5) / n))
            prior /= prior.sum()
            joint = prior * theta[src[r, :n], tgt[r, t]]
            assert ll[r, t] == pytest.approx(np.log(joint.sum()), rel=1e-5)
            np.testing.assert_allclose(post[r, t, :n], joint / joint.sum(), atol=1e-6)
    assert np.all(ll[b.size:] == 0) and np.all(ll[~tm] == 0)


def test_the_hmm_aligner_given_its_globals_is_a_distribution_over_alignments():
    b, jb, V_s, V_t = _data()
    m = BayesianHMMAligner(V_s, V_t, family=MarkovCategorical(max_jump=2))
    rng = np.random.default_rng(1)
    g = {"theta": jnp.asarray(rng.dirichlet(np.ones(V_t), size=V_s), jnp.float32),
         "jumps": jnp.asarray([0.2, 0.5, 0.3], jnp.float32)}
    ll = np.asarray(token_log_likelihood_given(m, {}, jb, g))
    post = np.asarray(posterior_given(m, {}, jb, g))
    tm = np.asarray(jb.tgt_mask)
    assert np.all(np.isfinite(ll)) and np.all(ll[tm] < 0) and np.all(ll[~tm] == 0)
    np.testing.assert_allclose(post[:b.size][tm[:b.size]].sum(-1), 1.0, atol=1e-5)


def test_discrepancy_against_a_reference():
    rng = np.random.default_rng(2)
    ref = {"a": rng.normal(size=(2, 4000, 3))}
    assert discrepancy(ref, ref)["a"] == {"mean_error_sd": 0.0, "sd_ratio": 1.0, "w1_sd": 0.0}
    shifted = {"a": ref["a"] + 0.5}
    d = discrepancy(ref, shifted)["a"]
    assert d["mean_error_sd"] == pytest.approx(0.5, rel=0.05)
    assert d["w1_sd"] == pytest.approx(0.5, rel=0.05)
    narrow = {"a": ref["a"] * 0.5}
    assert discrepancy(ref, narrow)["a"]["sd_ratio"] == pytest.approx(0.5, rel=0.02)


@pytest.fixture(scope="module")
def svi_run(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("bayes") / "svi"
    assert main(["train", "--model", "bayesian-ibm2", "--data-dir", str(data_dir),
                 "--method", "svi-normal", "--steps", "100", "--out", str(out)]) == 0
    return out


@pytest.mark.integration
def test_svi_through_train_evaluate_align_analyze(svi_run, data_dir, tmp_path, capsys):
    capsys.readouterr()
    state = json.loads((svi_run / "state.json").read_text())
    rep = state["extra"]["test_report"]
    assert rep["predictive"] == "posterior" and 0 < rep["nll_per_token"] < 5
    assert (svi_run / "samples.npz").exists()
    assert main(["evaluate", str(svi_run), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["nll_per_token"] == pytest.approx(rep["nll_per_token"], rel=1e-6)
    assert again["aer"] == pytest.approx(rep["aer"])
    pairs = [line.split("\t") for line in (data_dir / "test.tsv").read_text().splitlines()]
    assert main(["align", str(svi_run), "--data", str(data_dir / "test.tsv")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [len(line.split()) for line in lines] == [len(t.split()) for _, t in pairs]
    an = tmp_path / "an"
    assert main(["analyze", str(svi_run), "--out", str(an)]) == 0
    import arviz as az

    idata = az.from_netcdf(an / "posterior.nc")
    assert set(idata.posterior.data_vars) == {"theta", "lam", "link"}
    assert idata.posterior["theta"].shape[:2] == (1, 1000)
    # pair 0's link marginals per draw: each real target token's row sums to 1 (no NULL here)
    link = idata.posterior["link"].values
    assert link.shape[:2] == (1, 1000) and min(link.shape[2:]) >= 1
    np.testing.assert_allclose(link.sum(-1), 1.0, rtol=1e-4)
    assert idata.log_likelihood["y"].shape[-1] == idata.observed_data["y"].shape[0]
    assert np.isfinite(az.loo(idata).elpd_loo)
    assert (an / "trace.png").exists()
    for cmd in (["calibrate", str(svi_run)], ["diagnose", str(svi_run)]):
        assert main(cmd) == 2
        assert "svi-normal" in capsys.readouterr().err


def test_methods_and_models_that_do_not_fit_are_refused(tmp_path, capsys):
    out = tmp_path / "never"
    cases = [(["--model", "bayesian-ibm2", "--method", "exact"],
              "declares global latents (theta, lam): train it by nuts"),
             (["--model", "bayesian-ibm2", "--method", "nuts", "--steps", "10"],
              "--steps does not apply to nuts"),
             (["--model", "bayesian-ibm2", "--method", "svi-delta", "--clip", "1"],
              "--clip does not apply to svi-delta: SVI takes --steps and --lr (its method "
              "options: --samples)"),
             (["--model", "bayesian-ibm2", "--method", "nuts", "--tol", "0.1"],
              "--tol does not apply to --method nuts (it takes --chains, --warmup, --samples)")]
    if importlib.util.find_spec("torch") is not None:  # (not on the NumPyro-only stack)
        cases.append((["--model", "seq2seq", "--method", "nuts"],
                      "infers global latents with NumPyro's MCMC"))
    for args, msg in cases:
        assert main(["train", "--task", "reorder", *args, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.slow
def test_nuts_and_svi_against_it(global_reference):
    """compare on the Bayesian IBM-2 (the session's shared reference, tests/conftest.py): NUTS
    converges (R-hat ≤ 1.01, bulk ESS ≥ 400 for every element), and the discrepancy columns of
    HMC and the SVI posteriors are filled."""
    out = global_reference
    md = (out / "results.md").read_text()
    assert "max R-hat" in md and "vs NUTS" in md
    nuts = json.loads((out / "runs" / "nuts-seed0" / "state.json").read_text())["extra"][
        "test_report"]
    assert nuts["rhat_max"] <= 1.01 and nuts["ess_bulk_min"] >= 400
    against = (out / "against_nuts.md").read_text()
    assert against.count("|") > 20
    assert all(f"| {m} |" in against for m in ("hmc", "svi-normal", "svi-lowrank", "svi-delta"))
