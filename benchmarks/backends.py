"""Pyro against NumPyro on the same Seq2SeqAlignment: ms per loss+gradient step of each method
and backend at two sizes, NumPyro's first-call compile time, and the ratios NumPyro /
hand-written JAX, Pyro / hand-written torch and NumPyro / Pyro.

    python benchmarks/backends.py [--reps 5] [--sizes small,large] [--methods exact,soft,...]
    python benchmarks/backends.py --tutorial [--batch-sizes 64,8] [--steps 60]

``--tutorial``: the README tutorial's model, written twice — Pyro (examples/tutorial/
diagonal.py) and NumPyro alone (diagonal_numpyro.py) — each trained the way its loop trains it
(the Pyro step: ``loss_and_grads``, clipping, Adam; the NumPyro step: the jitted optax step of
``ppl_attention.numpyro.inference.fit`` on bucket-padded batches) on ``reorder`` batches,
interleaved step by step (the same batch for both, so drift hits both alike); every padded
shape is compiled before the timed steps, and the compile seconds and count are reported apart.

small: batch 16, source 8, target 8, vocab 50, hidden 32; large: batch 64, source 20, target 20,
vocab 1000, hidden 256. The hand-written steps compute −Σ log Σ_j p(z_t = j) p(y_t | z_t = j)
of the same network directly (log-softmax + logsumexp) with its gradient: torch eager, and JAX
under ``jax.jit``. The NumPyro step is the method's loss under ``jax.jit`` (value and gradient);
the Pyro step is ``loss_and_grads``. Medians of one run; quote ratios, not times.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def device_arg(argv) -> str:
    """``--device cpu|cuda|gpu`` read before JAX is imported (it picks its platform then)."""
    for i, a in enumerate(argv):
        if a == "--device" and i + 1 < len(argv):
            return "cuda" if argv[i + 1] in ("cuda", "gpu") else argv[i + 1]
        if a.startswith("--device="):
            return "cuda" if a.split("=", 1)[1] in ("cuda", "gpu") else a.split("=", 1)[1]
    return "cpu"


DEVICE = device_arg(sys.argv)
os.environ.setdefault("JAX_PLATFORMS", "cuda" if DEVICE == "cuda" else "cpu")

import jax  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from seq2seq_methods import median_ms, synthetic_batch  # noqa: E402

from ppl_attention.numpyro.inference.fit import make_loss  # noqa: E402
from ppl_attention.numpyro.jax_batches import to_jax  # noqa: E402
from ppl_attention.numpyro.models import Seq2SeqAlignment as JaxModel  # noqa: E402
from ppl_attention.pyro.inference.methods import get_method, loss_and_grads  # noqa: E402
from ppl_attention.pyro.models import Seq2SeqAlignment  # noqa: E402

SIZES = {"small": dict(batch=16, src=8, tgt=8, vocab=50, hidden=32),
         "large": dict(batch=64, src=20, tgt=20, vocab=1000, hidden=256)}
METHODS = ["soft", "exact", "vae-enum", "vae-sample", "dirichlet", "bam-weibull",
           "bam-lognormal", "gaussian-context"]


def jax_timed(fn, reps):
    """(first-call seconds including compilation, median ms of later calls)."""
    t = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t
    return first, median_ms(lambda: jax.block_until_ready(fn()), reps, warmup=0)


def bench_size(name, size, methods, reps):
    batch = synthetic_batch(size["batch"], size["src"], size["tgt"], size["vocab"])
    jb = to_jax(batch)
    batch = batch.to(DEVICE)

    def build(method):
        torch.manual_seed(0)
        return Seq2SeqAlignment(size["vocab"], size["vocab"], hidden=size["hidden"],
                                family=get_method(method).family(size["hidden"])).to(DEVICE)

    reference = build("exact")

    def hand_torch():
        reference.zero_grad()
        (-reference.exact_token_log_likelihood(batch).sum()).backward()

    base_torch = median_ms(hand_torch, reps)
    jm, params = JaxModel.from_torch(reference)
    hand_jax = jax.jit(jax.value_and_grad(lambda p: -jm.exact_token_log_likelihood_of(p, jb).sum()))
    _, base_jax = jax_timed(lambda: hand_jax(params), reps)
    print(f"\n{name}: batch {size['batch']}, source {size['src']}, target {size['tgt']}, vocab "
          f"{size['vocab']}, hidden {size['hidden']}; medians of {reps}")
    print(f"hand-written torch {base_torch:.1f} ms, hand-written JAX (jit) {base_jax:.1f} ms")
    print(f"{'method':<18}{'Pyro ms':>9}{'NumPyro ms':>12}{'compile s':>11}"
          f"{'Pyro/torch':>12}{'NumPyro/JAX':>13}{'NumPyro/Pyro':>14}")
    for method in methods:
        m = get_method(method)
        model = build(method)
        elbo = m.elbo()
        pyro.clear_param_store()

        def pyro_step(m=m, elbo=elbo, model=model):
            model.zero_grad()
            loss_and_grads(m, elbo, model, batch, 1000, m.kl_scale(1000))

        pyro_ms = median_ms(pyro_step, reps)
        jm, params = JaxModel.from_torch(model)
        loss = make_loss(jm, method, site=jm.param_name)
        step = jax.jit(jax.value_and_grad(lambda p, key, loss=loss: loss(p, key, jb, 1.0)[0]))
        key = jax.random.PRNGKey(0)
        compile_s, np_ms = jax_timed(lambda s=step, p=params, k=key: s(p, k), reps)
        print(f"{method:<18}{pyro_ms:>9.1f}{np_ms:>12.1f}{compile_s:>11.1f}"
              f"{pyro_ms / base_torch:>12.2f}{np_ms / base_jax:>13.2f}{np_ms / pyro_ms:>14.2f}")


def bench_tutorial(batch_size: int, methods, steps: int) -> None:
    """The tutorial model's training step, Pyro against NumPyro (module docstring)."""
    import statistics

    from ppl_attention.data import Vocab, make_batches, make_task
    from ppl_attention.numpyro.inference.fit import make_step
    from ppl_attention.numpyro.inference.methods import get_method as numpyro_method
    from ppl_attention.numpyro.models.base import init_params, unconstrain

    tutorial = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                            "tutorial")
    sys.path.insert(0, tutorial)
    from diagonal import DiagonalAlignment as PyroDiagonal
    from diagonal_numpyro import DiagonalAlignment as NumPyroDiagonal

    task = make_task("reorder", n_train=5000)
    sv = Vocab.build(s for s, _ in task.train.pairs)
    tv = Vocab.build(t for _, t in task.train.pairs)
    batches = make_batches(task.train.pairs, sv, tv, batch_size, shuffle=True)[:steps]
    rows = max(b.size for b in batches)
    jbs = [to_jax(b, rows, "bucket") for b in batches]
    shapes = {(jb.src.shape, jb.tgt_out.shape) for jb in jbs}
    print(f"\nTutorial model, reorder, batch {batch_size}, {len(batches)} interleaved steps, "
          f"{len(shapes)} padded shapes")
    print(f"{'method':<10}{'Pyro ms':>9}{'NumPyro ms':>12}{'NumPyro/Pyro':>14}"
          f"{'compilations':>14}{'compile s':>11}")
    for method in methods:
        m = get_method(method)
        torch.manual_seed(0)
        pyro.clear_param_store()
        tm = PyroDiagonal(len(sv), len(tv), family=m.family())
        elbo, opt = m.elbo(), torch.optim.Adam(tm.parameters(), lr=0.05)

        def pyro_step(b, m=m, elbo=elbo, opt=opt, tm=tm):
            opt.zero_grad()
            loss_and_grads(m, elbo, tm, b, 0, 1.0)
            torch.nn.utils.clip_grad_norm_(tm.parameters(), 5.0)
            opt.step()

        jm = NumPyroDiagonal(len(sv), len(tv), family=numpyro_method(method).family())
        params, cons = init_params(jm, jbs[0], jax.random.PRNGKey(0))
        step = make_step(jm, method, 5.0, 0.0, cons)
        state = {"raw": unconstrain(params, cons)}
        state["opt"] = step.init(state["raw"])
        key = jax.random.PRNGKey(0)

        def numpyro_step(i, b, step=step, state=state, key=key):
            state["raw"], state["opt"], loss = step(state["raw"], state["opt"],
                                                    jax.random.fold_in(key, i), jbs[i],
                                                    float(b.n_tokens), 0.05, 1.0)
            jax.block_until_ready(loss)

        compile_s, seen = 0.0, set()
        for i, (b, jb) in enumerate(zip(batches, jbs)):  # compile every shape, untimed
            if (jb.src.shape, jb.tgt_out.shape) not in seen:
                seen.add((jb.src.shape, jb.tgt_out.shape))
                t = time.perf_counter()
                numpyro_step(i, b)
                compile_s += time.perf_counter() - t
        for b in batches[:3]:
            pyro_step(b)
        ms_p, ms_n = [], []
        for i, b in enumerate(batches):
            t = time.perf_counter()
            pyro_step(b)
            ms_p.append(1000 * (time.perf_counter() - t))
            t = time.perf_counter()
            numpyro_step(i, b)
            ms_n.append(1000 * (time.perf_counter() - t))
        ratio = statistics.median(n / p for n, p in zip(ms_n, ms_p))
        print(f"{method:<10}{statistics.median(ms_p):>9.2f}{statistics.median(ms_n):>12.2f}"
              f"{ratio:>14.2f}{step._cache_size():>14}{compile_s:>11.1f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tutorial", action="store_true",
                    help="the tutorial model's training step instead (module docstring)")
    ap.add_argument("--batch-sizes", default="64,8", help="--tutorial: batch sizes")
    ap.add_argument("--steps", type=int, default=60, help="--tutorial: timed steps")
    ap.add_argument("--sizes", default="small,large")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--device", choices=["cpu", "cuda", "gpu"], default="cpu",
                    help="torch device and JAX platform (read before JAX starts)")
    args = ap.parse_args(argv)
    print(f"torch {torch.__version__} ({torch.get_num_threads()} threads), pyro {pyro.__version__},"
          f" jax {jax.__version__} on {jax.devices()[0].platform}")
    if args.tutorial:
        methods = args.methods.split(",") if args.methods != ",".join(METHODS) else \
            ["exact", "vae-enum", "hard-enum"]
        for bs in args.batch_sizes.split(","):
            bench_tutorial(int(bs), methods, args.steps)
        return
    for name in args.sizes.split(","):
        bench_size(name, SIZES[name], args.methods.split(","), args.reps)


if __name__ == "__main__":
    main()
