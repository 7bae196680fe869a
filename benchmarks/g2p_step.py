"""ms per training step of one method on real CMUdict G2P batches (loss, gradient, Adam), for
the ppl_attention that Python imports — to compare two commits, run it under each:

    python benchmarks/g2p_step.py [--method hmm-exact --hidden 384 --encoder-layers 3]
    PYTHONPATH=/path/to/other/checkout python benchmarks/g2p_step.py

Prints the median and mean over the timed batches; quote ratios between runs made one after
the other on the same machine, not absolute times.
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
    args = ap.parse_args(argv)
    task = make_task("g2p")
    sv = Vocab.build(s for s, _ in task.train.pairs)
    tv = Vocab.build(t for _, t in task.train.pairs)
    batches = make_batches(task.train.pairs, sv, tv, args.batch_size, shuffle=True)
    batches = batches[: 5 + args.batches]
    method = get_method(args.method)
    torch.manual_seed(0)
    model = Seq2SeqAlignment(len(sv), len(tv), hidden=args.hidden, dropout=0.3,
                             family=method.family(args.hidden),
                             encoder_layers=args.encoder_layers)
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
    print(f"{args.method}, hidden {args.hidden}, {args.encoder_layers}-layer encoder, batch "
          f"{args.batch_size}, {torch.get_num_threads()} threads: median {median:.1f} ms/step, "
          f"mean {mean:.1f} over {len(ms)} G2P batches")


if __name__ == "__main__":
    main()
