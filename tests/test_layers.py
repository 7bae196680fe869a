"""The floors of the package, beyond what `lint-imports` checks in CI (pyproject.toml): the
NumPyro mirror imports no private name of the Pyro side — what both backends need lives once,
below both (ppl_attention.core) — and the layers contract itself passes."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "ppl_attention"


def _private_imports(path: Path) -> list[str]:
    """``from <module outside the mirror> import _name`` in a NumPyro-side module."""
    out = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            inside = (node.module.startswith("ppl_attention.numpyro") if node.level == 0
                      else _resolves_inside(path, node))
            if inside:
                continue
            out += [f"{path.name}:{node.lineno} {node.module}.{a.name}" for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def _resolves_inside(path: Path, node: ast.ImportFrom) -> bool:
    """Does a relative import stay inside ppl_attention/numpyro?"""
    base = path.parent
    for _ in range(node.level - 1):
        base = base.parent
    return (PKG / "numpyro") in (base, *base.parents)


def test_the_numpyro_side_imports_no_private_pyro_side_name(tmp_path):
    files = sorted((PKG / "numpyro").rglob("*.py"))
    assert files
    hits = [h for f in files for h in _private_imports(f)]
    assert not hits, hits
    # the check itself: a planted `from ...families import _normalize` is caught
    planted = PKG / "numpyro" / "_planted_probe.py"
    planted.write_text("from ..families import _normalize  # noqa\n")
    try:
        assert _private_imports(planted)
    finally:
        planted.unlink()


def test_the_layers_contract_holds():
    res = subprocess.run([str(Path(sys.executable).parent / "lint-imports")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "0 broken" in res.stdout


def test_every_arviz_call_goes_through_one_module():
    """ArviZ 1.x is a new API: porting to it is ppl_attention/common/arviz_api.py alone, so no other
    module of the package imports arviz (planted: an ``import arviz as az`` in diagnostics.py —
    caught)."""
    import re

    root = Path(__file__).resolve().parents[1] / "ppl_attention"
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if p.name != "arviz_api.py"
                 and re.search(r"^\s*(import arviz|from arviz)", p.read_text(), re.M)]
    assert offenders == []
