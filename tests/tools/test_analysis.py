"""Posterior analysis: InferenceData groups/dims/coords and netCDF round trip, exact marginals
(sum to 1, Pyro = NumPyro, infer_discrete frequencies), diagnostics, the analyze/diagnose
commands and their bad inputs, and the Bayesian IBM-2 reference."""

import json

import arviz as az
import numpy as np
import pyro
import torch
from pyro.infer import infer_discrete

from ppl_attention.analysis import guide_diagnostics, to_inference_data
from ppl_attention.cli import main
from ppl_attention.common import arviz_api
from ppl_attention.data import Vocab, make_batches, make_task, write_tsv
from ppl_attention.data.pharaoh import write_pharaoh
from ppl_attention.numpyro.jax_batches import to_jax
from ppl_attention.numpyro.models import Seq2SeqAlignment as JaxModel
from ppl_attention.pyro.inference import Run, get_method
from ppl_attention.pyro.models import Seq2SeqAlignment


def _run(method="vae-enum", hidden=8, seed=0):
    task = make_task("reorder", n_train=30, n_eval=9, seed=seed)
    sv = Vocab.build(s for s, _ in task.train.pairs)
    tv = Vocab.build(t for _, t in task.train.pairs)
    torch.manual_seed(seed)
    model = Seq2SeqAlignment(len(sv), len(tv), hidden=hidden,
                             family=get_method(method).family(hidden))
    model.eval()
    return task, Run(model, method, sv, tv)


def test_inference_data_groups_dims_coords_and_netcdf_round_trip(tmp_path):
    task, run = _run("vae-enum")
    pairs = task.test.pairs
    idata = to_inference_data(run, pairs, num_samples=40)
    for group in ("posterior", "prior", "log_likelihood", "observed_data", "exact_posterior"):
        assert arviz_api.has_group(idata, group)
    a = idata.posterior["alignment"]
    assert a.dims == ("chain", "draw", "pair", "target_pos", "source_pos")
    assert a.shape[:3] == (1, 40, len(pairs))
    assert "alignment_q" in idata.posterior
    assert idata.posterior.attrs["method"] == "vae-enum"
    first_src = idata.posterior["source_token"].sel(pair=0).values
    assert list(first_src[: len(pairs[0][0])]) == list(pairs[0][0])
    tgt = idata.prior["target_token"].sel(pair=1).values
    assert list(tgt[: len(pairs[1][1]) + 1]) == list(pairs[1][1]) + ["<eos>"]
    n_tokens = sum(len(t) + 1 for _, t in pairs)
    assert idata.log_likelihood["y"].shape == (1, 40, n_tokens)
    # one-hot draws: each real (pair, target) row sums to 1, padded rows are NaN
    s = a.sum("source_pos", skipna=True).values
    real = ~np.isnan(a.values).all(-1)
    np.testing.assert_allclose(s[real], 1.0)
    exact = idata.exact_posterior["alignment"].values
    ok = ~np.isnan(exact).all(-1)
    np.testing.assert_allclose(np.nansum(exact, -1)[ok], 1.0, atol=1e-5)
    assert np.all(exact[ok][~np.isnan(exact[ok])] >= 0)
    path = tmp_path / "p.nc"
    idata.to_netcdf(path)
    back = az.from_netcdf(path)
    assert arviz_api.has_group(back, "exact_posterior")
    np.testing.assert_allclose(back.posterior["alignment"].values, a.values)
    loo = az.loo(back)
    assert np.isfinite(loo.elpd_loo)
    summary = az.summary(back, var_names=["alignment"])
    assert len(summary) > 0


