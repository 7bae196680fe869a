"""ms per training step of one method on real CMUdict G2P batches (loss, gradient, Adam), for
the ppl_attention that Python imports — to compare two commits, run it under each:

    python benchmarks/g2p_step.py [--method hmm-exact --hidden 384 --encoder-layers 3]
    PYTHONPATH=/path/to/other/checkout python benchmarks/g2p_step.py
    python benchmarks/g2p_step.py --backend both --dropout 0    # Pyro against NumPyro

Prints the median and mean over the timed batches; for NumPyro (the jitted SVI step of
``ppl_attention.numpyro.inference.fit`` on batches padded to its bucket lengths) also how many
shapes it compiled and the seconds that took (in a warm-up pass over every batch, not timed).
``--backend both`` times the two backends batch by batch, interleaved, and prints the ratio.
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
from ppl_attention.pyro.inference.methods import differentiable_loss, get_method
from ppl_attention.pyro.models.seq2seq import Seq2SeqAlignment


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
    steps = {}
    if args.backend in ("numpyro", "both"):
        steps["NumPyro"] = _numpyro_step(model, args, batches)
    if args.backend in ("pyro", "both"):  # after the twin copied the initial weights
        steps["Pyro"] = _pyro_step(model, method)
    for name, step in steps.items():  # warm-up; NumPyro compiles every padded shape here
        for i, b in enumerate(batches):
            if name == "Pyro" and i >= 5:
                break
            step(i, b)
    ms = {name: [] for name in steps}
    for i, b in enumerate(batches[5:], start=5):  # interleaved: drift hits both alike
        for name, step in steps.items():
            t = time.perf_counter()
            step(i, b)
            ms[name].append(1000 * (time.perf_counter() - t))
    desc = (f"{args.method}, hidden {args.hidden}, {args.encoder_layers}-layer encoder, batch "
            f"{args.batch_size}, {len(batches) - 5} G2P batches")
    for name, times in ms.items():
        extra = (f"; dropout {args.dropout}, {torch.get_num_threads()} threads" if name == "Pyro"
                 else f"; {steps[name].compilations()} compilations in "
                      f"{steps[name].compile_s:.1f} s (warm-up, not timed)")
        print(f"{name} {desc}: median {statistics.median(times):.1f} ms/step, mean "
              f"{statistics.mean(times):.1f}{extra}")
    if len(ms) == 2:
        ratios = [n / p for n, p in zip(ms["NumPyro"], ms["Pyro"])]
        print(f"NumPyro / Pyro, batch by batch: median {statistics.median(ratios):.2f}, "
              f"ratio of means {statistics.mean(ms['NumPyro']) / statistics.mean(ms['Pyro']):.2f}")


def _pyro_step(model, method):
    elbo, opt = method.elbo(), torch.optim.Adam(model.parameters(), 1e-3)

    def step(i, batch):
        opt.zero_grad()
        differentiable_loss(method, elbo, model, batch, 0)[1].backward()
        opt.step()
    return step


def _numpyro_step(model, args, batches):
    """The jitted SVI step of ``ppl_attention.numpyro.inference.fit`` on batches padded to its
    bucket lengths; ``step.compile_s`` adds up the calls that compiled."""
    import jax

    from ppl_attention.numpyro.inference.evaluate import MULTIPLE
    from ppl_attention.numpyro.inference.fit import make_step
    from ppl_attention.numpyro.inference.twins import twin_of
    from ppl_attention.numpyro.jax_batches import to_jax

    jm, params = twin_of(model, training=True)
    rows = max(b.size for b in batches)
    jb = [to_jax(b, rows, MULTIPLE) for b in batches]
    fn = make_step(jm, args.method, 5.0)
    state = {"params": params, "opt": fn.init(params)}
    key = jax.random.PRNGKey(0)

    def step(i, batch):
        before = fn._cache_size()
        t = time.perf_counter()
        state["params"], state["opt"], loss = fn(state["params"], state["opt"],
                                                 jax.random.fold_in(key, i), jb[i],
                                                 float(batch.n_tokens), 1e-3, 1.0)
        jax.block_until_ready(loss)
        if fn._cache_size() > before:
            step.compile_s += time.perf_counter() - t
    step.compile_s = 0.0
    step.compilations = fn._cache_size
    return step


if __name__ == "__main__":
    main()
