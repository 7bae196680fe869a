"""ms per training step of one method on real CMUdict G2P batches (loss, gradient, Adam), for
the ppl_attention that Python imports — to compare two commits, run it under each:

    python benchmarks/g2p_step.py [--method hmm-exact --hidden 384 --encoder-layers 3]
    PYTHONPATH=/path/to/other/checkout python benchmarks/g2p_step.py
    python benchmarks/g2p_step.py --backend both --dropout 0    # Pyro against NumPyro

Prints the median and mean over the timed batches; for NumPyro (the jitted SVI step of
``ppl_attention.numpyro.inference.fit`` on batches padded to its bucket lengths) also how many
shapes it compiled and the seconds that took (steps that compiled are not in the timings).
Quote ratios between runs made one after the other on the same machine, not absolute times.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ppl_attention.data.batching import make_batches
from ppl_attention.data.tasks import make_task
from ppl_attention.data.vocab import Vocab
from ppl_attention.inference.methods import differentiable_loss, get_method
from ppl_attention.models.seq2seq import Seq2SeqAlignment


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="hmm-exact")
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--encoder-layers", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--batches", type=int, default=35, help="timed batches (after 5 warm-up)")
    ap.add_argument("--dropout", type=float, default=0.3, help="(the NumPyro mirror has none)")
    ap.add_argument("--backend", choices=["pyro", "numpyro", "both"], default="pyro")
    ap.add_argument("--device", choices=["cpu"], default="cpu",
                    help="the G2P training loop runs on CPU tensors")
    args = ap.parse_args(argv)
    task = make_task("g2p")
    sv = Vocab.build(s for s, _ in task.train.pairs)
    tv = Vocab.build(t for _, t in task.train.pairs)
    batches = make_batches(task.train.pairs, sv, tv, args.batch_size, shuffle=True)
    batches = batches[: 5 + args.batches]
    method = get_method(args.method)
    torch.manual_seed(0)
    model = Seq2SeqAlignment(len(sv), len(tv), hidden=args.hidden, dropout=args.dropout,
                             family=method.family(args.hidden),
                             encoder_layers=args.encoder_layers)
    if args.backend in ("numpyro", "both"):
        _numpyro(model, args, batches)
    if args.backend == "numpyro":
        return
    elbo, opt = method.elbo(), torch.optim.Adam(model.parameters(), 1e-3)

    def step(batch):
        opt.zero_grad()
        differentiable_loss(method, elbo, model, batch, 0)[1].backward()
        opt.step()

    for b in batches[:5]:
        step(b)
    ms = []
    for b in batches[5:]:
        t = time.perf_counter()
        step(b)
        ms.append(1000 * (time.perf_counter() - t))
    median, mean = statistics.median(ms), statistics.mean(ms)
    print(f"Pyro {args.method}, hidden {args.hidden}, {args.encoder_layers}-layer encoder, batch "
          f"{args.batch_size}, dropout {args.dropout}, {torch.get_num_threads()} threads: median "
          f"{median:.1f} ms/step, mean {mean:.1f} over {len(ms)} G2P batches")


def _numpyro(model, args, batches):
    import jax

    from ppl_attention.numpyro.batching import to_jax
    from ppl_attention.numpyro.inference.evaluate import MULTIPLE, twin_of
    from ppl_attention.numpyro.inference.fit import adam_init, make_step

    jm, params = twin_of(model, training=True)
    rows = max(b.size for b in batches)
    jb = [to_jax(b, rows, MULTIPLE) for b in batches]
    step = make_step(jm, args.method, 5.0)
    opt = adam_init(params)
    key = jax.random.PRNGKey(0)
    ms, compile_s = [], 0.0
    for i, (b, j) in enumerate(zip(batches, jb)):
        before = step._cache_size()
        t = time.perf_counter()
        params, opt, loss = step(params, opt, jax.random.fold_in(key, i), j, float(b.n_tokens),
                                 1e-3, 1.0)
        jax.block_until_ready(loss)
        dt = time.perf_counter() - t
        if step._cache_size() > before:
            compile_s += dt
        elif i >= 5:
            ms.append(1000 * dt)
    shapes = len({(j.src.shape, j.tgt_out.shape) for j in jb})
    print(f"NumPyro {args.method}, hidden {args.hidden}, {args.encoder_layers}-layer encoder, "
          f"batch {args.batch_size}: median {statistics.median(ms):.1f} ms/step, mean "
          f"{statistics.mean(ms):.1f} over {len(ms)} batches; {step._cache_size()} "
          f"compilations ({shapes} padded shapes) in {compile_s:.1f} s")


if __name__ == "__main__":
    main()
