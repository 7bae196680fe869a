"""The structure library against the peers a user would otherwise pick: each structure's log Z
forward + backward (the marginals) and drawing one exact sample per row, batch 16, float32, on
PyTorch (ours under ``pyro`` against torch-struct 0.5, ``pip install torch-struct``, optional) and
on JAX (ours under ``numpyro``, jitted, compile time apart; SynJax, installed from its
repository — ``pip install git+https://github.com/google-deepmind/synjax`` —, optional, in the
same conventions as ours, its log Z checked equal first). Each cell runs in its own process, so
its peak resident memory is its own (reported above an idle process that imported the same
libraries); time is the median of ``--reps`` calls after one warm-up (fewer, at least 3, where
they pass 30 s), and each cell runs in ``--rounds`` processes, the median of their medians
reported (one process where the calls pass 30 s): the JAX cells of this machine move by ±15 %
from one process to the next. Ratios are ours over the peer's, in the same run. Before timing,
each peer's log Z is checked equal to ours on potentials converted between the two conventions.

    python benchmarks/structures.py --reps 20
    python benchmarks/structures.py --alternate --structures chain --reps 10

Structures measured: ``chain`` (``LinearChainCRF``, n = 128, t = 32; torch-struct's log Z
checked equal to ours first), ``semi-markov`` (``SemiMarkovCRF``, n = 64, m = 8, t = 8;
torch-struct's potentials of the same size, ``[B, n − 1, m, t, t]``, not checked: its convention
has no exact conversion to SynJax's), ``tree-crf`` (``TreeCRF``, n = 32, l = 8; the same
convention as torch-struct's, checked) and ``ctc`` (``CTC``, T = 200, L = 50, V = 32; the torch
peer is ``torch.nn.functional.ctc_loss`` and the JAX peer ``optax.ctc_loss``, both checked
equal; they do not sample).
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

SIZES = {"chain": {"n": 128, "t": 32}, "semi-markov": {"n": 64, "m": 8, "t": 8},
         "tree-crf": {"n": 32, "l": 8}, "ctc": {"T": 200, "L": 50, "V": 32}}
#: the torch peer, and whether its log Z is checked equal to ours first (the conventions of
#: torch-struct's semi-Markov CRF — N − 1 edges, segment sizes 1 … K − 1 — have no exact
#: conversion here); CTC's peers are ``torch.nn.functional.ctc_loss`` and ``optax.ctc_loss``
PEERS = {"chain": ("LinearChainCRF", True), "semi-markov": ("SemiMarkovCRF", False),
         "tree-crf": ("TreeCRF", True), "ctc": ("ctc_loss", True)}


def _to_torch_struct(theta):
    """Ours ``[B, n, t, t]`` (``[i, a, b]``: a at i−1 → b at i, row 0 the start) as
    torch-struct's ``[B, n − 1, t, t]`` (``[i, b, a]``: z_i = a → z_{i+1} = b, no start)."""
    edge = theta[:, 1:].transpose(-1, -2).clone()
    edge[:, 0] = edge[:, 0] + theta[:, 0, 0, :][:, None, :]
    return edge


def _data(structure: str, batch: int):
    import numpy as np

    z = SIZES[structure]
    rng = np.random.default_rng(0)
    shape = {"chain": (batch, z.get("n"), z.get("t"), z.get("t")),
             "semi-markov": (batch, z.get("n"), z.get("m"), z.get("t"), z.get("t")),
             "tree-crf": (batch, z.get("n"), z.get("n"), z.get("l")),
             "ctc": (batch, z.get("T"), z.get("V"))}[structure]
    theta = rng.normal(size=shape).astype(np.float32)
    labels = rng.integers(1, z["V"], size=(batch, z["L"])) if structure == "ctc" else None
    return theta, labels


