"""Attention over segments (and over spans) in every tool, on both backends: a short
``segments-sample`` run on the ``phrases`` task; ``align``'s links are every position of each
token's MAP selection and ``evaluate``'s AER and segmentation F1 are those of exactly those
links against the task's gold; ``diagnose``'s E_q[AER] reads each draw's whole selection."""

import contextlib
import io
import json

import pytest

from ppl_attention.cli import main
from ppl_attention.common.metrics import aer, segment_scores
from ppl_attention.data import make_task
from ppl_attention.data.pharaoh import parse_pharaoh_line


def _cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    assert rc == 0, err.getvalue()
    return out.getvalue()


@pytest.mark.integration  # a training run and every tool, 35 s a backend
@pytest.mark.parametrize("backend", ["pyro", "numpyro"])
def test_align_evaluate_and_diagnose_read_the_selection(tmp_path, backend):
    run = tmp_path / "run"
    _cli(["train", "--task", "phrases", "--n-train", "200", "--method", "segments-sample",
          "--steps", "30", "--valid-every", "30", "--hidden", "16", "--backend", backend,
          "--out", str(run)])
    test = make_task("phrases", n_train=200).test
    lines = _cli(["align", str(run)]).splitlines()
    links = [parse_pharaoh_line(line, "align") for line in lines]
    assert len(links) == len(test.pairs)
    assert any(len({i for i, j in a if j == t}) > 1 for a in links for t in range(20))
    report = json.loads(_cli(["evaluate", str(run), "--json"]))
    assert report["aer"] == pytest.approx(aer(links, test.gold), abs=1e-12)
    seg = segment_scores(links, test.gold)
    assert report["segment_f1"] == pytest.approx(seg["segment_f1"], abs=1e-12)
    table = _cli(["diagnose", str(run), "--num-samples", "4"])
    assert "segments-sample" in table


@pytest.mark.integration  # a training run and every tool, about 40 s a backend
@pytest.mark.parametrize("backend", ["pyro", "numpyro"])
def test_every_tool_reads_the_constituency_selection(tmp_path, backend):
    """Attention over spans (``spans-sample``): ``align`` links every position a token's MAP
    tree reads, ``evaluate``'s AER and segmentation F1 are those links', ``diagnose`` reads the
    draws' read positions, ``calibrate`` reads each span as read or not (finite PITs and
    coverages), and ``analyze`` writes the weights as ArviZ data."""
    import arviz as az
    import numpy as np

    run = tmp_path / "run"
    _cli(["train", "--task", "phrases", "--n-train", "200", "--method", "spans-sample",
          "--steps", "30", "--valid-every", "30", "--hidden", "16", "--backend", backend,
          "--out", str(run)])
    test = make_task("phrases", n_train=200).test
    links = [parse_pharaoh_line(line, "align") for line in _cli(["align", str(run)]).splitlines()]
    assert len(links) == len(test.pairs)
    report = json.loads(_cli(["evaluate", str(run), "--json"]))
    assert report["aer"] == pytest.approx(aer(links, test.gold), abs=1e-12)
    assert report["segment_f1"] == pytest.approx(segment_scores(links, test.gold)["segment_f1"],
                                                 abs=1e-12)
    assert "spans-sample" in _cli(["diagnose", str(run), "--num-samples", "4"])
    _cli(["calibrate", str(run), "--num-sims", "10", "--draws", "9", "--out",
          str(tmp_path / "cal")])
    rows = json.loads((tmp_path / "cal" / "calibration.json").read_text())["rows"]
    assert rows[0]["tests"].keys() == {"per-part selected", "joint log q"}
    assert all(0 <= v <= 1 for v in rows[0]["coverage"].values())
    _cli(["analyze", str(run), "--out", str(tmp_path / "an"), "--num-samples", "4"])
    drawn = az.from_netcdf(str(tmp_path / "an" / "posterior.nc")).posterior["alignment"].values
    real = drawn[~np.isnan(drawn)]  # NaN on padding; each draw: its tree's weights
    assert real.size and np.isfinite(real).all() and (real >= 0).all()


@pytest.mark.torch  # trains a Pyro model
def test_segment_f1_from_any_corpus(tmp_path):
    """A selection family's segmentation F1 is reported from any gold, not only under
    ``--task phrases``: the same test split as a ``--data-dir`` corpus and as ``--data F --gold
    F.align`` gives the task's figures to the digit."""
    from ppl_attention.data import write_pharaoh, write_tsv

    run = tmp_path / "run"
    _cli(["train", "--task", "phrases", "--n-train", "200", "--method", "segments-marginals",
          "--steps", "20", "--valid-every", "20", "--hidden", "16", "--out", str(run)])
    task = json.loads(_cli(["evaluate", str(run), "--json"]))
    test = make_task("phrases", n_train=200).test
    data = tmp_path / "corpus"
    data.mkdir()
    write_tsv(data / "test.tsv", test.pairs)
    write_pharaoh(data / "test.align", test.gold)
    corpus = json.loads(_cli(["evaluate", str(run), "--data-dir", str(data), "--json"]))
    files = json.loads(_cli(["evaluate", str(run), "--data", str(data / "test.tsv"), "--gold",
                             str(data / "test.align"), "--json"]))
    for rep in (corpus, files):
        for key in ("segment_precision", "segment_recall", "segment_f1", "aer"):
            assert rep[key] == pytest.approx(task[key], abs=1e-12), key


@pytest.mark.torch  # trains a Pyro model
def test_max_len_from_the_command_line_and_a_run_loads_its_method_options(tmp_path):
    """``--max-len`` sets the segment family's longest segment; the run directory records it
    and loads with it (a run's method options that are family parameters — ``--max-len``,
    ``--max-active`` — were dropped on load, so ``evaluate`` scored another model)."""
    from ppl_attention.common.runs import Run

    run = tmp_path / "run"
    trained = json.loads(_cli(["train", "--task", "phrases", "--n-train", "200", "--method",
                               "segments-sparsemap", "--max-len", "2", "--max-active", "4",
                               "--steps", "3", "--valid-every", "3", "--hidden", "8",
                               "--out", str(run)]))
    loaded = Run.load(run)
    assert loaded.model.family._config()["max_len"] == 2
    assert loaded.model.family._config()["max_active"] == 4
    again = json.loads(_cli(["evaluate", str(run), "--json"]))
    assert again["nll_per_token"] == pytest.approx(trained["nll_per_token"], rel=1e-9)
    assert again["support"] == pytest.approx(trained["support"], rel=1e-9)
