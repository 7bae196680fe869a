"""Start-up cost of the NumPyro side: the import time of ``ppl_attention.numpyro`` and the
wall time of a NumPyro-only command line (a model written in NumPyro alone,
``tests/models/content_numpyro.py``), each in a fresh interpreter, with whether torch and
Pyro were loaded.

    python benchmarks/startup.py [--tree PATH] [--reps 5]

``--tree`` runs a checkout of the package at another commit (a ``git worktree``), to measure
before and after a change in one session: the same interpreter, the same machine. The minimum
over the repeats is reported (the least disturbed run); the model file is the checkout's own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBE = """
import json, sys, time
t = time.perf_counter()
{body}
print(json.dumps({{"seconds": time.perf_counter() - t, "torch": "torch" in sys.modules,
                  "pyro": "pyro" in sys.modules}}))
"""

CASES = {
    "import ppl_attention.numpyro": "import ppl_attention.numpyro",
    "ppl-attention train --help (NumPyro model)":
        "import contextlib, io\nfrom ppl_attention.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n        main(['train', '--model', {model!r}, '--help'])\n"
        "    except SystemExit:\n        pass",
    "ppl-attention train, 1 step (NumPyro model)":
        "import contextlib, io\nfrom ppl_attention.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['train', '--model', {model!r}, '--task', 'reorder', '--n-train', '40',\n"
        "          '--method', 'soft', '--steps', '1', '--valid-every', '1000',\n"
        "          '--out', {out!r}])",
}


def measure(tree: Path, reps: int) -> dict:
    model = f"{tree / 'tests' / 'models' / 'content_numpyro.py'}:ContentAlignment"
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = {}
    for name, body in CASES.items():
        best = None
        for _ in range(reps):
            with tempfile.TemporaryDirectory() as d:
                code = PROBE.format(body=body.format(model=model, out=str(Path(d) / "run")))
                t = time.perf_counter()
                res = subprocess.run([sys.executable, "-c", code], env=env, cwd=d,
                                     capture_output=True, text=True, timeout=600)
                wall = time.perf_counter() - t
            if res.returncode != 0:
                raise SystemExit(f"{name}: failed\n{res.stderr[-2000:]}")
            r = json.loads(res.stdout.strip().splitlines()[-1])
            r["wall"] = wall
            if best is None or wall < best["wall"]:
                best = r
        out[name] = best
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]))
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    tree = Path(args.tree).resolve()
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    res = measure(tree, args.reps)
    print(f"\n{tree} at {commit}, min of {args.reps} fresh interpreters\n")
    print("| what | wall s (process) | s inside | torch loaded | Pyro loaded |")
    print("|---|---|---|---|---|")
    for name, r in res.items():
        print(f"| {name} | {r['wall']:.2f} | {r['seconds']:.2f} | "
              f"{'yes' if r['torch'] else 'no'} | {'yes' if r['pyro'] else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
