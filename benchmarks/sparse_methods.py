"""ms/step of the sparse and relaxed methods against the methods they replace, on
Seq2SeqAlignment (Pyro), in one run.

(1) ``sparse-marginal`` (q = sparsemax of the inference network's scores, its support
enumerated: the widest row's count of non-zeros, K, positions per step) against ``vae-enum``
(every one of the S positions enumerated) at source lengths ``--sources`` (8, 32, 128 by
default; random sources, each target a copy of its source's first ``--tgt`` tokens), with the
mean support of q on the batch (positions with q > 0 per target token) and K — once freshly
initialized (q near uniform: the support nearly full) and once after ``--train`` Adam steps
on the batch (both models trained alike; q, which reads the target, peaks and its support
shrinks, as a trained q's does: ``compare``'s *mean support* column).

(2) each relaxed tree method (``tree-perturbed``, ``tree-st``, ``tree-imle``) and
``tree-sparsemap`` against ``tree-sample`` (the score function), source length ``--tree-src``.

    python benchmarks/sparse_methods.py [--batch 32 --tgt 20 --hidden 64 --reps 5 --train 100]

Medians of ``--reps`` steps after one warm-up; quote the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyro
import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seq2seq_methods import median_ms, synthetic_batch  # noqa: E402

from ppl_attention.data.batching import Batch  # noqa: E402
from ppl_attention.pyro.inference.methods import get_method, loss_and_grads, programs  # noqa
from ppl_attention.pyro.models import Seq2SeqAlignment  # noqa: E402


def _build(method, vocab, hidden):
    torch.manual_seed(0)
    return Seq2SeqAlignment(vocab, vocab, hidden=hidden,
                            family=get_method(method).family(hidden))


def _step_ms(method, batch, args, train: int = 0):
    """(median ms of one step, the model) — after ``train`` Adam steps on the batch."""
    m = get_method(method)
    model, elbo = _build(method, args.vocab, args.hidden), m.elbo()
    pyro.clear_param_store()
    step = [0]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for i in range(train):
        opt.zero_grad()
        loss_and_grads(m, elbo, model, batch, i, m.kl_scale(i))
        opt.step()

    def one():
        model.zero_grad()
        loss_and_grads(m, elbo, model, batch, step[0], m.kl_scale(step[0]))
        step[0] += 1
    return median_ms(one, args.reps), model


def _copy_batch(B, S, T, V) -> Batch:
    """Random sources, each target a copy of its source's first T tokens: an alignment a q
    that reads the target can find (token t on position t)."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, V, (B, S), generator=g)
    T = min(T, S)
    bos = torch.full((B, 1), 2, dtype=torch.long)
    return Batch(src, torch.ones(B, S, dtype=torch.bool), torch.cat([bos, src[:, :T - 1]], 1),
                 src[:, :T], torch.ones(B, T, dtype=torch.bool), torch.arange(B))


def _support(model, batch):
    """(mean positions with q > 0 per target token, the enumerated K) of the guide's site."""
    m = get_method("sparse-marginal")
    _, q = programs(m, model, batch, kl=1.0)
    with torch.no_grad():
        trace = poutine.trace(q).get_trace(batch)
    site = next(s for s in trace.nodes.values() if s["type"] == "sample"
                and not s["is_observed"] and not site_is_subsample(s))
    fn = site["fn"]
    while not hasattr(fn, "enumerate_support") or hasattr(fn, "base_dist"):
        fn = fn.base_dist
    probs = fn.probs
    positive = (probs > 0).sum(-1).float()
    mask = batch.tgt_mask.reshape(positive.shape[-2:]) if positive.dim() >= 2 else None
    mean = positive[..., mask].mean() if mask is not None else positive.mean()
    return float(mean), int(positive.max())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tgt", type=int, default=20)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sources", type=lambda s: [int(x) for x in s.split(",")],
                    default=[8, 32, 128])
    ap.add_argument("--tree-src", type=int, default=12)
    ap.add_argument("--train", type=int, default=100,
                    help="Adam steps on the batch before the second timing (a peaked q)")
    args = ap.parse_args(argv)
    print(f"batch {args.batch}, target {args.tgt}, vocab {args.vocab}, hidden {args.hidden}; "
          f"torch {torch.__version__}, pyro {pyro.__version__}, {torch.get_num_threads()} "
          f"threads; medians of {args.reps} steps\n")
    print("| S | q | vae-enum ms | sparse-marginal ms | sparse / enum | mean support | K |")
    print("|---|---|---|---|---|---|---|")
    for S in args.sources:
        batch = _copy_batch(args.batch, S, args.tgt, args.vocab)
        for train, what in ((0, "at initialization"), (args.train, f"after {args.train} steps")):
            if train == 0 or args.train > 0:
                enum_ms, _ = _step_ms("vae-enum", batch, args, train)
                sparse_ms, model = _step_ms("sparse-marginal", batch, args, train)
                mean, K = _support(model, batch)
                print(f"| {S} | {what} | {enum_ms:.1f} | {sparse_ms:.1f} | "
                      f"{sparse_ms / enum_ms:.2f} | {mean:.2f} | {K} |", flush=True)
    batch = synthetic_batch(args.batch, args.tree_src, args.tgt, args.vocab)
    base, _ = _step_ms("tree-sample", batch, args)
    print(f"\nsource {args.tree_src}\n\n| method | ms/step | × tree-sample |\n|---|---|---|")
    print(f"| tree-sample | {base:.1f} | 1.00 |")
    for method in ("tree-perturbed", "tree-st", "tree-imle", "tree-sparsemap"):
        ms, _ = _step_ms(method, batch, args)
        print(f"| {method} | {ms:.1f} | {ms / base:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
