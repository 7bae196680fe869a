"""The examples run as a user runs them (``cd examples && python NAME.py``) and print the figures
docs/results.md quotes for them (the "Examples" section and the NUTS reference table)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: the largest error of the learned alignment table, as docs/results.md quotes it (seed 0)
DOCUMENTED = {"categorical_exact.py": "0.030", "categorical_vae.py": "0.033",
              "relaxed_categorical.py": "0.14", "dirichlet.py": "0.15",
              "gaussian_context.py": "0.19", "soft.py": "0.20", "weibull.py": "0.28",
              "lognormal.py": "0.45"}
#: a wider band where other machines printed other figures (docs/results.md, "Examples"): the
#: BAM-LogNormal contextual prior is a key-only network that cannot hold a per-query table, and
#: where it collapses on the rare keys depends on the machine (0.446 here, 0.47 and 0.298 seen)
TOLERANCE = {"lognormal.py": 0.2}


def _run(name: str) -> str:
    out = subprocess.run([sys.executable, name], cwd=EXAMPLES, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_every_per_family_example_is_documented():
    assert set(DOCUMENTED) == {p.name for p in EXAMPLES.glob("[a-z]*.py")}
    text = (EXAMPLES.parent / "docs" / "results.md").read_text()
    for value in DOCUMENTED.values():
        assert value in text


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_example_prints_its_documented_error(name):
    out = _run(name)
    assert "final loss/token" in out
    err = float(re.search(r"max \|learned − true\| = ([\d.]+)", out)[1])
    digits = len(DOCUMENTED[name].split(".")[1])
    # one unit of the last quoted digit: summation order differs between machines
    tolerance = TOLERANCE.get(name, 10 ** -digits)
    assert abs(err - float(DOCUMENTED[name])) <= tolerance, (name, err, DOCUMENTED[name], out)


@pytest.mark.integration
def test_ctc_example_prints_its_documented_frame_accuracy():
    """examples/structures/ctc_frames.py (a user's model with a CTC alignment summed out
    exactly, its MAP path labelling the frames): the frame accuracy docs/results.md quotes."""
    out = subprocess.run([sys.executable, "ctc_frames.py"], cwd=EXAMPLES / "structures",
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    acc = float(re.search(r"frame accuracy: ([\d.]+)", out.stdout)[1])
    assert "frame accuracy: 0.874" in (EXAMPLES.parent / "docs" / "results.md").read_text()
    assert abs(acc - 0.874) <= 0.02, out.stdout
