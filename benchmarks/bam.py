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

from _jobs import cell, run_jobs

CONFIGS = [("soft", "constant"), ("weibull", "contextual"), ("weibull", "constant"),
           ("lognormal", "contextual"), ("lognormal", "constant")]
KEYS = ("accuracy", "ece", "pavpu", "accuracy_noisy", "ece_noisy", "pavpu_noisy")


def _scores(probs_mean, probs_draws, labels):
    from ppl_attention.analysis.uncertainty import expected_calibration_error, pavpu

    acc = float((probs_mean[0].argmax(-1) == labels).float().mean())
    return acc, expected_calibration_error(probs_draws, labels), pavpu(probs_draws, labels, 0.05)


def _job(job):
    data, family, prior, seed, args = job
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    out = {}
    if data == "digits":
        from ppl_attention.data.digits import load_digits_patches
        from ppl_attention.models.bam_classifier import (
            BAMClassifier,
            predict_probs,
            train_classifier,
        )

        d = load_digits_patches()
        m = BAMClassifier(d.train_x.shape[1], d.train_x.shape[2], 10, family=family,
                          prior=prior)
        train_classifier(m, d.train_x, d.train_y, steps=args.steps, seed=seed,
                         kl_weight=args.kl_weight)
        for suffix, x in (("", d.test_x), ("_noisy", d.test_x_noisy)):
            r = _scores(predict_probs(m, x), predict_probs(m, x, 20, seed), d.test_y)
            out.update(zip((k + suffix for k in ("accuracy", "ece", "pavpu")), r))
    else:
        from ppl_attention.data.graphs import contextual_sbm
        from ppl_attention.models.gat import BayesianGAT, predict_gat, train_gat

        g = contextual_sbm(seed=0)
        m = BayesianGAT(g.features.shape[1], g.n_classes, family=family, prior=prior)
        train_gat(m, g, steps=args.gat_steps, seed=seed, kl_weight=args.kl_weight)
        te = g.test_mask
        for suffix, gg in (("", g), ("_noisy", g.noisy(1.0))):
            r = _scores(predict_gat(m, gg)[:, te], predict_gat(m, gg, 20, seed)[:, te],
                        g.labels[te])
            out.update(zip((k + suffix for k in ("accuracy", "ece", "pavpu")), r))
    return data, family, prior, seed, out


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
