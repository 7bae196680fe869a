"""Calibration by simulation (ppl_attention.analysis.sbc): the statistics are exact
under calibration and fail off it; a trained run's exact posterior passes and a planted
over-confident guide fails (the fast form; five seeds at the default N in
benchmarks/calibration.py and the statistical tier); the command and compare's columns; a model
that cannot simulate its targets is refused naming what it lacks.

Planted faults (``python tests/plant_faults.py cal1 cal2``), each caught:
- cal1, ranks without their random share of the ties (``below`` alone):
  test_ranks_with_random_ties_are_uniform_under_calibration failed;
- cal2, the credible set without its randomized boundary (the boundary position always in):
  test_randomized_sets_cover_at_exactly_their_level failed.
"""

import json

import numpy as np
import pytest
from scipy.stats import kstest

from ppl_attention.analysis import sbc as cal
from ppl_attention.cli import main


def _categorical(rng, probs, n):
    return (rng.random((n, 1)) > np.cumsum(probs)).sum(-1)


def test_ranks_with_random_ties_are_uniform_under_calibration():
    rng = np.random.default_rng(0)
    probs = np.array([0.6, 0.3, 0.1])  # few values: many ties
    L, n = 19, 4000
    truth = _categorical(rng, probs, n)
    draws = np.stack([_categorical(rng, probs, n) for _ in range(L)])
    ranks = cal.rank_with_ties(draws, truth, rng)
    assert ranks.min() >= 0 and ranks.max() <= L
    assert kstest(cal.pit(ranks, L, rng), "uniform").pvalue > 0.01
    wrong = _categorical(rng, np.array([0.2, 0.3, 0.5]), n)  # truth from elsewhere
    assert kstest(cal.pit(cal.rank_with_ties(draws, wrong, rng), L, rng),
                  "uniform").pvalue < 1e-6


def test_randomized_sets_cover_at_exactly_their_level():
    rng = np.random.default_rng(1)
    n, S = 20000, 6
    probs = rng.dirichlet(np.full(S, 0.7), size=n)
    truth = (rng.random((n, 1)) > np.cumsum(probs, -1)).sum(-1)
    cov = cal.randomized_set_coverage(probs, truth, cal.LEVELS, rng)
    se = np.sqrt(np.array(cal.LEVELS) * (1 - np.array(cal.LEVELS)) / n)
    assert np.all(np.abs(cov - np.array(cal.LEVELS)) < 4 * se), cov
    sharp = probs**3 / (probs**3).sum(-1, keepdims=True)  # over-confident: under-covers
    assert np.all(cal.randomized_set_coverage(sharp, truth, cal.LEVELS, rng)
                  < np.array(cal.LEVELS) - 0.02)


def test_interval_coverage_and_simplex_quantities():
    rng = np.random.default_rng(2)
    draws, truth = rng.normal(size=(999, 3000)), rng.normal(size=3000)
    cov = cal.interval_coverage(draws, truth, cal.LEVELS)
    assert np.all(np.abs(cov - np.array(cal.LEVELS)) < 0.03)
    w = np.array([[0.7, 0.2, 0.1, 0.0]])
    q = cal.simplex_quantities(w, np.array([0]))
    np.testing.assert_allclose(q[0], [0.7, 0.4, -(0.7 * np.log(0.7) + 0.2 * np.log(0.2)
                                                   + 0.1 * np.log(0.1))])


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("cal") / "cmp"
    spec = "examples/tutorial/diagonal.py:DiagonalAlignment"
    assert main(["compare", "--model", spec, "--data-dir", str(data_dir), "--methods",
                 "vae-enum,dirichlet,soft", "--steps", "60", "--lr", "0.05", "--batch-size", "16",
                 "--calibrate", "--out", str(out)]) == 0
    return out


@pytest.mark.torch
def test_compare_calibrate_over_runs_trained_without_it(trained, tmp_path, data_dir):
    """Rerunning ``compare --calibrate`` where the runs are complete but not calibrated (trained
    without the flag, or their calibration failed) calibrates them, trains nothing again.
    Planted fault (the read-back runs not calibrated): caught, 1 failed."""
    import shutil

    out = tmp_path / "cmp"
    shutil.copytree(trained, out)
    (out / "runs" / "vae-enum-seed0" / "calibration.json").unlink()
    (out / "results.md").unlink()
    spec = "examples/tutorial/diagonal.py:DiagonalAlignment"
    assert main(["compare", "--model", spec, "--data-dir", str(data_dir), "--methods",
                 "vae-enum,soft", "--steps", "60", "--lr", "0.05", "--batch-size", "16",
                 "--calibrate", "--out", str(out)]) == 0
    assert (out / "runs" / "vae-enum-seed0" / "calibration.json").exists()
    md = (out / "results.md").read_text()
    vae = next(line for line in md.splitlines() if line.startswith("| vae-enum |"))
    assert not vae.endswith("| — | — |") and "Failed jobs" not in md, md
    assert "there is no posterior to calibrate" in md


