"""Jobs per hour of one 12-job sweep run three ways on this machine, measured in one run:
in this process one job after another, ``--jobs 2`` worker processes, and ``--ray local``
(a Ray cluster started on this machine's CPUs, one CPU per job).

    python benchmarks/sweep.py --steps 300 --out runs/sweep-bench

12 jobs = methods exact, vae-enum, soft × 2 seeds × ``--set hidden=32,64`` on the built-in
reorder task. Each mode runs as its own ``ppl-attention sweep`` process into a fresh directory,
so start-up (Python, torch, Ray's cluster and workers) counts; the table's NLL column shows the
three modes trained the same runs.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import subprocess
import sys
import time
from pathlib import Path

MODES = {"in-process": [], "--jobs 2": ["--jobs", "2"], "--ray local": ["--ray", "local"]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default="runs/sweep-bench")
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args(argv)
    out = Path(args.out)
    rows = []
    for mode in args.modes.split(","):
        d = out / mode.strip("-").replace(" ", "-")
        shutil.rmtree(d, ignore_errors=True)
        cmd = [sys.executable, "-m", "ppl_attention.cli", "sweep", "--task", "reorder",
               "--methods", "exact,vae-enum,soft", "--seeds", "2", "--set", "hidden=32,64",
               "--steps", str(args.steps), "--valid-every", str(args.steps), "--out", str(d),
               *MODES[mode]]
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t
        if r.returncode != 0:
            sys.exit(f"{mode} failed:\n{r.stderr[-3000:]}")
        with open(d / "results.csv", newline="") as f:
            res = list(csv.DictReader(f))
        nll = sum(float(x["nll_per_token"]) for x in res) / len(res)
        rows.append((mode, len(res), wall, nll))
        print(f"[bench] {mode}: {len(res)} jobs in {wall:.1f} s", file=sys.stderr)
    base = rows[0][1] / rows[0][2]
    print(f"12-job sweep, {args.steps} steps each (reorder, exact / vae-enum / soft × 2 seeds × "
          f"hidden 32, 64)\n")
    print("| mode | jobs | wall clock | jobs/hour | ratio | mean NLL/token |")
    print("|---|---|---|---|---|---|")
    for mode, n, wall, nll in rows:
        rate = n / wall
        print(f"| {mode} | {n} | {wall:.0f} s | {3600 * rate:.0f} | {rate / base:.2f} | "
              f"{nll:.4f} |")


if __name__ == "__main__":
    main()
