import ast
import importlib
import os
from pathlib import Path

import pytest

from ppl_attention.data import make_task, write_pharaoh, write_tsv

try:  # the NumPyro-only stack (CI's Python 3.12 leg) has neither torch nor Pyro
    import pyro
    import torch
except ModuleNotFoundError as missing:
    if missing.name not in ("torch", "pyro"):
        raise
    pyro = torch = None

if torch is not None:
    # One intra-op thread in the test process: the tests' tensors are tiny, and on a busy
    # 2-core machine torch's OpenMP threads spin at their barriers (tests/pyro/test_seq2seq.py:
    # 204 s with two threads, 26 s with one, at load 4). Subprocesses (examples, torchrun, Ray
    # workers) keep torch's default.
    torch.set_num_threads(1)

# The NumPyro tests compile many small programs and run each once or a few times: XLA's CPU
# backend at optimisation level 0 compiles them a third faster (a verification-matrix cell's
# value_and_grad: 18.9 → 12.2 s of compile) and runs them as fast at these sizes (the word
# aligners' tests: 83 s either way). Set before JAX starts its backend; a user's own setting
# of the option is kept. Only beside torch: the NumPyro-only leg's newer jaxlib is not
# measured with it.
if torch is not None and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_backend_optimization_level=0").strip()

TESTS = Path(__file__).parent
EXAMPLES = TESTS.parent / "examples"

#: without torch, the test modules left out because an import of theirs needs torch or Pyro
NOT_COLLECTED: list[str] = []


def _needs_torch(path: Path, seen: set) -> bool:
    """Whether a module-level import of the test file at ``path`` (or of a helper module beside
    it) fails for want of torch or Pyro: each imported module is imported, not read from a
    list kept by hand."""
    if path in seen or not path.exists():
        return False
    seen.add(path)
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level:
            helper = path.parent.joinpath(*([".."] * (node.level - 1)),
                                          *(node.module or "").split("."))
            if _needs_torch(helper.with_suffix(".py"), seen):
                return True
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module]
        else:
            continue
        for name in names:
            root = name.split(".")[0]
            helpers = sorted([*TESTS.rglob(f"{root}.py"), *EXAMPLES.rglob(f"{root}.py")])
            if helpers:  # a helper of the tests or an example (``brute_force``, ``diagonal``)
                if any(_needs_torch(h, seen) for h in helpers):
                    return True
                continue
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as missing:
                if missing.name and missing.name.split(".")[0] in ("torch", "pyro"):
                    return True
                raise
    return False


def pytest_ignore_collect(collection_path, config):
    """Without torch, a test module that needs it is not collected — and said so at the end
    (:func:`pytest_terminal_summary`), never silently."""
    if torch is not None or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    if _needs_torch(Path(collection_path), set()):
        NOT_COLLECTED.append(str(Path(collection_path).relative_to(config.rootpath)))
        return True
    return None


def pytest_collection_modifyitems(config, items):
    """Without torch, a test marked ``torch`` (it runs a Pyro model) is skipped with that
    reason — counted in the summary, never silently passed."""
    if torch is not None:
        return
    skip = pytest.mark.skip(reason="runs a Pyro model: torch and Pyro are not installed")
    for item in items:
        if item.get_closest_marker("torch"):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if NOT_COLLECTED:
        terminalreporter.write_line(
            f"torch and Pyro are not installed: {len(NOT_COLLECTED)} test modules that need "
            f"them were not collected ({', '.join(sorted(NOT_COLLECTED))})")


@pytest.fixture(scope="session", autouse=True)
def _jax_compilation_cache(pytestconfig):
    """JAX's persistent compilation cache (``ppl_attention.numpyro.inference.cache``) on from the
    session's start, in ``.pytest_cache/jax`` under the repository (git ignores it), not the
    user's: a program one test compiled (a NumPyro training step, a loss on the same batch) is
    loaded by the next — in this process, in the other pytest-xdist workers, in the commands
    the tests start and in the next tier (the second tier after the default one). Entries are
    keyed by the program, the flags and the library versions: a change of code compiles anew.
    Results are the same warm or cold; only compile time differs (`.ci/run` starts cold)."""
    try:
        from ppl_attention.numpyro.inference import cache
    except ImportError:  # without the numpyro extra
        yield
        return
    env = pytest.MonkeyPatch()
    env.setenv(cache.CACHE_ENV, str(pytestconfig.rootpath / ".pytest_cache" / "jax"))
    cache.enable_compilation_cache.cache_clear()
    cache.enable_compilation_cache()
    yield
    env.undo()
    cache.enable_compilation_cache.cache_clear()


@pytest.fixture(autouse=True)
def _fresh_pyro():
    """Each test starts with an empty param store and a fixed seed."""
    if pyro is None:
        yield
        return
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    torch.set_default_dtype(torch.float32)
    yield
    pyro.clear_param_store()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A small reorder corpus as a --data-dir: train/valid/test .tsv with gold .align."""
    d = tmp_path_factory.mktemp("corpus")
    task = make_task("reorder", n_train=40, n_eval=10, seed=1)
    for name, split in (("train", task.train), ("valid", task.valid), ("test", task.test)):
        write_tsv(d / f"{name}.tsv", split.pairs)
        write_pharaoh(d / f"{name}.align", split.gold)
    return d


def require_ray():
    """Ray, or a skip — except in CI (PPL_ATTENTION_CI set by .ci/run, which installs the ray
    extra), where a missing Ray fails the test instead of silently skipping every Ray test."""
    import os

    if os.environ.get("PPL_ATTENTION_CI"):
        import ray  # noqa: F401  (an ImportError here fails the test)

        return
    pytest.importorskip("ray")


#: the compare every test of the methods for global latents reads (NUTS the reference)
GLOBAL_REFERENCE = ["compare", "--model", "bayesian-ibm2", "--task", "reorder", "--n-train", "60",
                    "--methods", "nuts,hmc,svi-normal,svi-lowrank,svi-delta"]


@pytest.fixture(scope="session")
def global_reference(tmp_path_factory, worker_id):
    """The sweep directory of :data:`GLOBAL_REFERENCE` — NUTS, HMC and the three autoguides on the
    Bayesian IBM-2 — computed once per test session: the pytest-xdist workers share it through
    a lock in the session's temporary root (the first to take the lock runs it, the others read
    it). It runs in a fresh interpreter: JAX's global settings a test of the worker changed
    before (64-bit floats) must not move the reference's numbers."""
    import subprocess
    import sys

    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if worker_id != "master":  # every worker's basetemp lies in the session's root
        root = root.parent
    out = root / "global-reference"
    with FileLock(str(root / "global-reference.lock")):
        if not (out / "results.md").exists():
            code = ("import sys; from ppl_attention.cli import main; "
                    "sys.exit(main(sys.argv[1:]))")
            res = subprocess.run([sys.executable, "-c", code, *GLOBAL_REFERENCE, "--out",
                                  str(out)], capture_output=True, text=True)
            assert res.returncode == 0, res.stderr[-3000:]
    return out
