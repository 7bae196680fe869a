"""Every method a model declares, on both backends, trained for N steps: are the losses finite
throughout, and are the reported figures possible? The table of docs/results.md, *Your model
by every method*.

    python benchmarks/finite_losses.py --steps 300 --out runs/finite

trains the tutorial's model (`examples/tutorial/diagonal.py` under Pyro,
`diagonal_numpyro.py` under NumPyro) on `reorder` by ``ppl-attention compare`` with its default
methods (every method the model and the backend support; ``--methods`` keeps those of a list
the model supports), then reads each run directory:
the number of steps, the smallest and largest training loss, whether every one is finite, the
test NLL/token (against the task's floor, the generator's exact NLL/token, where it has one)
and whether the run diverged. ``--models`` takes other ``path:Class`` specs or registry names
(``seq2seq``; ``seq2seq@numpyro`` for its NumPyro twin) and ``--task`` another built-in task
(``digit-bags`` for the bag classifiers).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = [f"{ROOT}/examples/tutorial/diagonal.py:DiagonalAlignment",
            f"{ROOT}/examples/tutorial/diagonal_numpyro.py:DiagonalAlignment"]


def summarize(sweep: Path) -> list[dict]:
    """One row per run directory of a ``compare`` output."""
    rows = []
    for run in sorted((sweep / "runs").iterdir()):
        hist = json.loads((run / "metrics.json").read_text())["history"]
        losses = [h["train_loss"] for h in hist]
        finite = all(x is not None and math.isfinite(x) for x in losses)
        diverged = (run / "DIVERGED").exists()
        rep = {}
        state = run / "state.json"
        if state.exists():
            rep = json.loads(state.read_text()).get("extra", {}).get("test_report", {})
        else:
            import torch

            ckpt = torch.load(run / "checkpoint.pt", weights_only=True, map_location="cpu")
            rep = (ckpt.get("extra") or {}).get("test_report", {})
        rows.append({"run": run.name, "steps": len(losses), "finite": finite and not diverged,
                     "min_loss": min(losses) if losses else None,
                     "max_loss": max(losses) if losses else None,
                     "nll": rep.get("nll_per_token"), "exact": rep.get("exact"),
                     "diverged": json.loads((run / "DIVERGED").read_text())["message"]
                     if diverged else None})
    return rows


def _floor(sweep: Path) -> float | None:
    """The task's floor as ``compare``'s table states it (the generator's exact NLL/token)."""
    md = sweep / "results.md"
    if not md.exists():
        return None
    m = re.search(r"exact NLL/token\): ([0-9.]+)", md.read_text())
    return float(m.group(1)) if m else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=TUTORIAL)
    ap.add_argument("--task", default="reorder", help="the built-in task every model trains on")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--n-train", type=int, default=5000)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="runs/finite")
    ap.add_argument("--methods", help="comma-separated: those of them each model supports")
    args = ap.parse_args(argv)
    bad = 0
    lines = ["| model | backend | method | steps | all losses finite | min loss | max loss | "
             "test NLL/token |", "|---|---|---|---|---|---|---|---|"]
    for spec in args.models:
        spec, _, backend_opt = spec.partition("@")
        name = Path(spec.split(":")[0]).stem + (f"-{backend_opt}" if backend_opt else "")
        out = Path(args.out) / name
        cmd = ["ppl-attention", "compare", "--model", spec, "--task", args.task, "--n-train",
               str(args.n_train), "--steps", str(args.steps), "--lr", str(args.lr),
               "--jobs", str(args.jobs), "--out", str(out)]
        if backend_opt:
            cmd += ["--backend", backend_opt]
        if args.methods:
            from ppl_attention.cli.compare import supported_methods
            from ppl_attention.common.registry import load_model_class

            ok = set(supported_methods(load_model_class(spec), backend_opt or None))
            kept = [m for m in args.methods.split(",") if m in ok]
            if not kept:
                print(f"{name}: supports none of --methods", file=sys.stderr)
                bad += 1
                continue
            cmd += ["--methods", ",".join(kept)]
        print(" ".join(cmd), file=sys.stderr)
        rc = subprocess.run(cmd).returncode
        if rc not in (0, 3):  # 3: some run diverged (its row says so below)
            print(f"compare failed with exit status {rc}", file=sys.stderr)
            bad += 1
        backend = "numpyro" if "numpyro" in name else "pyro"
        floor = _floor(out)
        for r in summarize(out):
            method = r["run"].rsplit("-seed", 1)[0]
            nll = "—" if r["nll"] is None else f"{r['nll']:.3f}" + ("" if r["exact"] else
                                                                     " (IWAE-10)")
            lines.append(f"| {name} | {backend} | {method} | {r['steps']} | "
                         f"{'yes' if r['finite'] else 'NO: ' + (r['diverged'] or 'nan')} | "
                         f"{r['min_loss']:.3f} | {r['max_loss']:.3f} | {nll} |")
            below = floor is not None and r["nll"] is not None and r["nll"] < floor - 1e-6
            if below:
                lines[-1] += f" BELOW the floor {floor:.3f}"
            bad += not r["finite"] or r["nll"] is None or r["nll"] < 0 or below
    print("\n".join(lines))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