@pytest.fixture(scope="module")
def trained_numpyro(tmp_path_factory, data_dir):
    """The tutorial's model written in NumPyro alone, trained by vae-enum."""
    out = tmp_path_factory.mktemp("cal-numpyro") / "run"
    spec = "examples/tutorial/diagonal_numpyro.py:DiagonalAlignment"
    assert main(["train", "--model", spec, "--data-dir", str(data_dir), "--method", "vae-enum",
                 "--steps", "60", "--lr", "0.05", "--batch-size", "16", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("backend", [pytest.param("pyro", marks=pytest.mark.torch),
                                     "numpyro"])
def test_the_exact_posterior_passes_and_a_planted_overconfident_guide_fails(backend, request):
    """On either backend: the run's exact posterior passes; its guide with the logits × 6
    (over-confident) fails, and with the logits × 0.05 (under-confident) fails too, covering
    more than it claims — the same planted distortion (``cal.planted``) on a Pyro and a NumPyro
    model."""
    from ppl_attention.common.runs import Run
    from ppl_attention.data import make_task

    run = Run.load(request.getfixturevalue("trained") / "runs" / "vae-enum-seed0"
                   if backend == "pyro" else request.getfixturevalue("trained_numpyro"))
    assert run.backend == backend
    pairs = make_task("reorder", n_train=40, n_eval=30, seed=1).test.pairs
    fine = cal.calibrate(run, pairs, num_sims=120, draws=39, seed=3, progress=False)
    rows = {r["posterior"]: r for r in fine["rows"]}
    assert rows["exact"]["passes"] and rows["exact"]["p_min"] > 0.01
    over = cal.calibrate(run, pairs, num_sims=120, draws=39, seed=3, progress=False,
                         distort=cal.planted("logits", 6.0))
    q = over["rows"][0]
    assert q["posterior"] == "q (inference)" and not q["passes"]
    assert q["coverage"]["0.90"] < 0.85  # an over-confident q covers less than it claims
    under = cal.calibrate(run, pairs, num_sims=120, draws=39, seed=3, progress=False,
                          distort=cal.planted("logits", 0.05))
    q = under["rows"][0]
    as_trained = rows["q (inference)"]["coverage"]
    assert not q["passes"]
    assert all(q["coverage"][k] > as_trained[k] for k in ("0.50", "0.80"))  # covers more


@pytest.mark.torch
def test_calibrate_command_and_compare_columns(trained, tmp_path, capsys):
    md = (trained / "results.md").read_text()
    assert "calibration min p" in md and "coverage 90 %" in md
    # soft attention has no posterior: its row stands, calibration "—", no failed job
    soft_row = next(line for line in md.splitlines() if line.startswith("| soft |"))
    assert soft_row.endswith("| — | — |") and "Failed jobs" not in md, md
    assert "there is no posterior to calibrate" in md
    for method in ("vae-enum", "dirichlet"):
        run = trained / "runs" / f"{method}-seed0"
        res = json.loads((run / "calibration.json").read_text())
        assert res["rows"][0]["posterior"] == "q (inference)"
        assert (run / "calibration.png").exists()
    dirichlet = json.loads((trained / "runs" / "dirichlet-seed0" / "calibration.json")
                           .read_text())["rows"][0]
    assert set(dirichlet["pit"]) == {"weight at z*'s best", "mean position", "entropy",
                                     "joint log q"}
    capsys.readouterr()
    out = tmp_path / "c"
    assert main(["calibrate", str(trained / "runs" / "vae-enum-seed0"), "--num-sims", "20",
                 "--draws", "9", "--out", str(out)]) == 0
    assert "| vae-enum | exact |" in capsys.readouterr().out
    res = json.loads((out / "calibration.json").read_text())
    assert res["gold_coverage"] is not None and res["gold_coverage_why"] is None
    assert main(["calibrate", str(trained / "runs" / "vae-enum-seed0"), "--num-sims",
                 "5"]) == 2
    assert "--num-sims must be an int ≥ 10" in capsys.readouterr().err


FACTOR_MODEL = '''
import pyro, torch
from diagonal import DiagonalAlignment

class FactorTargets(DiagonalAlignment):
    def model(self, batch, *, enumerate_z=False, kl_scale=1.0):
        pyro.module("diagonal", self)
        values = self.embed(batch.src)
        B, T = batch.tgt_out.shape
        with pyro.plate("batch", B, dim=-2), pyro.plate("target", T, dim=-1):
            import ppl_attention as pa
            context, _ = pa.attend("align", self.prior_scores(batch), values, self.family,
                                   mask=batch.src_mask,
                                   target_mask=None if enumerate_z else batch.tgt_mask,
                                   infer={"enumerate": "parallel"} if enumerate_z else None)
            lp = pyro.distributions.Categorical(logits=self.out(context)).log_prob(batch.tgt_out)
            pyro.factor("y", lp.masked_fill(~batch.tgt_mask, 0.0))
'''


@pytest.mark.torch
def test_a_model_that_cannot_simulate_its_targets_is_refused(tmp_path, data_dir, capsys,
                                                            monkeypatch):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    monkeypatch.syspath_prepend(str(root / "examples" / "tutorial"))
    f = tmp_path / "factor.py"
    f.write_text(FACTOR_MODEL)
    out = tmp_path / "run"
    assert main(["train", "--model", f"{f}:FactorTargets", "--data-dir", str(data_dir),
                 "--method", "vae-enum", "--steps", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["calibrate", str(out)]) == 2
    err = capsys.readouterr().err
    assert "a factor cannot be sampled" in err and "implement simulate(batch" in err
    assert not (out / "calibration.json").exists()