def test_exact_marginals_pyro_equal_numpyro_and_infer_discrete_frequencies():
    task, run = _run("exact", hidden=8, seed=2)
    (b,) = make_batches(task.test.pairs[:4], run.src_vocab, run.tgt_vocab, 4)
    with torch.no_grad():
        exact = run.model.exact_posterior(b).numpy()
    jm, p = JaxModel.from_torch(run.model)
    jexact = np.asarray(jm.exact_posterior_of(p, to_jax(b, 6, 4)))[:4, : exact.shape[1],
                                                                   : exact.shape[2]]
    real = b.tgt_mask.numpy()
    np.testing.assert_allclose(jexact[real], exact[real], atol=1e-5)
    np.testing.assert_allclose(exact[real].sum(-1), 1.0, atol=1e-6)
    # infer_discrete(temperature=1) draws from the exact posterior: chi-square per position;
    # n draws at once, as a batch of the 4 pairs repeated n times (row k is pair k mod 4)
    from pyro import poutine

    from ppl_attention.data.batching import collate

    pyro.set_rng_seed(0)
    n = 2000
    model = infer_discrete(lambda bb: run.model.model(bb, enumerate_z=True), first_available_dim=-3,
                           temperature=1)
    pairs = [task.test.pairs[int(i)] for i in b.index]
    big = collate(pairs * n, list(range(4 * n)), run.src_vocab, run.tgt_vocab)
    assert big.tgt_out.shape[1] == exact.shape[1] and big.src.shape[1] == exact.shape[2]
    with torch.no_grad():
        z = poutine.trace(model).get_trace(big).nodes["align"]["value"].numpy()
    z = z.reshape(n, 4, exact.shape[1])
    counts = np.zeros_like(exact)
    for r in range(4):
        for t in range(exact.shape[1]):
            counts[r, t] = np.bincount(z[:, r, t], minlength=exact.shape[2])
    from scipy.stats import chi2

    stat, dof = 0.0, 0
    for r, t in zip(*np.nonzero(real)):
        e = exact[r, t] * n
        keep = e > 5
        stat += float((((counts[r, t] - e) ** 2)[keep] / e[keep]).sum())
        dof += int(keep.sum()) - 1
    assert stat < chi2.ppf(0.999, dof), (stat, dof)


def test_diagnostics_of_an_exact_guide_and_bounds():
    task, run = _run("vae-enum")
    d = guide_diagnostics(run, task.test.pairs, task.test.gold, num_samples=30)
    assert d["kl_exact_q"] > 0 and 0 <= d["expected_aer"] <= 1 and 0 < d["rel_ess"] <= 1
    assert d["khat_pairs"] > 0 and 0 <= d["khat_share"] <= 1  # a random q: varied weights
    assert d["elbo"] <= d["iwae"] + 1e-6 <= d["log_lik"] + 1e-5  # ELBO ≤ IWAE ≤ log p (here)
    assert d["elbo_gap"] >= d["iwae_gap"] >= -1e-5


def _corpus(tmp_path):
    task = make_task("reorder", n_train=40, n_eval=6, seed=1)
    d = tmp_path / "corpus"
    d.mkdir()
    for name, split in (("train", task.train), ("valid", task.valid), ("test", task.test)):
        write_tsv(d / f"{name}.tsv", split.pairs)
        write_pharaoh(d / f"{name}.align", split.gold)
    return d


def test_analyze_and_diagnose_commands_and_bad_input(tmp_path, capsys):
    data = _corpus(tmp_path)
    run = tmp_path / "run"
    assert main(["train", "--data-dir", str(data), "--method", "vae-sample", "--out", str(run),
                 "--steps", "4", "--hidden", "8", "--batch-size", "8", "--valid-every", "2"]) == 0
    capsys.readouterr()
    out = tmp_path / "an"
    assert main(["analyze", str(run), "--data-dir", str(data), "--out", str(out),
                 "--num-samples", "20", "--pair", "1"]) == 0
    printed = capsys.readouterr().out
    for name in ("posterior.nc", "pair1_heatmaps.png", "entropy.png", "diagnostics.json"):
        assert (out / name).stat().st_size > 0 and f"wrote {out / name}" in printed
    assert json.loads((out / "diagnostics.json").read_text())["method"] == "vae-sample"
    assert main(["diagnose", str(run), str(run), "--data-dir", str(data), "--num-samples",
                 "10", "--out", str(tmp_path / "diag.md")]) == 0
    assert capsys.readouterr().out.count("| vae-sample |") == 2
    # bad input: not a run, foreign vocabulary, num_samples ≤ 0 — and no posterior.nc written
    bad = tmp_path / "bad"
    assert main(["analyze", str(tmp_path), "--data-dir", str(data), "--out", str(bad)]) == 2
    assert "not a complete run directory" in capsys.readouterr().err
    foreign = tmp_path / "foreign.tsv"
    foreign.write_text("qq rr ss\tuu vv\n")
    assert main(["analyze", str(run), "--data", str(foreign), "--out", str(bad)]) == 2
    assert "not in the run's vocabulary" in capsys.readouterr().err
    assert main(["analyze", str(run), "--data-dir", str(data), "--out", str(bad),
                 "--num-samples", "0"]) == 2
    assert "--num-samples must be at least 1" in capsys.readouterr().err
    assert not (bad / "posterior.nc").exists()
    assert not list(out.glob(".posterior.nc.tmp-*"))
