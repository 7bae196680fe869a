"""The GPU column in one command: run on a machine with a CUDA GPU (after README's GPU set-up),

    python benchmarks/gpu.py [--out runs/gpu] [--write]

1. the backends table — Pyro against NumPyro on the same Seq2SeqAlignment, every method, two
   sizes — on the GPU and on the CPU (``benchmarks/backends.py --device cuda|cpu``);
2. the structured table: the monotonic chain's log p(y | x), banded recursion against the
   parallel scan, at T = S ∈ {128, 512, 2048}, both backends (``benchmarks/structured.py``);
3. ``ppl-attention compare`` on ``reorder`` under both backends with ``--device cuda``.

It prints the tables with the device's name and the commit; ``--write`` also puts them into
docs/results.md (the section between the ``gpu-column`` markers) and writes the GPU rule of
``MonotonicAlignment``'s ``"auto"`` path — the smallest T from which the scan beat the banded
recursion on this GPU, and the largest S where it did — into
``ppl_attention/structures/gpu_rule.json``, which ``structures/chain_paths.py`` reads. Every
step has a time limit; a step that fails says so in its table and the others still run.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- gpu-column:begin -->", "<!-- gpu-column:end -->"


def run(cmd: list[str], timeout: int) -> str:
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    t = time.perf_counter()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        out = res.stdout + (f"\n(exit {res.returncode}: {res.stderr.strip()[-400:]})"
                            if res.returncode else "")
    except subprocess.TimeoutExpired:
        out = f"(stopped after {timeout} s)"
    print(f"  {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return out


def device_name() -> str:
    import torch

    if not torch.cuda.is_available():
        sys.exit("error: benchmarks/gpu.py needs a CUDA GPU that torch sees (README: set-up on "
                 "a GPU)")
    return torch.cuda.get_device_name(0)


def gpu_rule(cells: list[dict]) -> dict | None:
    """The smallest T at which the parallel scan was faster than the banded recursion (both
    backends agreeing), and the largest S at which it was; None if it never was."""
    wins = []
    for c in cells:
        b, p = c.get("banded"), c.get("parallel")
        if isinstance(b, list) and isinstance(p, list) and p[0] < b[0]:
            wins.append((c["n"], c["S"]))
    if not wins:
        return None
    return {"min_T": min(t for t, _ in wins), "max_S": max(s for _, s in wins)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/gpu")
    ap.add_argument("--write", action="store_true",
                    help="write docs/results.md's GPU column and the GPU rule of 'auto'")
    ap.add_argument("--quick", action="store_true", help="fewer reps, shorter compare")
    args = ap.parse_args(argv)
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    name = device_name()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    py = sys.executable
    reps = "2" if args.quick else "5"
    parts = {}
    for dev in ("cuda", "cpu"):
        parts[f"backends-{dev}"] = run([py, "benchmarks/backends.py", "--reps", reps,
                                        "--device", dev], 900)
    structured = out / "structured.json"
    parts["structured"] = run([py, "benchmarks/structured.py", "--sizes", "128,512,2048",
                               "--impls", "banded,parallel", "--reps", "3", "--timeout", "120",
                               "--max-gb", "40", "--device", "cuda", "--json",
                               str(structured)], 1800)
    steps = "100" if args.quick else "300"
    for backend in ("pyro", "numpyro"):
        parts[f"compare-{backend}"] = run(
            [py, "-m", "ppl_attention.cli", "compare", "--task", "reorder", "--methods",
             "exact,vae-enum,vae-sample,dirichlet,bam-weibull", "--steps", steps, "--backend",
             backend, "--device", "cuda", "--out", str(out / f"compare-{backend}")], 1800)
    cells = json.loads(structured.read_text()) if structured.exists() else []
    rule = gpu_rule(cells)
    text = [BEGIN, f"### The GPU column ({name})", "",
            f"*Measured on `{commit}` with `python benchmarks/gpu.py --write` on one {name}.*",
            ""]
    for key, body in parts.items():
        text += [f"**{key}**", "", "```", body.strip(), "```", ""]
    text += ["GPU rule of `MonotonicAlignment(method=\"auto\")` from these cells: "
             + (f"the scan from T ≥ {rule['min_T']} for S ≤ {rule['max_S']}." if rule else
                "the banded recursion at every size (the scan never won)."), END]
    (out / "gpu_column.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    if args.write:
        results = ROOT / "docs" / "results.md"
        doc = results.read_text()
        block = "\n".join(text)
        doc = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, doc,
                     flags=re.S) if BEGIN in doc else doc.rstrip() + "\n\n" + block + "\n"
        results.write_text(doc)
        rule_file = ROOT / "ppl_attention" / "structures" / "gpu_rule.json"
        measured = rule or {"min_T": 10**9, "max_S": 0}
        rule_file.write_text(json.dumps({**measured, "measured_on": f"{name}, {commit}"},
                                        indent=1) + "\n")
        print(f"wrote {results} and {rule_file}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
