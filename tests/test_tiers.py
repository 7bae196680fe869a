"""The test tiers partition the suite: README's command (`python -m pytest -q`, pyproject's
``-m`` expression, what ``.ci/run`` runs) and README's second-tier command together select every
combination of the tier markers exactly once."""

import itertools
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIER_MARKERS = ("slow", "statistical", "integration")


def _commands():
    pyproject = (ROOT / "pyproject.toml").read_text()
    addopts = re.search(r'^addopts = "(.*)"$', pyproject, re.M)[1]
    default = re.search(r"-m '([^']+)'", addopts)[1]
    assert "--strict-markers" in addopts  # a misspelt tier marker is an error, not the default
    main_leg, _, newest_leg = (ROOT / ".ci" / "run").read_text().partition("\n# Second leg")
    ci = [line for line in main_leg.splitlines() if line.startswith("python -m pytest")]
    assert ci == ["python -m pytest -q"], ci  # README's command
    readme = (ROOT / "README.md").read_text()
    assert "python -m pytest -q\n" in readme
    leg = [line for line in newest_leg.splitlines() if line.startswith("python -m pytest")]
    assert leg and leg[0] == "python -m pytest -q", leg  # the NumPyro-only leg: the same tier
    second = re.search(r'`python -m pytest -q -m "([^"]+)"`', " ".join(readme.split()))[1]
    registered = re.findall(r'^    "(\w+):', pyproject, re.M)
    assert set(TIER_MARKERS) <= set(registered), registered
    return default, second


def _selected(tmp_path, expression):
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning",
                          "-m", expression, str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode in (0, 5), res.stdout + res.stderr
    return {line.split("::")[1] for line in res.stdout.splitlines() if "::" in line}


def test_every_marker_combination_runs_in_exactly_one_tier(tmp_path):
    default, second = _commands()
    combos = [c for r in range(len(TIER_MARKERS) + 1)
              for c in itertools.combinations(TIER_MARKERS, r)]
    lines = ["import pytest", ""]
    for combo in combos:
        lines += [f"@pytest.mark.{m}" for m in combo]
        lines += [f"def test_{'_'.join(combo) or 'unmarked'}():", "    pass", ""]
    (tmp_path / "test_combos.py").write_text("\n".join(lines))
    first, other = _selected(tmp_path, default), _selected(tmp_path, second)
    assert first == {"test_unmarked"}, first
    assert not first & other and len(first | other) == len(combos)
