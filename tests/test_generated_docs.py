"""Documents generated from the code stay what their generator writes: ``docs/verification.md``
is what ``python tests/matrix.py`` writes when every cell of the verification matrix passes
(the tiers run every one of those tests, so a committed document with a FAIL, a MISSING cell, a
method the registry no longer has or one it gained since is stale). Regenerate it with
``python tests/matrix.py``. (The contract tables of ``docs/architecture.md`` are checked in
``tests/pyro/test_contract.py``.)"""

import difflib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import matrix  # noqa: E402


def test_verification_md_is_what_the_matrix_writes():
    lines, missing = matrix.render(matrix.every_cell_passed())
    assert not missing
    expected = "\n".join(lines) + "\n"
    written = (ROOT / "docs" / "verification.md").read_text()
    diff = "".join(difflib.unified_diff(written.splitlines(True), expected.splitlines(True),
                                        "docs/verification.md", "python tests/matrix.py", n=0))
    assert written == expected, ("docs/verification.md is stale; regenerate it with `python "
                                 f"tests/matrix.py`:\n{diff[:3000]}")
