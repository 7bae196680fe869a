"""The examples run as a user runs them, and learn what they claim to."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(name: str) -> str:
    out = subprocess.run([sys.executable, name], cwd=EXAMPLES, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_exact_enumeration_recovers_the_alignment_table():
    err = float(re.search(r"max \|learned − true\| = ([\d.]+)", _run("categorical_exact.py"))[1])
    assert err < 0.08


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("[a-z]*.py")))
def test_every_example_runs(name):
    assert "final loss/token" in _run(name)
