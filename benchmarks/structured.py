"""Exact monotonic alignments at length: loss + gradient ms per step and peak memory of the
Markov family's log p(y | x) at T = S ∈ {8, 32, 128, 512}, batch 16, computed four ways —

  enumerated  today's formulation: T sequential sites under pyro.markov, TraceEnum_ELBO
              (Pyro); NumPyro's funsor log-density of its scan-enumerated model (value only:
              its gradient is NaN on impossible transitions, so NumPyro never trained on it)
  dense       the structure library's linear chain over dense S × S transitions
              (MarkovCategorical.dense_chain: a LinearChainCRF; until 90f2b03 a hand-written
              forward pass of its own)
  banded      MonotonicAlignment's sequential path: T banded steps, O(T·S·W)
  parallel    MonotonicAlignment's parallel path: an associative scan over dense S × S
              log-semiring matrices, O(log T) depth, O(T·S³) work

Each cell runs in its own process (so its peak resident memory is its own), with a time limit;
a cell that does not finish in it, or runs out of memory, says so. Ratios are to the
enumerated formulation in the same run.

    python benchmarks/structured.py --reps 3 --device cpu
    python benchmarks/structured.py --sizes 32,64,128,256 --src 16 --impls banded,parallel
                                   # long chains over few states: where the scan pays off
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

SIZES = (8, 32, 128, 512)
IMPLS = ("enumerated", "dense", "banded", "parallel")


def _inputs_torch(n, batch, device, dtype, S=None):
    import torch

    from ppl_attention.pyro.families import MarkovCategorical

    S = S or n
    g = torch.Generator().manual_seed(0)
    fam = MarkovCategorical(max_jump=3, max_back=0).to(device=device, dtype=dtype)
    scores = torch.randn(batch, n, S, generator=g, dtype=dtype).to(device).requires_grad_(True)
    # emissions are log-probabilities (≤ 0), as a model's log p(y_t | z_t = j) table is
    emis = torch.randn(batch, n, S, generator=g, dtype=dtype).log_softmax(-1).to(device)
    emis.requires_grad_(True)
    mask = torch.ones(batch, S, dtype=torch.bool, device=device)
    tmask = torch.ones(batch, n, dtype=torch.bool, device=device)
    return fam, scores, emis, mask, tmask


def _cell_torch(impl, n, batch, reps, device, S=None):
    import pyro
    import pyro.distributions as dist
    import torch
    from pyro.infer import TraceEnum_ELBO

    dtype = torch.float32
    fam, scores, emis, mask, tmask = _inputs_torch(n, batch, device, dtype, S)

    def loss():
        if impl == "dense":
            return -fam.dense_chain(scores, mask, emis, tmask).log_partition.sum()
        if impl in ("banded", "parallel"):
            method = "sequential" if impl == "banded" else "parallel"
            return -fam.alignment_distribution(scores, mask, emis, tmask, method).log_partition(
            ).sum()
        rows = torch.arange(batch, device=device)

        def model():
            prev = None
            with pyro.plate("batch", batch, dim=-1):
                for t in pyro.markov(range(n)):
                    logp = (fam.start_log_probs(scores[:, t], mask) if prev is None else
                            fam.transition_log_probs(scores[:, t], mask, prev))
                    z = pyro.sample(f"z_{t}", dist.Categorical(logits=logp),
                                    infer={"enumerate": "parallel"})
                    pyro.factor(f"y_{t}", emis[:, t][rows, z])
                    prev = z

        return TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(model, lambda: None)

    def step():
        scores.grad = emis.grad = None
        loss().backward()
        if device != "cpu":
            torch.cuda.synchronize()

    step()  # warm-up
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return 1000 * sorted(times)[len(times) // 2]


def _cell_jax(impl, n, batch, reps, device, S=None):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ppl_attention.numpyro.families import MarkovCategorical

    S = S or n
    rng = np.random.default_rng(0)
    fam = MarkovCategorical(max_jump=3, max_back=0)
    params = {"jump_logits": jnp.zeros(fam.width)}
    scores = jnp.asarray(rng.standard_normal((batch, n, S)), jnp.float32)
    emis = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((batch, n, S)), jnp.float32), -1)
    mask = jnp.ones((batch, S), bool)
    tmask = jnp.ones((batch, n), bool)
    if impl == "enumerated":
        return _enumerated_jax(fam, params, scores, emis, mask, batch, n, reps)

    def loss(sc, em):
        if impl == "dense":
            return -fam.dense_chain(sc, mask, em, tmask, params).log_partition.sum()
        method = "sequential" if impl == "banded" else "parallel"
        return -fam.alignment_distribution(sc, mask, em, tmask, params, method).log_partition(
        ).sum()

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    jax.block_until_ready(step(scores, emis))  # compile
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(step(scores, emis))
        times.append(time.perf_counter() - t)
    return 1000 * sorted(times)[len(times) // 2]


def _enumerated_jax(fam, params, scores, emis, mask, batch, n, reps):
    """NumPyro's scan-enumerated model, its log density by funsor (value only)."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.contrib.control_flow import scan
    from numpyro.contrib.funsor import enum, log_density

    from ppl_attention.core.numerics import LOG_ZERO

    rows = jnp.arange(batch)

    def model():
        def step(prev, xs):
            e_t, em_t = xs
            with numpyro.plate("batch", batch, dim=-1):
                logp = fam.transition_log_probs(e_t, mask, prev, params)
                z = numpyro.sample("z", dist.Categorical(logits=jnp.maximum(logp, LOG_ZERO)),
                                   infer={"enumerate": "parallel"})
                # y_t as an observed Bernoulli with log p(1) = emissions[t, z] (≤ 0): NumPyro
                # 0.22's scan cannot enumerate a factor (its dims stay unnamed)
                lp = em_t[rows, z]
                logit = lp - jnp.log1p(-jnp.exp(jnp.minimum(lp, -1e-6)))
                numpyro.sample("y", dist.Bernoulli(logits=logit), obs=jnp.ones(batch))
            return z, None

        scan(step, jnp.full((batch,), -1), (jnp.swapaxes(scores, 0, 1), jnp.swapaxes(emis, 0, 1)))

    enumerated = enum(model, first_available_dim=-2)  # below the batch plate
    fn = jax.jit(lambda: log_density(enumerated, (), {}, {})[0])
    jax.block_until_ready(fn())
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return 1000 * sorted(times)[len(times) // 2]


def _child(args) -> None:
    """One cell in this process: print {"ms": …, "rss_mb": …} as JSON."""
    if args.device in ("cuda", "gpu") and args.backend == "numpyro":
        os.environ.setdefault("JAX_PLATFORMS", "cuda")
    elif args.backend == "numpyro":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    device = "cuda" if args.device in ("cuda", "gpu") else "cpu"
    fn = _cell_torch if args.backend == "pyro" else _cell_jax
    ms = fn(args.impl, args.n, args.batch, args.reps, device, args.src)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"ms": ms, "rss_mb": rss}))


