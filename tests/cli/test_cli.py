"""The ppl-attention command end to end on a small --data-dir, and its errors."""

import json
import re

import pytest

from ppl_attention.cli import main

pytestmark = pytest.mark.torch  # every test here runs a Pyro model

SMALL = ["--steps", "6", "--hidden", "8", "--batch-size", "8", "--valid-every", "3"]


@pytest.fixture(scope="module")
def run_dir(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "vae"
    assert main(["train", "--data-dir", str(data_dir), "--method", "vae-enum", "--out", str(out),
                 *SMALL]) == 0
    return out


def test_train_writes_a_complete_run(run_dir):
    names = {p.name for p in run_dir.iterdir()}
    assert {"config.json", "checkpoint.pt", "metrics.json", "learning_curve.png",
            "COMPLETE"} <= names


def test_evaluate_json(run_dir, data_dir, capsys):
    assert main(["evaluate", str(run_dir), "--data-dir", str(data_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("nll_per_token", "ppl", "exact", "aer", "n_pairs", "n_tokens", "method"):
        assert key in report
    assert report["exact"] is True and report["method"] == "vae-enum"
    assert report["n_pairs"] == 10 and 0 <= report["aer"] <= 1
    assert main(["evaluate", str(run_dir), "--data", str(data_dir / "test.tsv"), "--gold",
                 str(data_dir / "test.align"), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["nll_per_token"] == report["nll_per_token"] and again["aer"] == report["aer"]


def test_align_prints_pharaoh_per_pair(run_dir, data_dir, capsys):
    assert main(["align", str(run_dir), "--data", str(data_dir / "test.tsv")]) == 0
    lines = capsys.readouterr().out.splitlines()
    pairs = (data_dir / "test.tsv").read_text().splitlines()
    assert len(lines) == len(pairs)
    for line, pair in zip(lines, pairs):
        src, tgt = (f.split() for f in pair.split("\t"))
        links = [tuple(map(int, x.split("-"))) for x in line.split()]
        assert sorted(j for _, j in links) == list(range(len(tgt)))
        assert all(0 <= i < len(src) for i, _ in links)


def test_unseen_tokens_are_counted(run_dir, tmp_path, capsys):
    f = tmp_path / "new.tsv"
    f.write_text("s1 NEWTOKEN s2\tt1 t2 ALSO_NEW\n")
    assert main(["evaluate", str(run_dir), "--data", str(f), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["n_unk"] == 2
    assert "2 token(s) unseen in training were mapped to <unk>" in out.err


def test_bad_inputs_give_one_clear_error(run_dir, tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    bad.write_text("a b\tc\nmissing tab\n")
    assert main(["evaluate", str(run_dir), "--data", str(bad)]) == 2
    assert re.search(r"error: .*bad\.tsv:2: expected 'source<TAB>target'", capsys.readouterr().err)
    good = tmp_path / "good.tsv"
    good.write_text("s1 s2\tt1\n")
    align = tmp_path / "g.align"
    align.write_text("0-0\n0-1\n")
    assert main(["evaluate", str(run_dir), "--data", str(good), "--gold", str(align)]) == 2
    assert "g.align: 2 alignment lines but the corpus has 1 pairs" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "nope")]) == 2
    assert "not a complete run directory" in capsys.readouterr().err
    assert main(["train", "--task", "reorder", "--method", "hardest", "--out",
                 str(tmp_path / "x"), *SMALL]) == 2
    assert "unknown method 'hardest'" in capsys.readouterr().err
    assert main(["train", "--model", "seq-vae", "--task", "reorder", "--encoder-layers", "2",
                 "--out", str(tmp_path / "v"), *SMALL]) == 2
    assert "unrecognized arguments: --encoder-layers 2" in capsys.readouterr().err
    assert not (tmp_path / "v").exists()


def _csv_numbers(path):
    """(method, seed, status, exact, the deterministic numbers) of each row of results.csv
    (ms_per_step is wall time)."""
    import csv

    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    numbers = ["nll_per_token", "elbo_per_token", "aer", "floor_nll_per_token"]
    return [(r["method"], r["seed"], r["status"], r["exact"],
             *(float(r[k]) for k in numbers if r[k])) for r in rows]


@pytest.mark.integration  # a whole pipeline: the second tier
def test_compare_writes_table_and_figures(tmp_path, capsys):
    out = tmp_path / "cmp"
    args = ["compare", "--task", "reorder", "--n-train", "300", "--methods", "exact,soft",
            "--seeds", "2", *SMALL]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| exact |" in printed and "| soft |" in printed
    rows = (out / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + 4
    for name in ("results.md", "learning_curves.png", "nll.png", "aer_vs_nll.png"):
        assert (out / name).stat().st_size > 0
    # two worker processes give the same table, in the same order
    assert main([*args, "--jobs", "2", "--out", str(tmp_path / "cmp2")]) == 0
    one, two = _csv_numbers(out / "results.csv"), _csv_numbers(tmp_path / "cmp2" / "results.csv")
    assert [r[:4] for r in one] == [r[:4] for r in two]
    assert all(r[2] == "ok" for r in one)
    for a, b in zip(one, two):
        assert a[4:] == pytest.approx(b[4:], rel=1e-4)


def test_task_size_and_bad_counts(tmp_path, capsys):
    assert main(["compare", "--task", "reorder", "--seeds", "0", "--out", str(tmp_path)]) == 2
    assert "--seeds must be at least 1" in capsys.readouterr().err
    assert main(["train", "--task", "reorder", "--n-train", "0", "--out", str(tmp_path / "r"),
                 *SMALL]) == 2
    assert "--n-train must be at least 1" in capsys.readouterr().err


def test_train_checkpoint_every_writes_partial_checkpoints(data_dir, tmp_path, monkeypatch):
    """`train --checkpoint-every N` saves a resumable PARTIAL run directory every N steps (the
    CLI once forgot to hand fit the run directory, so nothing was written until the end)."""
    from ppl_attention.common.runs import Run

    saved = []
    real_save = Run.save

    def spy(self, path, complete=True):
        saved.append((self.step, complete))
        return real_save(self, path, complete)

    monkeypatch.setattr(Run, "save", spy)
    out = tmp_path / "ckpt"
    assert main(["train", "--data-dir", str(data_dir), "--method", "exact", "--out", str(out),
                 "--checkpoint-every", "2", *SMALL]) == 0
    assert (2, False) in saved and (4, False) in saved
    assert (out / "COMPLETE").exists() and not (out / "PARTIAL").exists()


@pytest.mark.parametrize("command", ["train", "compare", "sweep"])
def test_every_model_builds_its_options(command):
    """Each model's data, model and method options share one parser without a clash (a data
    option ``--noise`` once met the relaxations' flag of that name)."""
    from ppl_attention.cli import build_parser
    from ppl_attention.common.registry import MODELS

    for name in MODELS:
        build_parser([command, "--model", name])