def _cell(impl: str, structure: str, batch: int, reps: int, what: str) -> dict:
    theta_np, labels_np = _data(structure, batch)
    if impl == "synjax":
        return _synjax_cell(structure, theta_np, labels_np, reps, what)
    if impl in ("numpyro", "jax-peer"):
        import jax
        import jax.numpy as jnp

        from ppl_attention.numpyro import crfs

        theta = jnp.asarray(theta_np)
        if impl == "jax-peer":
            import optax

            zeros_t = jnp.zeros(theta.shape[:2])
            zeros_l = jnp.zeros(labels_np.shape)
            labels = jnp.asarray(labels_np)
            mine = crfs.CTC(theta.astype(jnp.float64) if jax.config.x64_enabled else theta,
                            labels).log_partition
            theirs = -optax.ctc_loss(theta, zeros_t, labels, zeros_l)
            assert jnp.allclose(mine, theirs, rtol=1e-4), (mine, theirs)
            fn = jax.jit(jax.grad(lambda th: optax.ctc_loss(th, zeros_t, labels,
                                                            zeros_l).sum()))
            call = lambda: fn(theta).block_until_ready()  # noqa: E731
        else:
            if structure == "ctc":
                labels = jnp.asarray(labels_np)
                make = lambda th: crfs.CTC(th, labels)  # noqa: E731
            else:
                cls = {"chain": crfs.LinearChainCRF, "semi-markov": crfs.SemiMarkovCRF,
                       "tree-crf": crfs.TreeCRF}[structure]
                make = cls
            if what == "logz":
                fn = jax.jit(jax.grad(lambda th: make(th).log_partition.sum()))
                call = lambda: fn(theta).block_until_ready()  # noqa: E731
            else:
                fn = jax.jit(lambda th, k: make(th).sample(k))
                key = jax.random.PRNGKey(0)
                call = lambda: fn(theta, key).block_until_ready()  # noqa: E731
    else:
        import torch

        from ppl_attention.pyro import crfs

        torch.set_num_threads(1)
        theta = torch.tensor(theta_np)
        labels = None if labels_np is None else torch.tensor(labels_np)
        ours = {"chain": crfs.LinearChainCRF, "semi-markov": crfs.SemiMarkovCRF,
                "tree-crf": crfs.TreeCRF,
                "ctc": lambda th: crfs.CTC(th, labels)}[structure]
        if impl == "pyro":
            def call():
                d = ours(theta.clone().requires_grad_(True))
                if what == "logz":
                    d.log_partition.sum().backward()
                else:
                    d.sample()
        elif structure == "ctc":
            B, T = theta.shape[:2]
            il, ll = torch.full((B,), T), torch.full((B,), labels.shape[1])

            def loss(th):
                return torch.nn.functional.ctc_loss(th.log_softmax(-1).transpose(0, 1), labels,
                                                    il, ll, reduction="none")

            mine = ours(theta.double()).log_partition
            assert torch.allclose(mine, -loss(theta.double()), rtol=1e-8)

            def call():
                loss(theta.clone().requires_grad_(True)).sum().backward()
        else:
            import torch_struct

            name, checked = PEERS[structure]
            peer = getattr(torch_struct, name)
            if structure == "chain":
                mine = ours(theta.double()).log_partition
                theirs = peer(_to_torch_struct(theta.double())).partition
                edge = _to_torch_struct(theta)
            elif structure == "tree-crf":
                mine = ours(theta.double()).log_partition
                theirs = peer(theta.double()).partition
                edge = theta
            else:
                edge = theta[:, 1:].contiguous()  # [B, n − 1, m, t, t]: the same size
            if checked:
                assert torch.allclose(mine, theirs, rtol=1e-8), (mine, theirs)

            def call():
                d = peer(edge.clone().requires_grad_(True))
                if what == "logz":
                    d.partition.sum().backward()
                else:
                    d.sample((1,))
    return _timed(call, reps)


#: a cell stops timing after this many seconds of calls (at least 3 calls), below ``--reps``
#: calls where one call takes seconds (torch-struct's samplers)
CELL_SECONDS = 30.0


def _timed(call, reps: int) -> dict:
    t0 = time.perf_counter()
    call()  # warm-up (JAX: compilation)
    first = time.perf_counter() - t0
    times = []
    while len(times) < reps and (len(times) < 3 or sum(times) < CELL_SECONDS):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return {"ms": 1000 * statistics.median(times), "first_s": first, "calls": len(times)}


def _synjax_cell(structure: str, theta_np, labels_np, reps: int, what: str) -> dict:
    """SynJax's structure on the same potentials (ours are in its conventions), jitted; its
    log Z checked equal to ours first (float32, relative 1e-4)."""
    import jax
    import jax.numpy as jnp
    import synjax

    from ppl_attention.numpyro import crfs

    theta = jnp.asarray(theta_np)
    if structure == "ctc":
        labels = jnp.asarray(labels_np, jnp.int32)
        make = lambda th: synjax.CTC(th, labels)  # noqa: E731
        mine = crfs.CTC(theta, labels).log_partition
    else:
        cls = {"chain": synjax.LinearChainCRF, "semi-markov": synjax.SemiMarkovCRF,
               "tree-crf": synjax.TreeCRF}[structure]
        make = cls
        mine = {"chain": crfs.LinearChainCRF, "semi-markov": crfs.SemiMarkovCRF,
                "tree-crf": crfs.TreeCRF}[structure](theta).log_partition
    theirs = make(theta).log_partition()
    assert jnp.allclose(mine, theirs, rtol=1e-4), (mine, theirs)
    if what == "logz":
        fn = jax.jit(jax.grad(lambda th: make(th).log_partition().sum()))
        call = lambda: fn(theta).block_until_ready()  # noqa: E731
    else:
        fn = jax.jit(lambda th, k: make(th).sample(k))
        key = jax.random.PRNGKey(0)
        call = lambda: jax.block_until_ready(fn(theta, key))  # noqa: E731
    return _timed(call, reps)


