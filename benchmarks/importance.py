"""The importance-corrected posterior, measured: (1) how fast its link marginals reach the exact
ones as K grows, and (2) whether it repairs the guides the calibration table finds wrong.

(1) ``--part convergence``: a ``vae-sample`` run of the built-in ``seq2seq`` on ``reorder``
(``--steps`` of training), its guide as trained and made wider (logits ×0.5) or narrower
(×2); for K in ``--ks``, the mean over test pairs of Σ_j |p̂(z_t = j) − p(z_t = j | x, y)| over
real tokens (twice the total-variation distance), averaged over ``--reps`` repeats — with the
1/√K line through the first point; ``convergence.png`` and a table.

(2) ``--part calibration``: ``ppl-attention compare --task reorder --methods … --steps 300``
(the runs of docs/results.md's calibration table), then ``ppl-attention calibrate`` of each run
with its guide as trained and with ``--posterior importance --importance-samples K``: coverage
at 50/80/90/95 %, the uniformity tests, and the share of simulated targets whose k̂ exceeds
0.7; a row whose k̂ stays ≤ 0.7 on at least 90 % of targets is expected to be calibrated.

    python benchmarks/importance.py --part convergence --out runs/importance
    python benchmarks/importance.py --part calibration --out runs/importance-cal
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

FAILING = "dirichlet,vae-gumbel,vae-rws,bam-weibull,bam-lognormal"


def convergence(args) -> int:
    import numpy as np
    import torch

    import ppl_attention as pa
    from ppl_attention.common.importance_weights import correct
    from ppl_attention.data import Vocab, make_batches, make_task
    from ppl_attention.pyro.inference.calibration import Distort
    from ppl_attention.pyro.inference.calibration import distortion as planted
    from ppl_attention.pyro.inference.importance import importance_arrays
    from ppl_attention.pyro.models.base import exact_posterior

    task = make_task("reorder", n_train=args.n_train, n_eval=200)
    sv, tv = (Vocab.build(p[k] for p in task.train.pairs) for k in (0, 1))
    torch.manual_seed(0)
    m = pa.inference.get_method("vae-sample")
    model = pa.models.Seq2SeqAlignment(len(sv), len(tv), hidden=32, family=m.family())
    train = make_batches(task.train.pairs, sv, tv, 64, shuffle=True)
    run = pa.inference.fit(model, train, "vae-sample", steps=args.steps, lr=0.01, src_vocab=sv,
                           tgt_vocab=tv, progress=False)
    (b,) = make_batches(task.test.pairs[:args.pairs], sv, tv, args.pairs)
    exact = exact_posterior(run.model, b).detach().numpy()
    mask = b.tgt_mask.numpy()
    guides = {"as trained": None, "wider (logits ×0.5)": planted("logits", 0.5),
              "narrower (logits ×2)": planted("logits", 2.0)}
    rng = np.random.default_rng(0)
    table = {}
    for name, distort in guides.items():
        wrap = None if distort is None else (lambda g, d=distort: Distort("align", d)(g))
        for k in args.ks:
            errs, khats = [], []
            for r in range(args.reps):
                arr = importance_arrays(run, b, k, seed=1000 * k + r, wrap_guide=wrap)
                c = correct(arr["log_w"], arr["values"], rng)
                errs.append(float(np.abs(c["marginals"] - exact)[mask].sum(-1).mean()))
                khats.append(c["khat"])
            kh = np.concatenate(khats)
            kh = kh[np.isfinite(kh)]
            table[(name, k)] = (float(np.mean(errs)), float(np.mean(kh > 0.7)) if kh.size
                                else None)
            print(f"{name} K={k}: {table[(name, k)]}", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    colors = plt.get_cmap("tab10").colors
    for i, name in enumerate(guides):
        e = [table[(name, k)][0] for k in args.ks]
        ax.loglog(args.ks, e, "o-", color=colors[i], label=name)
    e0 = table[(list(guides)[0], args.ks[0])][0]
    ks = np.asarray(args.ks, dtype=float)
    ax.loglog(ks, e0 * np.sqrt(ks[0] / ks), "k--", lw=0.8, label="1/√K")
    ax.set(xlabel="K (draws of the guide per sentence)",
           ylabel="Σ_j |corrected − exact| per token")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "convergence.png", dpi=110)
    print(f"\nvae-sample on reorder ({args.steps} steps, hidden 32), {args.pairs} test pairs, "
          f"{args.reps} repeats; error = Σ_j |p̂ − p| per real token; share of pairs with "
          f"k̂ > 0.7 (where estimated)\n")
    print("| guide | " + " | ".join(f"K = {k}" for k in args.ks) + " |")
    print("|---|" + "---|" * len(args.ks))
    for name in guides:
        cells = []
        for k in args.ks:
            e, s = table[(name, k)]
            cells.append(f"{e:.3f}" + ("" if s is None else f" (k̂ > 0.7: {s:.2f})"))
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


def calibration(args) -> int:
    out = Path(args.out)
    cmd = ["ppl-attention", "compare", "--task", "reorder", "--methods", args.methods,
           "--steps", str(args.steps), "--jobs", str(args.jobs), "--out", str(out)]
    done = all((out / "runs" / f"{m}-seed0" / "COMPLETE").exists()
               for m in args.methods.split(","))
    if done:  # the runs of an earlier call are there: calibrate them again
        print(f"reusing the trained runs under {out / 'runs'}", file=sys.stderr)
    else:
        print(" ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = []
    for method in args.methods.split(","):
        run = out / "runs" / f"{method}-seed0"
        for label, extra in (("q", []), ("q corrected", ["--posterior", "importance",
                                                         "--importance-samples",
                                                         str(args.samples)])):
            dest = run / ("cal-importance" if extra else "cal-guide")
            c = ["ppl-attention", "calibrate", str(run), "--out", str(dest),
                 "--num-sims", str(args.num_sims), *extra]
            print(" ".join(c), file=sys.stderr)
            subprocess.run(c, check=True, stdout=subprocess.DEVNULL)
            res = json.loads((dest / "calibration.json").read_text())
            for row in res["rows"]:
                if row["posterior"] == "exact":
                    continue
                rows.append((method, label, row))
    print(f"\nCalibration on reorder ({args.steps} steps), {args.num_sims} simulated targets, 99 "
          f"draws; importance: K = {args.samples} draws of the guide per target\n")
    print("| method | posterior | min p | calibrated | coverage 50 / 80 / 90 / 95 % | "
          "share k̂ > 0.7 | k̂ ≤ 0.7 on ≥ 90 % |")
    print("|---|---|---|---|---|---|---|")
    for method, label, row in rows:
        cov = " / ".join(f"{row['coverage'][k]:.3f}" for k in ("0.50", "0.80", "0.90", "0.95"))
        share = row.get("khat_share")
        ok = "—" if share is None else ("yes" if share <= 0.1 else "no")
        print(f"| {method} | {label} | {row['p_min']:.2g} | "
              f"{'yes' if row['passes'] else '**no**'} | {cov} | "
              f"{'—' if share is None else f'{share:.3f}'} | {ok} |")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("convergence", "calibration"), default="convergence")
    p.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")],
                   default=[10, 30, 100, 300, 1000])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--pairs", type=int, default=32)
    p.add_argument("--n-train", type=int, default=5000)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--methods", default=FAILING)
    p.add_argument("--samples", type=int, default=100)
    p.add_argument("--num-sims", type=int, default=200)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", default="runs/importance")
    args = p.parse_args(argv)
    return convergence(args) if args.part == "convergence" else calibration(args)


if __name__ == "__main__":
    sys.exit(main())
