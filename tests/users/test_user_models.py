"""Models a user writes from the documentation alone, through every method they declare and every
tool, on both backends: the multiple-instance classifier on bags (``tests/user_models/
bag_classifier.py`` and its NumPyro mirror), a tagger whose attention reads a latent dependency
tree (``tests/user_models/tree_tagger.py``) and a content aligner written in NumPyro alone
(``tests/models/content_numpyro.py``). (The tutorial's models go through every method on both
backends in the verification matrix, ``tests/parity/test_matrix.py``, and for 300 steps in
``benchmarks/finite_losses.py``.)

Each model is trained by ``compare`` with its default methods (all it declares on its backend);
every run must end finite and none may diverge; then ``evaluate`` (the same figure twice for one
``--seed`` on a sampled run), ``align`` (one line — or one tree — per test pair), ``analyze``,
``calibrate`` on every run, ``diagnose`` over all of them, and ``align --posterior importance``
on one sampling run. ``align`` and ``analyze`` must work on every run; ``calibrate`` may refuse
only a run where nothing is sampled, ``diagnose`` leave out only a run without an alignment
guide — a refusal is one line (exit 2), never a traceback. The whole suite is the integration
tier; one model through the main tools is the default tier's smoke test."""

import csv
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from ppl_attention.cli import main
from ppl_attention.data import make_task, write_pharaoh, write_tsv
from ppl_attention.data.bags import digit_bags

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "models"))
from tagged_trees import write_tagged_trees  # noqa: E402


def spec(path: str, cls: str) -> str:
    return f"{ROOT / path}:{cls}"


# the data a case trains on: a fixture's --data-dir (small test splits: every NumPyro tool call
# compiles once per batch shape), or the built-in task's command-line arguments
CASES = {
    "bag-pyro": (spec("tests/user_models/bag_classifier.py", "BagClassifier"), "bags"),
    "bag-numpyro": (spec("tests/user_models/bag_classifier_numpyro.py", "BagClassifier"),
                    "bags"),
    "content-numpyro": (spec("tests/models/content_numpyro.py", "ContentAlignment"), "pairs"),
    "tree-tagger": (spec("tests/user_models/tree_tagger.py", "TreeTagger"), "tagged_trees"),
}


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    """``digit-bags`` as a user's ``--data-dir`` of ``.npz`` files: 60 training bags, 24 test."""
    d = tmp_path_factory.mktemp("bags")
    task = digit_bags(n_train=60, n_eval=24)
    for name in ("train", "valid", "test"):
        split = getattr(task, name).pairs
        m = max(len(b) for b in split)
        x = np.zeros((len(split), m, split[0].features.shape[1]), np.float32)
        mask = np.zeros((len(split), m), bool)
        for i, b in enumerate(split):
            x[i, :len(b)], mask[i, :len(b)] = b.features, True
        np.savez(d / f"{name}.npz", x=x, y=np.array([b.label for b in split]), mask=mask)
    return d


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """``reorder`` as a user's ``--data-dir``: 60 training pairs, 24 test, gold links."""
    d = tmp_path_factory.mktemp("pairs")
    task = make_task("reorder", n_train=60, n_eval=24)
    for name in ("train", "valid", "test"):
        split = getattr(task, name)
        write_tsv(d / f"{name}.tsv", split.pairs)
        write_pharaoh(d / f"{name}.align", split.gold)
    return d


@pytest.fixture(scope="module")
def tagged_trees(tmp_path_factory):
    """Formulas whose target tags each word with its head's token (``root`` for the root's
    child), then ``<eos>``; gold trees as ``{split}.conllu``."""
    return write_tagged_trees(tmp_path_factory.mktemp("tagged"), 60, 20)


def _data(case, request):
    model, fixture = CASES[case]
    return model, ["--data-dir", str(request.getfixturevalue(fixture))]


def run_tool(capsys, *argv) -> tuple[int, str, str]:
    """One command in this process; (exit code, stdout, stderr)."""
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def applies(rc: int, err: str, what: str) -> bool:
    """A tool either works (exit 0) or refuses the run in one line (exit 2, ``error: …``)."""
    assert "Traceback" not in err, f"{what} crashed:\n{err}"
    assert rc in (0, 2), f"{what}: exit {rc}\n{err}"
    if rc == 2:
        lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert len(lines) == 1, f"{what}: exit 2 without one error line:\n{err}"
        print(f"[refused] {what}: {lines[0]}", file=sys.__stderr__)
    return rc == 0


