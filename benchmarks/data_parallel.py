"""Steps per second of NumPyro SVI on one device vs the batch sharded over two (host) devices,
measured in one run (the process starts with two XLA host devices).

    python benchmarks/data_parallel.py --reps 20

On the 2-core CPU machine the two "devices" share the same two cores, so this measures the
overhead of sharding more than a speed-up; on a machine with several accelerators it measures
the real thing.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import argparse  # noqa: E402
import time  # noqa: E402


def main(argv=None):
    import jax
    import torch

    from ppl_attention.data import Vocab, make_batches, make_task
    from ppl_attention.inference import get_method
    from ppl_attention.models import Seq2SeqAlignment
    from ppl_attention.numpyro.batching import to_jax
    from ppl_attention.numpyro.inference.fit import adam_init, data_parallel, make_step
    from ppl_attention.numpyro.models import Seq2SeqAlignment as JaxModel

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--methods", default="exact,vae-enum")
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
            params, opt, batch = p, adam_init(p), jb
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


if __name__ == "__main__":
    main()
