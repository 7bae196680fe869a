"""Attention over segments in every tool, on both backends: a short ``segments-sample`` run on
the ``phrases`` task; ``align``'s links are every position of each token's MAP selection and
``evaluate``'s AER and segmentation F1 are those of exactly those links against the task's
gold; ``diagnose``'s E_q[AER] reads each draw's whole selection."""

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
