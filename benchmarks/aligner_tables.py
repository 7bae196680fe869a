"""Train once, align new text: ``wordalign --save`` on a training corpus, then ``--load`` on new
sentences (not in the training text), against aligning those sentences inside the training
corpus — AER of each direction and grow-diag-final-and on the new sentences' gold, and wall time.

The corpus is the ``wordalign`` task's (``benchmarks/aligners.py``'s generator): ``--train``
training pairs and ``--new`` test pairs with gold links. Rows, each its own process, one after
another, all with one fresh JAX compilation cache (so "cold" is a first run, "warm" a second):

- ``inside``: the new pairs first, then the training pairs, aligned together (the reference;
  with ``--scores``, its reliability table is printed too);
- ``train --save``: the training pairs alone, tables saved (the training run's time);
- ``--load`` (cold cache), ``--load`` (warm cache): the new pairs with the saved tables, the
  method's defaults; ``--load, short``: 1 chain × (5 + 10) sweeps (the chains start at the
  tables' means).

    python benchmarks/aligner_tables.py --train 10000 --new 1000 --out runs/aligner_tables
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import time
from pathlib import Path

from _jobs import answer_one, spawn_one


def make_corpora(n_train: int, n_new: int, folder: Path) -> dict:
    from ppl_attention.data.parallel import format_gold, write_parallel
    from ppl_attention.data.wordalign_task import wordalign_task

    folder.mkdir(parents=True, exist_ok=True)
    paths = {k: folder / f"{k}.txt" for k in ("train", "new", "inside", "gold")}
    task = wordalign_task(n_train=n_train, n_eval=n_new, seed=0)
    write_parallel(paths["train"], task.train.pairs)
    write_parallel(paths["new"], task.test.pairs)
    write_parallel(paths["inside"], task.test.pairs + task.train.pairs)
    paths["gold"].write_text("".join(format_gold(s, p) + "\n" for s, p in
                                     zip(task.test.gold, task.test.possible)), encoding="utf-8")
    return {k: str(v) for k, v in paths.items()}


def one(job: dict) -> dict:
    from ppl_attention.cli import main

    os.environ["PPL_ATTENTION_JAX_CACHE"] = job["cache"]
    work = Path(job["work"])
    work.mkdir(parents=True, exist_ok=True)
    argv = ["wordalign", "-i", job["input"], "--symmetrize", "grow-diag-final-and",
            "-o", str(work / "sym"), "--out", str(work / "run")] + job["extra"]
    t0 = time.perf_counter()
    if main(argv) != 0:
        raise SystemExit(f"wordalign failed: {argv}")
    seconds = time.perf_counter() - t0
    report = json.loads((work / "run" / "report.json").read_text())
    out = {"row": job["row"], "seconds": seconds,
           "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    for k, v in report.get("scores", {}).items():
        out[f"{k}_aer"] = v["aer"]
    for k in ("reliability", "forward_links_mixed", "forward_links_share_marginal_tv_over",
              "forward_links_marginal_tv_mean", "options"):
        if k in report:
            out[k] = report[k]
    return out


def _spawn(job: dict) -> dict:
    return spawn_one(__file__, job)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=10_000)
    ap.add_argument("--new", type=int, default=1000)
    ap.add_argument("--out", default="runs/aligner_tables")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if answer_one(args, one):
        return
    from tqdm import tqdm

    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    c = make_corpora(args.train, args.new, out / "corpus")
    gold = ["--gold", c["gold"]]
    tables = str(out / "tables")
    short = ["--chains", "1", "--warmup", "5", "--samples", "10"]
    rows = [("inside", c["inside"], gold + ["--scores", str(out / "inside.scores")]),
            ("train --save", c["train"], ["--save", tables]),
            ("--load (cold cache)", c["new"], ["--load", tables] + gold),
            ("--load (warm cache)", c["new"], ["--load", tables] + gold),
            ("--load, short (warm)", c["new"], ["--load", tables] + short + gold)]
    results = []
    for k, (row, corpus, extra) in enumerate(tqdm(rows, desc="runs", unit="run")):
        job = {"row": row, "input": corpus, "extra": extra, "cache": str(out / "jax-cache"),
               "work": str(out / f"run{k}")}
        results.append(_spawn(job))
        tqdm.write(json.dumps(results[-1]))
        (out / "results.json").write_text(json.dumps(results, indent=1))
    lines = ["| run | pairs | AER fwd | AER rev | AER gdfa | seconds | peak MiB |",
             "|---|---|---|---|---|---|---|"]
    for (row, corpus, _), r in zip(rows, results):
        n = sum(1 for _ in open(corpus, encoding="utf-8"))
        aer = [f"{r[k]:.4f}" if k in r else "" for k in
               ("forward_aer", "reverse_aer", "grow-diag-final-and_aer")]
        lines.append(f"| {row} | {n:,} | {' | '.join(aer)} | {r['seconds']:.1f} | "
                     f"{r['peak_mib']:.0f} |")
    print("\n".join(lines))
    rel = results[0].get("reliability") or []
    print("\n| posterior bin (inside, forward) | links | mean posterior | gold share |\n"
          "|---|---|---|---|")
    for r in rel:
        if r["links"]:
            print(f"| [{r['low']:.1f}, {r['high']:.1f}) | {r['links']} | "
                  f"{r['mean_posterior']:.3f} | {r['gold_share']:.3f} |")


if __name__ == "__main__":
    main()
