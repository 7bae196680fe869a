"""Does attention sideline the global latent? AttentionSeqVAE on CMUdict spellings, one row per
configuration, mean ± sd over seeds: ELBO, IWAE NLL (K=100), KL, active units, I(x; z) and the
z-ablation gap, all per word in nats, on the first ``--n-eval`` test words.

    python benchmarks/seq_vae.py --seeds 3 --steps 1500 --jobs 2 --out runs/seq-vae-table

Finished run directories are reused (delete one to retrain it).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _jobs import cell, run_jobs

CONFIGS = {
    "no attention": ["--attention", "none"],
    "attention": [],
    "attention + free bits": ["--free-bits", "0.25"],
    "attention + KL annealing + word dropout": ["--kl-anneal", "sigmoid", "--word-dropout",
                                                "0.3"],
    "Transformer encoder + attention": ["--encoder", "transformer"],
    "attention over the encoder's H (leaky)": ["--memory", "encoder"],
}
KEYS = ("elbo", "iwae_nll", "kl", "active_units", "mutual_info", "z_ablation_gap")


def _job(job):
    """One run through the package's own training path (``train --model seq-vae``)."""
    name, seed, args = job
    import torch

    torch.set_num_threads(1)
    from ppl_attention.cli import build_parser
    from ppl_attention.cli.options import experiment_from_args
    from ppl_attention.pyro.inference import Run
    from ppl_attention.tools.experiment import train_one

    out = Path(args.out) / f"{name.replace(' ', '_').replace('+', 'and')}-seed{seed}"
    if (out / "COMPLETE").exists():
        return name, seed, Run.load(out).extra["test_report"]
    argv = ["train", "--model", "seq-vae", "--task", "g2p", "--side", "source",
            "--n-train", str(args.n_train), "--steps", str(args.steps), "--hidden",
            str(args.hidden), "--latent", str(args.latent), "--lr", str(args.lr),
            "--anneal-steps", str(args.steps // 2), "--valid-every", str(args.steps),
            "--n-eval", str(args.n_eval), "--seed", str(seed), "--out", str(out),
            *CONFIGS[name]]
    t = time.perf_counter()
    exp = experiment_from_args(build_parser(argv).parse_args(argv))
    _, report = train_one(exp, "soft", seed, out, progress=False)
    report["seconds"] = time.perf_counter() - t
    return name, seed, report


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--latent", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--n-train", type=int, default=20000)
    ap.add_argument("--n-eval", type=int, default=1000)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated names")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default="runs/seq-vae-table")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.configs.split(",")]
    for n in names:
        if n not in CONFIGS:
            raise SystemExit(f"unknown configuration {n!r}; valid: {', '.join(CONFIGS)}")
    jobs = [(n, s, args) for n in names for s in range(args.seeds)]
    t0 = time.perf_counter()
    results = run_jobs(_job, jobs, args.jobs)
    by = {}
    for name, seed, r in results:
        by.setdefault(name, []).append(r)
        print(json.dumps({"config": name, "seed": seed, **{k: r[k] for k in KEYS}}), flush=True)

    print(f"\n{len(jobs)} runs in {time.perf_counter() - t0:.0f} s; per word, nats; "
          f"{args.n_eval} test words; latent {args.latent}")
    print("| configuration | ELBO | IWAE NLL | KL | active units | I(x; z) "
          "| z-ablation gap / token |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        rs = by[name]
        print(f"| {name} | " + " | ".join(cell([r[k] for r in rs]) for k in KEYS) + " |")


if __name__ == "__main__":
    main()
