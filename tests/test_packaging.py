"""The install commands the project documents name extras that exist, and the GPU extra is the
NumPyro one with JAX's CUDA build in the same version range.

Planted once: ``numpyro-cuda`` misspelt ``numpyro-cuda12`` in pyproject.toml; caught by
test_every_extra_an_install_command_names_exists ("README.md names extras ['numpyro-cuda'] that
pyproject.toml does not define") and by test_the_cuda_extra_is_the_numpyro_extra_with_cuda_jax
(KeyError 'numpyro-cuda'). Restored.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")

ROOT = Path(__file__).resolve().parents[1]
INSTALL = re.compile(r'pip install[^\n]*?-e\s+"?\.\[([^\]]+)\]')


def _extras() -> dict[str, list[Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {name: [Requirement(r) for r in reqs]
            for name, reqs in project["optional-dependencies"].items()}


def _documented() -> dict[str, set[str]]:
    """File → the extras its ``pip install -e ".[…]"`` commands name."""
    files = [ROOT / "README.md", ROOT / ".ci" / "run", *sorted((ROOT / "docs").glob("*.md"))]
    out = {}
    for f in files:
        if f.is_file():
            named = {e.strip() for m in INSTALL.findall(f.read_text()) for e in m.split(",")}
            if named:
                out[str(f.relative_to(ROOT))] = named
    return out


def test_every_extra_an_install_command_names_exists():
    documented, extras = _documented(), _extras()
    assert {"dev", "numpyro", "numpyro-cuda", "ray"} <= documented["README.md"]
    for where, named in documented.items():
        missing = sorted(named - set(extras))
        assert not missing, f"{where} names extras {missing} that pyproject.toml does not define"


def test_the_cuda_extra_is_the_numpyro_extra_with_cuda_jax():
    extras = _extras()
    cpu = {r.name: r for r in extras["numpyro"]}
    gpu = {r.name: r for r in extras["numpyro-cuda"]}
    assert set(gpu) == set(cpu), "numpyro-cuda must pull what the numpyro extra pulls"
    jax = gpu["jax"]
    assert any(re.fullmatch(r"cuda\d+", e) for e in jax.extras), f"{jax}: not a CUDA build"
    assert jax.specifier == cpu["jax"].specifier, f"{jax} vs {cpu['jax']}: another range"
    for name in set(cpu) - {"jax"}:
        assert gpu[name].specifier == cpu[name].specifier, f"{gpu[name]} vs {cpu[name]}"
