"""Do Bayesian attention modules improve accuracy *and* uncertainty? Soft vs BAM-Weibull vs
BAM-LogNormal (contextual / constant prior) on sklearn's digits (patch tokens, a 2-layer
Transformer classifier) and on a contextual SBM graph (2-layer GAT): accuracy with BAM's mean
weights, ECE and PAvPU (p < 0.05) of 20 posterior draws, on clean and noisy inputs; mean ± sd
over seeds.

    python benchmarks/bam.py --seeds 3 --jobs 2
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _jobs import cell, run_jobs

CONFIGS = [("soft", "constant"), ("weibull", "contextual"), ("weibull", "constant"),
           ("lognormal", "contextual"), ("lognormal", "constant")]
KEYS = ("accuracy", "ece", "pavpu", "accuracy_noisy", "ece_noisy", "pavpu_noisy")


METHOD = {"soft": "soft", "weibull": "bam-weibull", "lognormal": "bam-lognormal"}


def _job(job):
    """One run through the package's own training path (ppl_attention.tools.experiment):
    the model's defaults (lr, η, ρ) except the steps and η given here."""
    data, family, prior, seed, args = job
    import tempfile

    import torch

    from ppl_attention.tools.experiment import Experiment, train_one

    torch.set_num_threads(1)
    model, task, steps = (("bam-classifier", "digits", args.steps) if data == "digits"
                          else ("gat", "sbm", args.gat_steps))
    exp = Experiment(model=model, model_options={"prior": prior}, task=task,
                     training={"steps": steps, "kl_weight": args.kl_weight}
                     if family != "soft" else {"steps": steps})
    with tempfile.TemporaryDirectory() as tmp:
        _, report = train_one(exp, METHOD[family], seed, Path(tmp) / "run", progress=False)
    return data, family, prior, seed, {k: report[k] for k in KEYS}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1500, help="digits classifier steps")
    ap.add_argument("--gat-steps", type=int, default=300)
    ap.add_argument("--kl-weight", type=float, default=1e-3,
                    help="η on the attention KLs (1 = the ELBO)")
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args(argv)
    jobs = [(d, f, p, s, args) for d in ("digits", "sbm") for f, p in CONFIGS
            for s in range(args.seeds)]
    t0 = time.perf_counter()
    results = run_jobs(_job, jobs, args.jobs)
    by = {}
    for d, f, p, _, r in results:
        by.setdefault((d, f, p), []).append(r)

    print(f"{len(jobs)} runs in {time.perf_counter() - t0:.0f} s; KL weight η = {args.kl_weight}")
    print("| data | attention | prior | " + " | ".join(KEYS) + " |")
    print("|---" * (3 + len(KEYS)) + "|")
    for (d, f, p), rs in by.items():
        prior = "—" if f == "soft" else p
        cells = " | ".join(cell([r[k] for r in rs], 3) for k in KEYS)
        print(f"| {d} | {f} | {prior} | {cells} |")


if __name__ == "__main__":
    main()
