"""Calibration's power and cost (docs/results.md, "Posterior calibration"):

    python benchmarks/calibration.py [--seeds 5] [--steps 300]

Trains the README tutorial's model (Pyro) on ``reorder`` by ``vae-enum`` and by ``dirichlet``,
then calibrates each run's guide by simulation at the default N = 200 targets and L = 99 draws,
five seeds of the simulations, as trained and with a planted miscalibration: a categorical q's
logits × 2 (over-confident) and × 0.5 (under-confident), a Dirichlet q's concentration × 3 and
× 1/3. A row is *detected* when the guide's row fails (a uniformity p-value below
0.01 / its number of tests); the exact posterior (vae-enum's model) must pass. Also the wall
time of one calibration (its progress bar on stderr).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "tutorial"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--num-sims", type=int, default=200)
    ap.add_argument("--draws", type=int, default=99)
    args = ap.parse_args(argv)
    from diagonal import DiagonalAlignment

    import ppl_attention as pa
    from ppl_attention.analysis.sbc import calibrate, planted

    task = pa.data.make_task("reorder", n_train=5000)
    sv = pa.data.Vocab.build(s for s, _ in task.train.pairs)
    tv = pa.data.Vocab.build(t for _, t in task.train.pairs)
    train = pa.data.make_batches(task.train.pairs, sv, tv, 64, shuffle=True)
    plants = {"vae-enum": [("as trained", None), ("logits × 2", planted("logits", 2.0)),
                           ("logits × 0.5", planted("logits", 0.5))],
              "dirichlet": [("as trained", None), ("concentration × 3",
                                                   planted("concentration", 3.0)),
                            ("concentration × 1/3", planted("concentration", 1 / 3))]}
    print(f"| method | guide | detected (of {args.seeds} seeds) | min p per seed | "
          f"coverage 90 % | exact posterior passes | seconds |")
    print("|---|---|---|---|---|---|---|")
    for method, cases in plants.items():
        model = DiagonalAlignment(len(sv), len(tv),
                                  family=pa.inference.get_method(method).family())
        run = pa.inference.fit(model, train, method, steps=args.steps, lr=0.05, src_vocab=sv,
                               tgt_vocab=tv, progress=False)
        for name, distort in cases:
            fails, ps, covs, exact_ok, secs = 0, [], [], [], []
            for seed in range(args.seeds):
                t = time.perf_counter()
                res = calibrate(run, task.test.pairs, num_sims=args.num_sims, draws=args.draws,
                                seed=seed, distort=distort, progress=seed == 0)
                secs.append(time.perf_counter() - t)
                q = res["rows"][0]
                fails += not q["passes"]
                ps.append(q["p_min"])
                covs.append(q["coverage"]["0.90"])
                exact_ok += [r["passes"] for r in res["rows"][1:]]
            print(f"| {method} | {name} | {fails} | " + ", ".join(f"{p:.2g}" for p in ps)
                  + f" | {statistics.mean(covs):.3f} | "
                  + (f"{sum(exact_ok)} of {len(exact_ok)}" if exact_ok else "—")
                  + f" | {statistics.median(secs):.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