def _baseline_rss(backend: str) -> float:
    """The peak memory of a process that only imports what a cell imports."""
    code = ("import resource, json; import torch, pyro, ppl_attention.pyro.families"
            + ("; import jax, numpyro, ppl_attention.numpyro.families" if backend == "numpyro"
               else "") + "; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--backends", default="pyro,numpyro")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--src", type=int, help="source length S for every row (default: S = T)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300, help="seconds a cell may take")
    ap.add_argument("--device", choices=["cpu", "cuda", "gpu"], default="cpu")
    ap.add_argument("--max-gb", type=float, default=2.0,
                    help="skip a parallel scan whose dense elements need more memory")
    ap.add_argument("--json", help="also write the cells here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--impl", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    impls = args.impls.split(",")
    cells = []
    for backend in args.backends.split(","):
        base = _baseline_rss(backend)
        for n in sizes:
            S = args.src or n
            row = {"backend": backend, "n": n, "S": S}
            for impl in impls:
                need = args.batch * n * S ** 2 * 4 / 2**30  # the scan's dense [B, T, S, S] elements
                if impl == "parallel" and need > args.max_gb:
                    row[impl] = f"not run: its [B, T, S, S] elements need {need:.1f} GB"
                    print(f"[structured] {backend} T={n} S={S} {impl}: {row[impl]}",
                          file=sys.stderr)
                    continue
                cmd = [sys.executable, __file__, "--child", "--impl", impl, "--backend", backend,
                       "--n", str(n), "--batch", str(args.batch), "--reps", str(args.reps),
                       "--device", args.device] + (["--src", str(S)] if args.src else [])
                try:
                    res = subprocess.run(cmd, capture_output=True, text=True,
                                         timeout=args.timeout)
                    if res.returncode == 0:
                        out = json.loads(res.stdout.strip().splitlines()[-1])
                        row[impl] = (out["ms"], out["rss_mb"] - base)
                    else:
                        err = res.stderr.strip().splitlines()
                        killed = (res.returncode in (-9, 137) or "MemoryError" in res.stderr
                                  or "RESOURCE_EXHAUSTED" in res.stderr)
                        row[impl] = "out of memory" if killed else \
                            f"failed: {err[-1][:80] if err else res.returncode}"
                except subprocess.TimeoutExpired:
                    row[impl] = f"> {args.timeout:.0f} s"
                print(f"[structured] {backend} T={n} S={S} {impl}: {row[impl]}", file=sys.stderr,
                      flush=True)
            cells.append(row)
    shape = f"S = {args.src}" if args.src else "T = S"
    print(f"\nbatch {args.batch}, {shape}, loss + gradient ms per step (median of {args.reps}; "
          f"NumPyro jitted, compile excluded; the NumPyro enumerated cell is the log density "
          f"alone), peak memory above an idle process in MB; device {args.device}\n")
    head = " | ".join(f"{i} ms (MB)" for i in impls)
    print(f"| backend | T | S | {head} | enumerated / banded |")
    print("|---|---|---|" + "---|" * len(impls) + "---|")
    for row in cells:
        def fmt(v):
            return f"{v[0]:.1f} ({v[1]:.0f})" if isinstance(v, tuple) else v

        e, b = row.get("enumerated"), row.get("banded")
        ratio = f"{e[0] / b[0]:.1f}×" if isinstance(e, tuple) and isinstance(b, tuple) else "—"
        print(f"| {row['backend']} | {row['n']} | {row['S']} | " + " | ".join(fmt(row.get(i, "—"))
                                                               for i in impls) + f" | {ratio} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(cells, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
