"""Figures a user can trust and options that are never silently ignored: ``evaluate`` gives the
same IWAE-scored figure on every call with the same ``--seed`` (and another with another);
``--iwae-k`` is refused where no IWAE bound is computed; ``calibrate``'s verdict reads both of
its tests (the KS p-value and the ECDF band); compare's default methods are those the model and
its backend support; a user's bags of real-valued instances (``.npz``) read, and bad ones
refused naming the file and the array."""

import json
from pathlib import Path

import numpy as np
import pytest

from ppl_attention.analysis import sbc as calibration
from ppl_attention.cli import main
from ppl_attention.core.errors import DataError
from ppl_attention.data.bags import read_bags
from ppl_attention.data.kinds import data_kind

pytestmark = pytest.mark.torch  # every test here runs a Pyro model

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "examples" / "tutorial"
PYRO = f"{TUTORIAL / 'diagonal.py'}:DiagonalAlignment"
NUMPYRO = f"{TUTORIAL / 'diagonal_numpyro.py'}:DiagonalAlignment"
TINY = ["--task", "reorder", "--n-train", "100", "--batch-size", "32"]


def test_evaluate_gives_the_same_figure_for_the_same_seed(tmp_path, capsys):
    run = tmp_path / "dir"
    assert main(["train", "--model", PYRO, *TINY, "--method", "dirichlet", "--steps", "5",
                 "--out", str(run)]) == 0
    capsys.readouterr()

    def nll(*extra):
        assert main(["evaluate", str(run), "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)["nll_per_token"]

    first = nll()
    assert nll() == first and nll("--seed", "0") == first  # an IWAE-10 bound, seeded
    assert nll("--seed", "1") != first
    assert nll("--iwae-k", "3") != first  # the option is used where a bound is computed


def test_iwae_k_is_refused_where_no_bound_is_computed(tmp_path, capsys):
    run = tmp_path / "exact"
    assert main(["train", "--model", PYRO, *TINY, "--method", "exact", "--steps", "3",
                 "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(run), "--iwae-k", "5"]) == 2
    err = capsys.readouterr().err
    assert "--iwae-k" in err and "is exact" in err


def test_calibrations_verdict_reads_both_tests(monkeypatch):
    pits = {"a": np.linspace(0.01, 0.99, 50), "b": np.linspace(0.01, 0.99, 50)}
    assert calibration._row("q", pits, np.zeros(4))["passes"]
    real = calibration.uniformity

    def out_of_band(values, prob=0.99):  # a KS p-value that passes, an ECDF that does not
        return {**real(values, prob), "p_value": 0.5, "in_band": False}

    monkeypatch.setattr(calibration, "uniformity", out_of_band)
    row = calibration._row("q", pits, np.zeros(4))
    assert row["p_min"] == 0.5 and not row["passes"]
    assert row["band_prob"] == pytest.approx(1 - calibration.ALPHA / 2)  # Bonferroni


def test_compares_default_methods_are_those_the_backend_runs(capsys):
    from ppl_attention.cli.compare import method_support
    from ppl_attention.common.registry import load_model_class

    ok, why = method_support(load_model_class(NUMPYRO))
    assert "vae-rws" in why and "reweighted wake-sleep" in why["vae-rws"]
    assert {"exact", "vae-enum", "dirichlet", "vae-gumbel"} <= set(ok) and "vae-rws" not in ok
    ok_pyro, _ = method_support(load_model_class(PYRO))
    assert "vae-rws" in ok_pyro
    assert set(method_support(load_model_class(PYRO), "numpyro")[1]) >= {"vae-rws"}


def _write(path, **arrays):
    np.savez(path, **arrays)
    return path


def test_bags_of_real_valued_instances_are_read_and_checked(tmp_path):
    x = np.random.default_rng(0).normal(size=(5, 4, 3)).astype(np.float32)
    mask = np.ones((5, 4), bool)
    mask[1, 2:] = False
    bags = read_bags(_write(tmp_path / "ok.npz", x=x, y=np.array([0, 1, 1, 0, 2]), mask=mask))
    assert [len(b) for b in bags] == [4, 2, 4, 4, 4] and bags[4].label == 2
    np.testing.assert_array_equal(bags[1].features, x[1, :2])
    bad = {
        "extra array": (dict(x=x, y=np.zeros(5, int), z=x), "z are not bag data"),
        "no y": (dict(x=x), "no array 'y'"),
        "2-d x": (dict(x=x[:, 0], y=np.zeros(5, int)), "x must be a numeric \\[N, M, F\\]"),
        "float y": (dict(x=x, y=np.zeros(5)), "y must be N = 5 integer labels"),
        "negative": (dict(x=x, y=np.array([0, 1, -1, 0, 0])), "negative label \\(-1 at bag 2"),
        "nan": (dict(x=np.where(np.arange(3) == 1, np.nan, x), y=np.zeros(5, int)),
                "x is not finite at bag 0, instance 0"),
        "empty bag": (dict(x=x, y=np.zeros(5, int), mask=np.eye(5, 4, dtype=bool) * 0 > 0),
                      "bag 0 \\(counted from 0\\) has no instance"),
    }
    for name, (arrays, message) in bad.items():
        with pytest.raises(DataError, match=message):
            read_bags(_write(tmp_path / f"{name}.npz", **arrays))
    (tmp_path / "pickle.npz").write_bytes(b"not an archive")
    with pytest.raises(DataError, match="pickle.npz: not a NumPy .npz archive"):
        read_bags(tmp_path / "pickle.npz")


def test_a_bags_data_dir_and_the_built_in_task(tmp_path):
    kind = data_kind("bags")
    rng = np.random.default_rng(1)
    for name, n in (("train", 20), ("test", 6)):
        _write(tmp_path / f"{name}.npz", x=rng.normal(size=(n, 5, 3)).astype(np.float32),
               y=rng.integers(0, 3, n), mask=rng.random((n, 5)) < 0.8)
    data = kind.load(kind.source(data_dir=tmp_path))
    assert data.dims == {"n_features": 3, "n_classes": 3} and data.valid is None
    (batch,) = kind.batches(data.test, data.vocabs, 64)
    assert batch.features.shape[-1] == 3 and batch.tgt_out.shape == (6, 1)
    assert batch.n_tokens == 6 and bool(batch.src_mask.any(-1).all())
    _write(tmp_path / "test.npz", x=rng.normal(size=(2, 5, 3)), y=np.array([0, 7]))
    with pytest.raises(DataError, match="bag 1 \\(counted from 0\\) has label 7; the training"):
        kind.load(kind.source(data_dir=tmp_path))
    task = kind.load(kind.source("digit-bags", n_train=50))
    assert task.dims == {"n_features": 64, "n_classes": 2}
    labels = [b.label for b in task.train.pairs]
    assert 0 < sum(labels) < len(labels)
