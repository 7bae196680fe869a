"""The package's layout: one folder a floor, listed with its job in docs/architecture.md; the
two backends mirror each other file by file and no other module name repeats; old import paths
work through the one compatibility module, warn, and are used nowhere in the tree."""

import re
import warnings
from pathlib import Path

import pytest

from ppl_attention import compat

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "ppl_attention"


def _documented_folders(text: str) -> list[str]:
    block = text.split("<!-- folders -->")[1].split("<!-- end of folders -->")[0]
    return re.findall(r"^- `(\w+)/` — \S", block, re.M)


def _folders() -> list[str]:
    return sorted(p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists())


def test_architecture_gives_each_folder_one_line():
    documented = _documented_folders((ROOT / "docs" / "architecture.md").read_text())
    assert sorted(documented) == _folders()
    # planted: a folder the page does not list is caught
    assert sorted(documented[1:]) != _folders()


def _repeats(paths: list[Path]) -> list[str]:
    """Module names found more than once, unless the copies are the two backends' mirrors
    (the same path under pyro/ and numpyro/)."""
    by_name: dict[str, list[Path]] = {}
    for p in paths:
        if p.name not in ("__init__.py", "__main__.py"):
            by_name.setdefault(p.name, []).append(p.relative_to(PKG))
    bad = []
    for name, found in by_name.items():
        if len(found) == 1:
            continue
        inside = {(f.parts[0], f.parts[1:]) for f in found}
        if not (len(found) == 2 and {b for b, _ in inside} == {"pyro", "numpyro"}
                and len({rest for _, rest in inside}) == 1):
            bad.append(f"{name}: {', '.join(map(str, found))}")
    return bad


def test_no_module_name_repeats_but_the_backend_mirrors():
    paths = sorted(PKG.rglob("*.py"))
    assert _repeats(paths) == []
    # planted: a third evaluate.py (or a mirror at another depth) is caught
    assert _repeats(paths + [PKG / "common" / "evaluate.py"])
    assert _repeats([PKG / "pyro" / "fit.py", PKG / "numpyro" / "inference" / "fit.py"])


OLD = re.compile(r"\bppl_attention(?:\.\w+)+")


def _old_path_uses(text: str) -> list[str]:
    uses = []
    for m in OLD.finditer(text):
        name = m.group(0)
        # the longest prefix that names a module decides (an attribute may follow it)
        parts = name.split(".")
        for k in range(len(parts), 1, -1):
            head = ".".join(parts[:k])
            if compat.new_path(head) != head:
                uses.append(name)
                break
    return uses


def test_nothing_in_the_tree_uses_an_old_path():
    files = [p for d in ("ppl_attention", "tests", "benchmarks", "examples")
             for p in (ROOT / d).rglob("*.py")]
    files += [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "pyproject.toml"]
    skip = {PKG / "compat.py", Path(__file__).resolve()}
    hits = {str(f.relative_to(ROOT)): u for f in files if f not in skip
            and (u := _old_path_uses(f.read_text()))}
    assert hits == {}
    # planted: an old path in a docstring is caught
    assert _old_path_uses("see :mod:`ppl_attention.inference.fit`") == [
        "ppl_attention.inference.fit"]


@pytest.mark.parametrize("old", sorted(compat.OLD_PATHS))
def test_an_old_path_imports_the_new_module_and_warns(old):
    import importlib
    import sys

    name = f"ppl_attention.{old}"
    parts = name.split(".")
    for k in range(2, len(parts) + 1):  # the old path's packages, then the module itself
        try:
            importlib.import_module(compat.new_path(".".join(parts[:k])))
        except ModuleNotFoundError as e:  # a backend not installed (the NumPyro-only leg)
            pytest.skip(f"{compat.new_path('.'.join(parts[:k]))} needs {e.name}")
    sys.modules.pop(name, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(name)
    new = importlib.import_module(compat.new_path(name))
    assert module is new
    assert module.__spec__.name == new.__name__  # its own spec, not the alias's
    assert any(issubclass(w.category, FutureWarning) and compat.new_path(name) in str(w.message)
               for w in caught)
