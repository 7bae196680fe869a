"""Dependency trees: (1) the speed of log Z, forward + backward, against torch-struct, and (2)
the tree-transduction table, soft against tree attention.

(1) ``--part speed``: ``DependencyTree(scores).log_partition`` and its gradient (the arc
marginals) at N ∈ {16, 32, 64}, batch 16, float32, both kinds of tree — ours under torch
(``pyro``), ours under JAX (``numpyro``, jitted; compile time apart) and torch-struct 0.5
(``DependencyCRF`` with one root or several, ``NonProjectiveDependencyCRF``; an optional peer,
``pip install torch-struct``, skipped with a message when absent) and SynJax's
``SpanningTreeCRF`` (directed, one root child; JAX, jitted; installed from its repository,
optional, skipped when absent), each peer's log Z checked equal to ours first. Each cell
runs in its own process, so its peak resident memory is its own (reported above an idle process
that imported the same libraries); time is the median of ``--reps`` steps after one warm-up.
Ratios are ours over the peer's, in the same run.

(2) ``--part transduction``: ``ppl-attention compare --task trees --depth D`` for D in
``--depths``, the ``--methods`` (``soft`` and ``tree-marginals`` by default; ``tree-sample``
added by ``--with-sample``) with ``--encoder-layers`` where given (0: the attention reads the
source embeddings, Kim et al. 2017's setting), ``--seeds`` seeds, the stated training
budget; one table of the percentage of target tokens greedy decoding gets right before its
first error, exact-match accuracy and the UAS of the learned trees (mean ± sd over seeds);
``--backend`` and ``--weight-decay`` go to ``compare`` as given.

    python benchmarks/trees.py --part speed --reps 5
    python benchmarks/trees.py --part transduction --depths 2,4,6 --seeds 3 --out runs/trees
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIZES = (16, 32, 64)
KINDS = ("projective", "non-projective")


def _cell(impl: str, kind: str, n: int, batch: int, reps: int) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    scores = rng.normal(size=(batch, n, n)).astype(np.float32)
    projective = kind == "projective"
    if impl == "numpyro":
        import jax.numpy as jnp

        from ppl_attention.numpyro.trees import DependencyTree as JT

        return _jax_timed(lambda s: JT(s, projective=projective).log_partition.sum(),
                          jnp.asarray(scores), reps)
    if impl == "synjax":
        return _synjax_cell(scores, projective, reps)
    import torch

    torch.set_num_threads(1)
    x = torch.tensor(scores)

    def step():
        s = x.clone().requires_grad_(True)
        if impl == "pyro":
            from ppl_attention.pyro.trees import DependencyTree

            log_z = DependencyTree(s, projective=projective).log_partition
        else:
            import torch_struct

            cls = torch_struct.DependencyCRF if projective else \
                torch_struct.NonProjectiveDependencyCRF
            kw = {"multiroot": False}
            log_z = cls(s, **kw).partition
        log_z.sum().backward()
        return s.grad

    step()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"ms": 1e3 * statistics.median(times)}


def to_synjax(scores):
    """Ours ``[..., N, N]`` (``[h, m]``: h heads m, the diagonal root → m) as SynJax's
    ``SpanningTreeCRF`` potentials ``[..., N + 1, N + 1]`` (node 0 the root; ``[h, m]`` h heads m;
    the root's column and the self-loops never count)."""
    import jax.numpy as jnp

    N = scores.shape[-1]
    eye = jnp.eye(N, dtype=bool)
    arcs = jnp.where(eye, -1e9, scores)
    root = jnp.diagonal(scores, axis1=-2, axis2=-1)[..., None, :]
    body = jnp.concatenate([root, arcs], -2)  # [..., N + 1, N]
    return jnp.concatenate([jnp.full(body.shape[:-1] + (1,), -1e9, scores.dtype), body], -1)


def _synjax_cell(scores, projective: bool, reps: int) -> dict:
    """SynJax's ``SpanningTreeCRF`` (directed, one root child) on the same trees, jitted; its
    log Z checked equal to ours first (float32, relative 1e-4)."""
    import jax.numpy as jnp
    import synjax

    from ppl_attention.numpyro.trees import DependencyTree as JT

    x = jnp.asarray(scores)

    def log_z(s):
        return synjax.SpanningTreeCRF(to_synjax(s), directed=True, projective=projective,
                                      single_root_edge=True).log_partition()

    mine = JT(x, projective=projective).log_partition
    assert jnp.allclose(mine, log_z(x), rtol=1e-4), (mine, log_z(x))
    return _jax_timed(lambda s: log_z(s).sum(), x, reps)


def _jax_timed(loss, x, reps: int) -> dict:
    """``loss`` and its gradient at ``x``, jitted: the first call (compilation) apart, the
    median of ``reps`` calls."""
    import jax

    grad = jax.jit(jax.value_and_grad(loss))
    t0 = time.perf_counter()
    jax.block_until_ready(grad(x))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(grad(x))
        times.append(time.perf_counter() - t0)
    return {"ms": 1e3 * statistics.median(times), "compile_s": compile_s}


def _child(args) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    out = _cell(args.impl, args.kind, args.n, args.batch, args.reps)
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def _baseline_rss(impl: str) -> float:
    imports = {"pyro": "import torch, ppl_attention.pyro.trees",
               "numpyro": "import jax, jax.numpy as jnp, ppl_attention.numpyro.trees; "
                          "jnp.zeros(1).block_until_ready()",
               "torch-struct": "import torch, torch_struct",
               "synjax": "import jax, jax.numpy as jnp, synjax, ppl_attention.numpyro.trees; "
                         "jnp.zeros(1).block_until_ready()"}[impl]
    code = f"import resource; {imports}; print(resource.getrusage(resource.RUSAGE_SELF)" \
           f".ru_maxrss / 1024)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout)


def speed(args) -> int:
    impls = ["pyro", "numpyro", "torch-struct"]
    # found, not imported: a child process starts with its parent's peak resident memory
    # (Linux keeps it across exec), so the parent stays small
    if importlib.util.find_spec("torch_struct") is None:
        print("torch-struct is not installed (pip install torch-struct): its column is "
              "skipped", file=sys.stderr)
        impls.remove("torch-struct")
    if importlib.util.find_spec("synjax") is not None:
        impls.append("synjax")
    else:
        print("SynJax is not installed (pip install from github.com/google-deepmind/synjax): "
              "its column is skipped", file=sys.stderr)
    base = {impl: _baseline_rss(impl) for impl in impls}
    rows = []
    for kind in KINDS:
        for n in args.sizes:
            row = {"kind": kind, "n": n}
            for impl in impls:
                cmd = [sys.executable, __file__, "--child", "--impl", impl, "--kind", kind,
                       "--n", str(n), "--batch", str(args.batch), "--reps", str(args.reps)]
                outs = []
                for _ in range(args.rounds):
                    res = subprocess.run(cmd, capture_output=True, text=True,
                                         timeout=args.timeout)
                    if res.returncode:
                        print(f"{impl} {kind} N={n} failed: {res.stderr.strip()[-300:]}",
                              file=sys.stderr)
                        outs = []
                        break
                    outs.append(json.loads(res.stdout.strip().splitlines()[-1]))
                if not outs:
                    row[impl] = None
                    continue
                times = [o["ms"] for o in outs]
                row[impl] = (statistics.median(times), max(o["rss_mb"] for o in outs)
                             - base[impl], outs[0].get("compile_s"))
                print(f"{impl} {kind} N={n}: {statistics.median(times):.2f} ms (rounds: "
                      f"{', '.join(f'{t:.2f}' for t in times)})", file=sys.stderr)
            rows.append(row)
    print(f"log Z forward + backward, batch {args.batch}, float32, median of {args.reps} "
          f"calls, median over {args.rounds} processes (one thread per torch process), peak "
          f"memory above an idle process in MB\n")
    head = "| kind | N | " + " | ".join(f"{i} ms | {i} MB" for i in impls)
    if "torch-struct" in impls:
        head += " | pyro / torch-struct | numpyro / torch-struct"
    if "synjax" in impls:
        head += " | numpyro / SynJax"
    print(head + " |")
    print("|---|---|" + "---|---|" * len(impls) + ("---|---|" if "torch-struct" in impls else "")
          + ("---|" if "synjax" in impls else ""))
    for r in rows:
        cells = []
        for impl in impls:
            v = r[impl]
            cells += ["failed", "—"] if v is None else \
                [f"{v[0]:.2f}" if v[0] < 10 else f"{v[0]:.1f}", f"{v[1]:.0f}"]
        if "torch-struct" in impls:
            ts = r["torch-struct"]
            for impl in ("pyro", "numpyro"):
                cells.append("—" if ts is None or r[impl] is None else
                             f"{r[impl][0] / ts[0]:.2f}")
        if "synjax" in impls:
            sj = r["synjax"]
            cells.append("—" if sj is None or r["numpyro"] is None else
                         f"{r['numpyro'][0] / sj[0]:.2f}")
        print(f"| {r['kind']} | {r['n']} | " + " | ".join(cells) + " |")
    compile_s = [r["numpyro"][2] for r in rows if r.get("numpyro")]  # SynJax's not in its ms
    if compile_s:
        print(f"\nnumpyro compile (first call) {min(compile_s):.1f}–{max(compile_s):.1f} s, "
              "not in its ms")
    return 0


def transduction(args) -> int:
    out = Path(args.out)
    methods = args.methods + (",tree-sample" if args.with_sample and "tree-sample" not in
                              args.methods.split(",") else "")
    table = {}
    for depth in args.depths:
        cmd = ["ppl-attention", "compare", "--task", "trees", "--depth", str(depth),
               "--methods", methods, "--seeds", str(args.seeds), "--steps", str(args.steps),
               "--n-train", str(args.n_train), "--hidden", str(args.hidden),
               "--batch-size", str(args.batch_size), "--jobs", str(args.jobs),
               "--out", str(out / f"depth{depth}")]
        if args.encoder_layers is not None:  # 0: the attention reads the embeddings (Kim et al.)
            cmd += ["--encoder-layers", str(args.encoder_layers)]
        if args.backend is not None:
            cmd += ["--backend", args.backend]
        if args.weight_decay is not None:
            cmd += ["--weight-decay", str(args.weight_decay)]
        print(" ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)  # its table: results.md
        csv = (out / f"depth{depth}" / "results.csv").read_text().splitlines()
        head = csv[0].split(",")
        for line in csv[1:]:
            cells = dict(zip(head, line.split(",")))
            if cells["status"] != "ok":
                continue
            for key in ("prefix_accuracy", "sequence_accuracy", "uas"):
                v = cells.get(key)
                if v not in (None, "", "None"):
                    table.setdefault((cells["method"], depth, key), []).append(float(v))

    def fmt(vals):
        if not vals:
            return "—"
        m = statistics.mean(vals)
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        return f"{100 * m:.1f} ± {100 * sd:.1f}"

    setting = ("" if args.encoder_layers is None else
               f", encoder layers {args.encoder_layers}")
    setting += "" if args.backend is None else f", {args.backend}"
    setting += "" if args.weight_decay is None else f", weight decay {args.weight_decay}"
    print(f"\nTree transduction (prefix → infix){setting}, {args.seeds} seeds, "
          f"{args.n_train} training pairs, {args.steps} steps of batch {args.batch_size}, "
          f"hidden {args.hidden}; % of "
          f"target tokens correct before the first error (greedy decoding), exact-match %, "
          f"UAS % of the MAP trees\n")
    depths = args.depths
    print("| method | " + " | ".join(f"depth {d} correct | depth {d} exact | depth {d} UAS"
                                      for d in depths) + " |")
    print("|---|" + "---|---|---|" * len(depths))
    for method in methods.split(","):
        cells = []
        for d in depths:
            cells += [fmt(table.get((method, d, k), [])) for k in
                      ("prefix_accuracy", "sequence_accuracy", "uas")]
        print(f"| {method} | " + " | ".join(cells) + " |")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("speed", "transduction"), default="speed")
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=SIZES)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3, help="processes per cell, the median of "
                   "their medians reported")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 6])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--n-train", type=int, default=2000)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--with-sample", action="store_true")
    p.add_argument("--methods", default="soft,tree-marginals",
                   help="comma-separated methods of the transduction table")
    p.add_argument("--encoder-layers", type=int, default=None,
                   help="the model's BiLSTM layers (0: the attention reads the source "
                        "embeddings, the paper's setting; default: the model's own)")
    p.add_argument("--backend", choices=("pyro", "numpyro"),
                   help="transduction: compare's --backend (default: the model's, Pyro)")
    p.add_argument("--weight-decay", type=float,
                   help="transduction: compare's --weight-decay (default: the model's)")
    p.add_argument("--out", default="runs/trees")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", help=argparse.SUPPRESS)
    p.add_argument("--kind", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    given = [flag for flag, v in (("--backend", args.backend),
                                  ("--weight-decay", args.weight_decay),
                                  ("--encoder-layers", args.encoder_layers)) if v is not None]
    if args.part == "speed" and given:
        p.error(f"{', '.join(given)}: options of --part transduction, not of --part speed")
    return speed(args) if args.part == "speed" else transduction(args)


if __name__ == "__main__":
    sys.exit(main())
