"""Steps per second of data-parallel SVI, measured in one run: NumPyro on one JAX device vs the
batch sharded over two (host) devices, and Pyro in one process vs two ``torchrun`` processes
(gloo, DistributedDataParallel).

    python benchmarks/data_parallel.py --reps 20 --pyro-steps 200

On the 2-core CPU machine the two "devices" share the same two cores (and the one Pyro process
gets both cores' threads, each torchrun process one), so this measures the overhead of
sharding more than a speed-up; on a machine with several accelerators it measures the real
thing.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import argparse  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402


def pyro_steps_per_second(method: str, processes: int, steps: int, hidden: int,
                          batch_size: int) -> float:
    """``train`` under torchrun (or plain, for 1 process); steps/s from the run's ms/step."""
    launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={processes}"] if processes > 1 else [sys.executable])
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([*launch, "-m", "ppl_attention.cli", "train", "--task", "reorder",
                            "--n-train", "2000", "--method", method, "--steps", str(steps),
                            "--hidden", str(hidden), "--batch-size", str(batch_size),
                            "--valid-every", str(10 * steps), "--out", f"{tmp}/run"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(r.stderr[-3000:])
        from ppl_attention.common.runs import Run

        return 1000.0 / Run.load(f"{tmp}/run").extra["ms_per_step"]


def main(argv=None):
    import jax
    import torch

    from ppl_attention.data import Vocab, make_batches, make_task
    from ppl_attention.numpyro.inference.fit import data_parallel, make_step
    from ppl_attention.numpyro.jax_batches import to_jax
    from ppl_attention.numpyro.models import Seq2SeqAlignment as JaxModel
    from ppl_attention.pyro.inference import get_method
    from ppl_attention.pyro.models import Seq2SeqAlignment

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--methods", default="exact,vae-enum")
    ap.add_argument("--pyro-steps", type=int, default=200,
                    help="steps of each Pyro run (0: skip the torchrun rows)")
    args = ap.parse_args(argv)
    task = make_task("reorder", n_train=2000, n_eval=8, seed=0)
    sv = Vocab.build(s for s, _ in task.train.pairs)
    tv = Vocab.build(t for _, t in task.train.pairs)
    print(f"{len(jax.devices())} JAX devices ({jax.devices()[0].platform})")
    print("| method | 1 device steps/s | 2 devices steps/s | ratio |")
    print("|---|---|---|---|")
    for method in args.methods.split(","):
        torch.manual_seed(0)
        tm = Seq2SeqAlignment(len(sv), len(tv), hidden=args.hidden,
                              family=get_method(method).family(args.hidden))
        jm, p = JaxModel.from_torch(tm)
        b = make_batches(task.train.pairs, sv, tv, args.batch_size)[0]
        jb = to_jax(b, args.batch_size, 4)
        rates = []
        for devices in (1, 2):
            step = make_step(jm, method, 5.0)
            params = {jm.param_name: p}
            params, opt, batch = params, step.init(params), jb
            if devices > 1:
                data, rep = data_parallel(devices, args.batch_size)
                params, opt, batch = (jax.device_put(params, rep), jax.device_put(opt, rep),
                                      jax.device_put(batch, data))
            key = jax.random.PRNGKey(0)
            out = step(params, opt, key, batch, float(b.n_tokens), 1e-3, 1.0)  # compile
            jax.block_until_ready(out)
            t = time.perf_counter()
            for i in range(args.reps):
                params, opt, loss = step(params, opt, jax.random.fold_in(key, i), batch,
                                         float(b.n_tokens), 1e-3, 1.0)
            jax.block_until_ready(loss)
            rates.append(args.reps / (time.perf_counter() - t))
        print(f"| {method} | {rates[0]:.1f} | {rates[1]:.1f} | {rates[1] / rates[0]:.2f} |")
    if args.pyro_steps:
        print(f"\nPyro, {args.pyro_steps} steps, hidden {args.hidden}, batch {args.batch_size}")
        print("| method | 1 process steps/s | 2 torchrun processes steps/s | ratio |")
        print("|---|---|---|---|")
        for method in args.methods.split(","):
            one, two = (pyro_steps_per_second(method, n, args.pyro_steps, args.hidden,
                                              args.batch_size) for n in (1, 2))
            print(f"| {method} | {one:.1f} | {two:.1f} | {two / one:.2f} |")


if __name__ == "__main__":
    main()