def _baseline_rss(impl: str, have_struct: bool = True) -> float:
    imports = {"pyro": "import torch, ppl_attention.pyro.crfs",
               "numpyro": "import jax, jax.numpy as jnp, ppl_attention.numpyro.crfs; "
                          "jnp.zeros(1).block_until_ready()",
               "torch-struct": "import torch, ppl_attention.pyro.crfs"
                               + (", torch_struct" if have_struct else ""),
               "synjax": "import jax, jax.numpy as jnp, synjax, ppl_attention.numpyro.crfs; "
                         "jnp.zeros(1).block_until_ready()",
               "jax-peer": "import jax, jax.numpy as jnp, optax, ppl_attention.numpyro.crfs; "
                           "jnp.zeros(1).block_until_ready()"}[impl]
    code = f"import resource; {imports}; print(resource.getrusage(resource.RUSAGE_SELF)" \
           f".ru_maxrss / 1024)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout)


def alternate(structures, batch: int, reps: int, rounds: int = 15) -> None:
    """Ours (``numpyro``) and SynJax's log Z forward + backward in one process, jitted, taking
    turns: ``rounds`` rounds of ``reps`` calls each, the median of the rounds' medians — the
    JAX cells' process-to-process spread taken out of the comparison."""
    import jax
    import jax.numpy as jnp
    import synjax

    from ppl_attention.numpyro import crfs

    for structure in structures:
        if structure == "ctc":
            theta_np, labels_np = _data(structure, batch)
            labels = jnp.asarray(labels_np, jnp.int32)
            fns = {"numpyro": lambda th, y=labels: crfs.CTC(th, y).log_partition,
                   "synjax": lambda th, y=labels: synjax.CTC(th, y).log_partition()}
        else:
            theta_np, _ = _data(structure, batch)
            name = {"chain": "LinearChainCRF", "semi-markov": "SemiMarkovCRF",
                    "tree-crf": "TreeCRF"}[structure]
            fns = {"numpyro": lambda th, n=name: getattr(crfs, n)(th).log_partition,
                   "synjax": lambda th, n=name: getattr(synjax, n)(th).log_partition()}
        theta = jnp.asarray(theta_np)
        grads = {k: jax.jit(jax.grad(lambda th, f=f: f(th).sum())) for k, f in fns.items()}
        for g in grads.values():
            g(theta).block_until_ready()
        medians = {k: [] for k in grads}
        for _ in range(rounds):
            for k, g in grads.items():
                times = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    g(theta).block_until_ready()
                    times.append(time.perf_counter() - t0)
                medians[k].append(statistics.median(times))
        ms = {k: 1000 * statistics.median(v) for k, v in medians.items()}
        print(f"{structure}: log Z fwd + bwd in one process, {rounds} rounds of {reps} calls "
              f"taking turns: numpyro {ms['numpyro']:.2f} ms, SynJax {ms['synjax']:.2f} ms, "
              f"ratio {ms['numpyro'] / ms['synjax']:.3g}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="processes per cell, the median of "
                    "their medians reported (one where a cell's calls pass 30 s)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--structures", default=",".join(SIZES))
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--alternate", action="store_true", help="ours and SynJax (JAX) in one "
                    "process, taking turns, instead of the table")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--impl", help=argparse.SUPPRESS)
    ap.add_argument("--structure", help=argparse.SUPPRESS)
    ap.add_argument("--what", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        import warnings

        warnings.filterwarnings("ignore")
        out = _cell(args.impl, args.structure, args.batch, args.reps, args.what)
        out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(out))
        return 0
    structures = args.structures.split(",")
    unknown = [s for s in structures if s not in SIZES]
    if unknown:
        ap.error(f"--structures: unknown {unknown}; known: {', '.join(SIZES)}")
    if args.alternate:
        if importlib.util.find_spec("synjax") is None:
            ap.error("--alternate compares with SynJax, which is not installed")
        alternate(structures, args.batch, args.reps)
        return 0
    impls = ["pyro", "torch-struct", "numpyro", "synjax", "jax-peer"]
    # found, not imported: a child process starts with its parent's peak resident memory
    # (Linux keeps it across exec), so the parent stays small
    have_struct = importlib.util.find_spec("torch_struct") is not None
    if not have_struct:
        print("torch-struct is not installed (pip install torch-struct): its cells are skipped "
              "(CTC's torch peer, torch's own ctc_loss, is still measured)", file=sys.stderr)
    if importlib.util.find_spec("synjax") is None:
        print("SynJax is not installed (pip install from github.com/google-deepmind/synjax): "
              "its column is skipped", file=sys.stderr)
        impls.remove("synjax")
    base = {impl: _baseline_rss(impl, have_struct) for impl in impls}
    rows = []
    for structure in structures:
        for what in ("logz", "sample"):
            row = {"structure": structure, "what": what}
            for impl in impls:
                if (impl == "jax-peer" and structure != "ctc") or (
                        structure == "ctc" and what == "sample" and impl.endswith(("peer",
                                                                                    "struct"))):
                    row[impl] = None  # no such peer (torch-struct's column is ctc_loss for CTC)
                    continue
                if impl == "torch-struct" and structure != "ctc" and not have_struct:
                    row[impl] = None
                    continue
                cmd = [sys.executable, __file__, "--child", "--impl", impl, "--structure",
                       structure, "--what", what, "--batch", str(args.batch), "--reps",
                       str(args.reps)]
                outs, failed = [], False
                while len(outs) < args.rounds:
                    res = subprocess.run(cmd, capture_output=True, text=True,
                                         timeout=args.timeout)
                    if res.returncode:
                        print(f"{impl} {structure} {what} failed: {res.stderr.strip()[-400:]}",
                              file=sys.stderr)
                        failed = True
                        break
                    outs.append(json.loads(res.stdout.strip().splitlines()[-1]))
                    if outs[-1]["calls"] < args.reps:  # a slow cell: one round
                        break
                if failed:
                    row[impl] = "failed"
                    continue
                times = [o["ms"] for o in outs]
                rss = max(o["rss_mb"] for o in outs)
                row[impl] = (statistics.median(times), rss - base[impl], outs[0]["first_s"])
                print(f"{impl} {structure} {what}: {statistics.median(times):.1f} ms (rounds: "
                      f"{', '.join(f'{t:.1f}' for t in times)})", file=sys.stderr)
            rows.append(row)
    print(f"batch {args.batch}, float32, median of {args.reps} calls after a warm-up (at least "
          f"3 where they pass {CELL_SECONDS:.0f} s), median over {args.rounds} processes (one "
          f"where the calls pass {CELL_SECONDS:.0f} s); one thread per torch process; peak memory "
          f"above an idle process in MB; JAX's first call (compilation) apart\n")
    print("| structure | sizes | operation | " + " | ".join(f"{i} ms | {i} MB" for i in impls)
          + " | ours / peer |")
    print("|---" * (3 + 2 * len(impls) + 1) + "|")
    for r in rows:
        cells = []
        for i in impls:
            v = r[i]
            cells += (["—", "—"] if v is None else ["failed", "—"] if v == "failed" else
                      [f"{v[0]:.1f}", f"{v[1]:.0f}"])
        ratio = "—"
        ok = {i: r.get(i) not in (None, "failed") for i in impls}
        if "torch-struct" in impls and ok["pyro"] and ok["torch-struct"]:
            ratio = f"{r['pyro'][0] / r['torch-struct'][0]:.3g}"
        if ok.get("synjax") and ok["numpyro"]:
            ratio += f"; numpyro / SynJax {r['numpyro'][0] / r['synjax'][0]:.3g}"
        if ok.get("jax-peer") and ok["numpyro"]:
            ratio += f"; numpyro / optax {r['numpyro'][0] / r['jax-peer'][0]:.3g}"
        sizes = ", ".join(f"{k} = {v}" for k, v in SIZES[r["structure"]].items())
        sizes += "" if PEERS[r["structure"]][1] else " (peer's log Z not checked)"
        op = {"logz": "log Z fwd + bwd", "sample": "one sample per row"}[r["what"]]
        print(f"| {r['structure']} | {sizes} | {op} | " + " | ".join(cells) + f" | {ratio} |")
    jax_first = [r["numpyro"][2] for r in rows if r.get("numpyro") not in (None, "failed")]
    if jax_first:
        print(f"\nJAX compile + first call: {', '.join(f'{s:.1f} s' for s in jax_first)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