def n_test_items(out: str, tree: bool) -> int:
    return out.count("\n\n") if tree else len(out.splitlines())


def check_run(capsys, run: Path, tmp: Path, n_test: int | None, twice: bool = True) -> dict:
    """evaluate (``twice`` where the figure is sampled: twice with one seed, the same figure),
    align, analyze and calibrate on one run; returns its report."""
    rc, out, err = run_tool(capsys, "evaluate", run, "--json", "--seed", "0")
    assert rc == 0, err
    first = json.loads(out)
    if twice and first.get("exact") not in (True, "yes"):
        rc, out, err = run_tool(capsys, "evaluate", run, "--json", "--seed", "0")
        assert rc == 0, err
        assert json.loads(out)["nll_per_token"] == first["nll_per_token"], run.name
    nll = first["nll_per_token"]
    assert math.isfinite(nll) and nll >= 0, f"{run.name}: NLL/token {nll}"

    rc, out, err = run_tool(capsys, "align", run)
    assert applies(rc, err, f"align {run.name}"), f"align refused {run.name}: {err}"
    tree = out.startswith("# sent_id") or "\t_\t" in out
    counted = n_test_items(out, tree)
    assert counted > 0, f"align {run.name}: nothing written"
    if n_test is not None:
        assert counted == n_test, f"align {run.name}: {counted} of {n_test} pairs"
    rc, out, err = run_tool(capsys, "analyze", run, "--out", tmp / f"an-{run.name}",
                            "--num-samples", "20")
    assert applies(rc, err, f"analyze {run.name}"), f"analyze refused {run.name}: {err}"
    assert (tmp / f"an-{run.name}" / "posterior.nc").is_file(), run.name
    rc, out, err = run_tool(capsys, "calibrate", run, "--num-sims", "10", "--draws", "9",
                            "--out", tmp / f"cal-{run.name}")
    if not applies(rc, err, f"calibrate {run.name}"):  # only where nothing is sampled
        assert "has no posterior to calibrate" in err, f"calibrate refused {run.name}: {err}"
    return first


@pytest.mark.integration
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_user_model_runs_every_declared_method_through_every_tool(case, request, tmp_path,
                                                                    capsys):
    model, data = _data(case, request)
    out = tmp_path / "cmp"
    rc, _, err = run_tool(capsys, "compare", "--model", model, *data, "--steps", "4",
                          "--out", out)
    assert rc == 0, err
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert len(rows) >= 2, f"{case}: compare ran {len(rows)} method(s)"
    for row in rows:
        assert row["status"] == "ok", f"{case} {row['method']}: {row['status']} {row['error']}"
        nll = float(row["nll_per_token"])
        assert math.isfinite(nll) and nll >= 0, f"{case} {row['method']}: NLL {nll}"
    runs = sorted((out / "runs").iterdir())
    n_test = None
    sampling = []
    for run in runs:
        report = check_run(capsys, run, tmp_path, n_test, twice=not sampling)
        n_test = n_test or report.get("n_pairs")
        if report.get("exact") not in (True, "yes"):
            sampling.append(run)
    rc, table, err = run_tool(capsys, "diagnose", *runs)
    assert rc == 0, err
    for r in runs:  # a row of its own, or named among those left out (no alignment guide)
        method = r.name.rsplit("-seed", 1)[0]
        assert f"| {method} |" in table or f"Left out: {r}: {method} " in table, (method, table)
    if sampling:
        run = sampling[0]
        rc, out, err = run_tool(capsys, "align", run, "--posterior", "importance",
                                "--importance-samples", "10", "--khat", tmp_path / "k.txt")
        if applies(rc, err, f"align --posterior importance {run.name}"):
            assert len((tmp_path / "k.txt").read_text().splitlines()) >= 1


@pytest.mark.torch
def test_a_user_bag_classifier_trains_evaluates_aligns_and_is_analysed(request, tmp_path,
                                                                      capsys):
    """The default tier's smoke test: the Pyro bag classifier by ``vae-sample``."""
    model, data = _data("bag-pyro", request)
    run = tmp_path / "run"
    rc, _, err = run_tool(capsys, "train", "--model", model, *data, "--method", "vae-sample",
                          "--steps", "4", "--out", run)
    assert rc == 0, err
    report = check_run(capsys, run, tmp_path, None)
    assert report["method"] == "vae-sample"
