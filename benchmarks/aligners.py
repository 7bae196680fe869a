"""Word alignment at corpus scale: eflomal against the aligners of ``ppl-attention wordalign``
on the same synthetic corpora (``--task wordalign``: Zipfian vocabularies, ambiguous
translations, NULL-aligned and one-to-many words, local and long reorderings), at each of
``--sizes`` sentence pairs.

A corpus of N pairs is the task's 500 test pairs (whose gold links score every system) first,
then N − 500 training pairs, as aligners are evaluated (unsupervised, the test sentences inside
the corpus). Each system aligns both directions and the two are symmetrized by
grow-diag-final-and (``ppl_attention.common.symmetrize``, the same code for every system); AER
(Och & Ney 2003, sure and possible links), precision and recall of forward, reverse and
symmetrized links.

- eflomal ``-m 1`` (IBM1), ``-m 2`` (IBM1 → HMM), ``-m 3`` (IBM1 → HMM → fertility), its
  default sampling length — an optional peer (``pip install eflomal``; ``--eflomal`` names
  its ``eflomal-align``), skipped with a message when absent;
- ours: ``ibm1``, ``ibm2``, ``hmm`` × ``gibbs`` (``--chains`` chains, ``--warmup`` +
  ``--samples`` sweeps, per size: 4 chains at 10k for R-hat, one at 100k; IBM2 / HMM started
  from 5 sweeps of IBM1's VB) and ``vb`` (at most ``--iterations`` sweeps); ``fertility`` ×
  ``gibbs`` (the same sweeps, started from an HMM chain of a quarter of them, as eflomal's
  ``-m 3`` starts from its HMM) and × ``vb`` (mean-field sweeps, started from a quarter as
  many of the HMM's VB).

With ``--reliability`` each of ours also writes its forward links' posteriors (``--scores``,
inside its timed run — every pair's link posteriors built and written, so its seconds and
memory include them): per size and system a reliability table — per posterior bin the links,
their mean posterior and the share that is gold — and ``reliability.png`` (gold share against
mean posterior, the diagonal drawn).

Every run is its own process (``--one``): its wall time from start to written links (JAX's
compilation included — the persistent cache is switched off), its CPU seconds (user plus
system, over the same span: every thread's, eflomal's process's for eflomal — the work done,
which the wall time divides among the cores) and its peak resident memory (its own, and its
children's for eflomal) are its own. With ``--warm`` each of ours runs twice,
one process after the other, on a persistent compilation cache of its own: the first run
fills it (``cache`` cold), the second reads it (warm) — a user's first and second run. One
run of the script measures every row, so the ratios are of one machine and one moment.

    python benchmarks/aligners.py --sizes 10000,100000 --out runs/aligners
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _jobs import answer_one, cpu_seconds, spawn_one

TEST_PAIRS = 500
OURS = [(m, k) for m in ("ibm1", "ibm2", "hmm", "fertility") for k in ("gibbs", "vb")]


def make_corpus(n: int, folder: Path) -> tuple[Path, Path]:
    """corpus.txt (the test pairs first) and gold.txt (their links) of ``n`` pairs."""
    from ppl_attention.data.parallel import format_gold, write_parallel
    from ppl_attention.data.wordalign_task import wordalign_task

    folder.mkdir(parents=True, exist_ok=True)
    corpus, gold = folder / "corpus.txt", folder / "gold.txt"
    if not corpus.exists():
        task = wordalign_task(n_train=n - TEST_PAIRS, n_eval=TEST_PAIRS, seed=0)
        write_parallel(corpus, task.test.pairs + task.train.pairs)
        gold.write_text("".join(format_gold(s, p) + "\n" for s, p in
                                zip(task.test.gold, task.test.possible)), encoding="utf-8")
    return corpus, gold


def _scores(forward, reverse, corpus, gold) -> dict:
    from ppl_attention.common.metrics import alignment_scores
    from ppl_attention.common.symmetrize import symmetrize_corpus
    from ppl_attention.data.parallel import read_gold, read_parallel

    pairs = read_parallel(corpus)
    g = read_gold(gold, pairs, prefix=True)
    n = len(g[0])
    out = {"forward": alignment_scores(forward[:n], *g),
           "reverse": alignment_scores(reverse[:n], *g),
           "gdfa": alignment_scores(symmetrize_corpus(forward[:n], reverse[:n],
                                                      "grow-diag-final-and"), *g)}
    return {f"{k}_{m}": v[m] for k, v in out.items() for m in ("aer", "precision", "recall")}


def run_eflomal(exe: str, m: int, corpus: Path, gold: Path, work: Path) -> dict:
    from ppl_attention.data.pharaoh import read_pharaoh

    fwd, rev = work / "fwd", work / "rev"
    t0, c0 = time.perf_counter(), cpu_seconds(resource.RUSAGE_CHILDREN)
    subprocess.run([exe, "-i", str(corpus), "-m", str(m), "-f", str(fwd), "-r", str(rev),
                    "--overwrite"], check=True, capture_output=True)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "cpu_seconds": cpu_seconds(resource.RUSAGE_CHILDREN) - c0,
            **_scores(read_pharaoh(fwd), read_pharaoh(rev), corpus, gold)}


def run_ours(model: str, method: str, corpus: Path, gold: Path, work: Path, opts: dict,
             cache: str = "off", reliability: bool = False) -> dict:
    from ppl_attention.cli import main
    from ppl_attention.data.aligner_tables import ALIGNER_KINDS
    from ppl_attention.data.pharaoh import read_pharaoh

    os.environ["PPL_ATTENTION_JAX_CACHE"] = cache
    argv = ["wordalign", "-i", str(corpus), "--model", model, "--method", method,
            "-f", str(work / "fwd"), "-r", str(work / "rev"), "--out", str(work / "run")]
    if reliability:
        argv += ["--scores", str(work / "scores"), "--gold", str(gold)]
    if method == "gibbs":
        argv += ["--chains", str(opts["chains"]), "--warmup", str(opts["warmup"]),
                 "--samples", str(opts["samples"])]
        if ALIGNER_KINDS[model].buckets != "none":
            argv += ["--init-sweeps", "5"]
    else:
        argv += ["--iterations", str(opts["iterations"])]
    t0, c0 = time.perf_counter(), cpu_seconds(resource.RUSAGE_SELF)
    if main(argv) != 0:
        raise SystemExit(f"wordalign failed: {argv}")
    seconds = time.perf_counter() - t0
    cpu = cpu_seconds(resource.RUSAGE_SELF) - c0
    report = json.loads((work / "run" / "report.json").read_text())
    out = {"seconds": seconds, "cpu_seconds": cpu, **_scores(read_pharaoh(work / "fwd"),
                                         read_pharaoh(work / "rev"), corpus, gold)}
    for k in ("forward_links_rhat_max", "forward_links_rhat_median",
              "forward_links_share_rhat_ok", "forward_links_ess_bulk_median",
              "forward_links_ess_bulk_min"):
        if k in report:
            out[k.replace("forward_links_", "")] = report[k]
    if reliability:  # the forward links' posteriors against gold
        out["reliability"] = report["reliability"]
    return out


def one(job: dict) -> dict:
    work = Path(job["work"])
    work.mkdir(parents=True, exist_ok=True)
    corpus, gold = Path(job["corpus"]), Path(job["gold"])
    if job["system"] == "eflomal":
        res = run_eflomal(job["exe"], job["m"], corpus, gold, work)
        peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                   resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    else:
        res = run_ours(job["model"], job["method"], corpus, gold, work, job["opts"],
                       job.get("cache_dir", "off"), job.get("reliability", False))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {**{k: v for k, v in job.items()
               if k in ("system", "m", "model", "method", "n", "sweeps", "cache")},
            **res, "peak_mib": peak / 1024}


def _spawn(job: dict) -> dict:
    return spawn_one(__file__, job)


def _table(rows: list[dict]) -> str:
    head = ("| pairs | system | model | method | AER fwd | AER rev | AER gdfa | P gdfa | "
            "R gdfa | seconds | CPU seconds | cache | peak MiB | sweeps | link R-hat ≤ 1.01 | "
            "median ESS |")
    lines = [head, "|" + "---|" * 16]
    for r in rows:
        model = {1: "IBM1", 2: "IBM1→HMM", 3: "IBM1→HMM→fertility"}[r["m"]] \
            if r["system"] == "eflomal" else r["model"]
        method = f"-m {r['m']}" if r["system"] == "eflomal" else r["method"]
        share = r.get("share_rhat_ok")
        ess = r.get("ess_bulk_median")
        lines.append(
            f"| {r['n']:,} | {r['system']} | {model} | {method} | {r['forward_aer']:.4f} | "
            f"{r['reverse_aer']:.4f} | {r['gdfa_aer']:.4f} | {r['gdfa_precision']:.3f} | "
            f"{r['gdfa_recall']:.3f} | {r['seconds']:.1f} | {r['cpu_seconds']:.1f} | "
            f"{r.get('cache', '')} | "
            f"{r['peak_mib']:.0f} | "
            f"{r.get('sweeps', '')} | "
            f"{'' if share is None else f'{100 * share:.1f} %'} | "
            f"{'' if ess is None else ess if isinstance(ess, str) else f'{ess:.0f}'} |")
    return "\n".join(lines)


def _reliability(rows: list[dict], out: Path) -> str:
    """Per run of ours (the first of a cold/warm pair), the forward links' reliability table
    (``wordalign --scores`` against the gold: per posterior bin the links, their mean
    posterior and the share that is gold) as markdown, and ``reliability.png``: gold share
    against mean posterior per bin, the diagonal of calibrated posteriors drawn, each bin's
    marker sized by its links."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ours = [r for r in rows if r["system"] == "ours" and r.get("cache") != "warm"
            and r.get("reliability")]
    if not ours:
        return ""
    text = []
    fig, ax = plt.subplots(figsize=(5.2, 5))
    ax.plot([0, 1], [0, 1], color="black", lw=1, ls="--", label="calibrated")
    colours = plt.get_cmap("tab10").colors
    for c, r in enumerate(ours):
        name = f"{r['model']} {r['method']}, {r['n']:,} pairs"
        bins = [b for b in r["reliability"] if b["links"]]
        text += [f"\n{name} (forward links):\n", "| posterior bin | links | mean posterior | "
                 "gold share |", "|---|---|---|---|"]
        text += [f"| [{b['low']:.1f}, {b['high']:.1f}) | {b['links']} | "
                 f"{b['mean_posterior']:.3f} | {b['gold_share']:.3f} |" for b in bins]
        ax.scatter([b["mean_posterior"] for b in bins], [b["gold_share"] for b in bins],
                   s=[12 + 18 * math.log10(b["links"]) ** 2 for b in bins],
                   color=colours[c % len(colours)], alpha=0.8, label=name)
        ax.plot([b["mean_posterior"] for b in bins], [b["gold_share"] for b in bins],
                color=colours[c % len(colours)], lw=1, alpha=0.6)
    ax.set(xlim=(0, 1), ylim=(0, 1.02), xlabel="mean posterior of the bin's links",
           ylabel="share of the bin's links that is gold",
           title="Forward link posteriors against gold (marker: links)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "reliability.png", dpi=110)
    plt.close(fig)
    return "\n".join(text) + f"\n\n(figure: {out / 'reliability.png'})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--out", default="runs/aligners")
    ap.add_argument("--eflomal", default=shutil.which("eflomal-align"),
                    help="eflomal-align (default: the one on PATH)")
    ap.add_argument("--ours", default=",".join(f"{m}:{k}" for m, k in OURS),
                    help="model:method pairs of ours to run")
    ap.add_argument("--chains", default="4,1", help="gibbs chains, per size (one value: all)")
    ap.add_argument("--warmup", default="25,10", help="gibbs warm-up (burn-in) sweeps, per size")
    ap.add_argument("--samples", default="25,10", help="gibbs kept sweeps, per size")
    ap.add_argument("--iterations", default="30", help="vb sweeps, per size")
    ap.add_argument("--warm", action="store_true", help="run each of ours twice on its own "
                    "persistent compilation cache: first (cold, filling it), then warm")
    ap.add_argument("--reliability", action="store_true", help="ours write their forward "
                    "link posteriors (--scores, inside the timed run): a reliability table "
                    "per row and reliability.png")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if answer_one(args, one):
        return
    from tqdm import tqdm

    out = Path(args.out)
    sizes = [int(x) for x in args.sizes.split(",")]

    def per_size(text, name):
        values = [int(x) for x in text.split(",")]
        if len(values) not in (1, len(sizes)):
            raise SystemExit(f"--{name}: one value or one per size ({len(sizes)})")
        return values * len(sizes) if len(values) == 1 else values

    columns = {k: per_size(getattr(args, k), k.replace("_", "-"))
               for k in ("chains", "warmup", "samples", "iterations")}
    ours = [tuple(x.split(":")) for x in args.ours.split(",") if x]
    if not args.eflomal:
        print("eflomal-align not found (pip install eflomal, or --eflomal PATH): its rows are "
              "skipped", file=sys.stderr)
    jobs = []
    for at, n in enumerate(sizes):
        opts = {k: v[at] for k, v in columns.items()}
        corpus, gold = make_corpus(n, out / f"corpus-{n}")
        base = {"n": n, "corpus": str(corpus), "gold": str(gold)}
        if args.eflomal:
            jobs += [{**base, "system": "eflomal", "m": m, "exe": args.eflomal,
                      "work": str(out / f"{n}-eflomal-m{m}")} for m in (1, 2, 3)]
        for m, k in ours:
            job = {**base, "system": "ours", "model": m, "method": k, "opts": opts,
                   "reliability": args.reliability,
                   "sweeps": (f"{opts['chains']} × ({opts['warmup']} + {opts['samples']})"
                              if k == "gibbs" else f"≤ {opts['iterations']}"),
                   "work": str(out / f"{n}-{m}-{k}")}
            if not args.warm:
                jobs.append({**job, "cache": "off"})
                continue
            cache = str((out / f"{n}-{m}-{k}-jax-cache").resolve())
            shutil.rmtree(cache, ignore_errors=True)  # the first run fills it
            jobs += [{**job, "cache": "cold", "cache_dir": cache},
                     {**job, "cache": "warm", "cache_dir": cache,
                      "work": job["work"] + "-warm"}]
    rows = []
    for job in tqdm(jobs, desc="aligners", unit="run"):
        if Path(job["work"]).exists():
            shutil.rmtree(job["work"])
        rows.append(_spawn(job))
        tqdm.write(json.dumps(rows[-1]))
        (out / "results.json").write_text(json.dumps(rows, indent=1))
    print(_table(rows))
    print(_reliability(rows, out))


if __name__ == "__main__":
    main()
