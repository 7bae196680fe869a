"""What one Gibbs sweep of ``wordalign``'s chains costs at corpus scale: wall and CPU seconds
per sweep of the HMM's and the fertility aligner's chains on the generated corpus of
``benchmarks/aligners.py``, per padded cell (a target word × a source position or NULL in the
shape classes the sweep runs over), and how far a second core helps.

Each row is its own process (``--one``), its chains started as ``wordalign`` starts them (IBM1's
VB sweeps, then for the fertility aligner an HMM chain's sweeps), its sweep program compiled (or
loaded from this script's persistent cache) before the clock starts:

- ``1 chain, 1 core``: the process pinned to one core (``os.sched_setaffinity`` before JAX
  starts its threads) — the work a sweep needs;
- ``1 chain``: both cores — what XLA's threads make of the second;
- ``2 chains side by side``: two chains in two threads, as ``wordalign``'s ``--parallel-chains
  2`` runs them — per sweep, the wall time of the pair over two.

``CPU s / sweep`` is user plus system time over the timed sweeps (every thread) over the
sweeps run; ``ns / padded cell`` is that over the padded cells. Set beside the ``CPU seconds``
column of ``benchmarks/aligners.py`` (eflomal's whole run), it says how much of a run the
chains alone take.

    python benchmarks/aligner_sweeps.py --size 100000 --sweeps 4 --out runs/aligner_sweeps
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from _jobs import answer_one, cpu_seconds, spawn_one

ROWS = ("1 chain, 1 core", "1 chain", "2 chains side by side")


def one(job: dict) -> dict:
    if job["row"] == "1 chain, 1 core":  # before JAX starts its thread pools
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    os.environ["PPL_ATTENTION_JAX_CACHE"] = job["cache"]
    import threading

    import jax

    from ppl_attention.data.indexed import index_pairs
    from ppl_attention.data.parallel import read_parallel
    from ppl_attention.numpyro import aligners as al
    from ppl_attention.numpyro.inference import word_alignment as wa
    from ppl_attention.numpyro.inference.cache import enable_compilation_cache

    enable_compilation_cache()
    corpus, _, _ = index_pairs(read_parallel(job["corpus"]))
    sizes, data = wa.device_corpus(corpus)
    track = wa._track_indices(corpus, 1000, 0)
    spec = al.aligner(job["model"])
    start = wa.ibm1_start(spec, sizes, data, 5, progress=False)
    if spec.kind.fertility:
        start = wa.hmm_start(spec, sizes, data, track, 4, start, 0, progress=False)
    kernel = wa.ConjugateGibbs(spec, sizes)
    args = (data, track, start)
    warmup = jax.numpy.asarray(job["sweeps"], jax.numpy.int32)  # every timed sweep a warm-up
    step = wa.compile_ahead(jax.jit(lambda s, a, w: kernel.sample(s, a, {"num_warmup": w})),
                            (jax.eval_shape(lambda k: kernel.init(k, job["sweeps"], None,
                                                                  args, {}), wa.chain_key(0)),),
                            args, warmup)
    n_chains = 2 if job["row"] == "2 chains side by side" else 1
    states = [kernel.init(k, job["sweeps"], None, args, {})
              for k in jax.random.split(wa.chain_key(0), n_chains)]
    states = [jax.block_until_ready(step(s, args, warmup)) for s in states]  # one untimed

    def run(c):
        for _ in range(job["sweeps"]):
            states[c] = step(states[c], args, warmup)
        jax.block_until_ready(states[c])

    t0, c0 = time.perf_counter(), cpu_seconds()
    threads = [threading.Thread(target=run, args=(c,)) for c in range(n_chains)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    sweeps = job["sweeps"] * n_chains
    padded = sum(c.src.size * c.tgt.shape[-1] for c in corpus.classes)
    real = int(((corpus.src_len + 1) * corpus.tgt_len).sum())
    return {"model": job["model"], "row": job["row"], "sweeps": sweeps,
            "wall_per_sweep": wall / sweeps, "cpu_per_sweep": cpu / sweeps,
            "padded_cells": padded, "real_cells": real,
            "ns_per_padded_cell": 1e9 * cpu / sweeps / padded,
            "cores": len(os.sched_getaffinity(0))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=100000, help="corpus pairs")
    ap.add_argument("--sweeps", type=int, default=4, help="timed sweeps per chain")
    ap.add_argument("--models", default="hmm,fertility")
    ap.add_argument("--out", default="runs/aligner_sweeps")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if answer_one(args, one):
        return
    from aligners import make_corpus
    from tqdm import tqdm

    if args.sweeps < 1:
        raise SystemExit(f"--sweeps must be at least 1, got {args.sweeps}")
    out = Path(args.out)
    corpus, _ = make_corpus(args.size, out / f"corpus-{args.size}")
    cache = str((out / "jax-cache").resolve())
    jobs = [{"model": m, "row": r, "sweeps": args.sweeps, "corpus": str(corpus),
             "cache": cache} for m in args.models.split(",") for r in ROWS]
    rows = []
    for job in tqdm(jobs, desc="sweeps", unit="run"):
        rows.append(spawn_one(__file__, job))
        tqdm.write(json.dumps(rows[-1]))
        (out / "results.json").write_text(json.dumps(rows, indent=1))
    print("| model | chains | cores | wall s / sweep | CPU s / sweep | padded cells | "
          "real cells | CPU ns / padded cell |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['row']} | {r['cores']} | {r['wall_per_sweep']:.3f} | "
              f"{r['cpu_per_sweep']:.3f} | {r['padded_cells'] / 1e6:.1f}M | "
              f"{r['real_cells'] / 1e6:.1f}M | {r['ns_per_padded_cell']:.1f} |")


if __name__ == "__main__":
    main()
