"""ms/step of every method on Seq2SeqAlignment, and the ratio of Pyro's `exact` step
(TraceEnum_ELBO) to a hand-written plain-torch log-softmax/logsumexp step of the same network;
`hmm-exact` (the chain summed out inside MonotonicAlignment) also against the hand-written
forward algorithm of its own family (`exact_token_log_likelihood` of the Markov model) and
against the formulation it replaced, T sequential enumerated sites under pyro.markov
(`markov_model_enumerated`, row "hmm-exact (enumerated sites)"), in the same run.

    python benchmarks/seq2seq_methods.py [--batch 64 --src 20 --tgt 20 --vocab 1000 --hidden 256]

Prints a table of medians measured in one run; quote the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyro
import torch

from ppl_attention.data.batching import Batch
from ppl_attention.pyro.inference.methods import METHODS, get_method, loss_and_grads
from ppl_attention.pyro.models import Seq2SeqAlignment


def synthetic_batch(B, S, T, V, seed=0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (B, S), generator=g)
    tgt = torch.randint(4, V, (B, T + 1), generator=g)
    ones = torch.ones(B, S, dtype=torch.bool)
    return Batch(src, ones, tgt[:, :-1], tgt[:, 1:], torch.ones(B, T, dtype=torch.bool),
                 torch.arange(B))


def median_ms(fn, reps, warmup=1):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - t))
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--src", type=int, default=20)
    ap.add_argument("--tgt", type=int, default=20)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--methods", default=",".join(METHODS))
    args = ap.parse_args(argv)
    batch = synthetic_batch(args.batch, args.src, args.tgt, args.vocab)

    def build(method):
        torch.manual_seed(0)
        return Seq2SeqAlignment(args.vocab, args.vocab, hidden=args.hidden,
                                family=get_method(method).family(args.hidden))

    def hand_written(reference):
        def step():
            reference.zero_grad()
            (-reference.exact_token_log_likelihood(batch).sum()).backward()
        return step

    base = median_ms(hand_written(build("exact")), args.reps)
    methods = args.methods.split(",")
    forward = median_ms(hand_written(build("hmm-exact")), args.reps) \
        if "hmm-exact" in methods else None
    print(f"batch {args.batch}, source {args.src}, target {args.tgt}, vocab {args.vocab}, "
          f"hidden {args.hidden}; torch {torch.__version__}, pyro {pyro.__version__}, "
          f"{torch.get_num_threads()} threads; medians of {args.reps}")
    print(f"{'method':<30}{'ms/step':>10}{'× hand-written exact':>24}"
          f"{'× hand-written forward':>26}")
    print(f"{'hand-written torch':<30}{base:>10.1f}{1.0:>24.2f}")
    if forward is not None:
        print(f"{'hand-written fwd':<30}{forward:>10.1f}{forward / base:>24.2f}{1.0:>26.2f}")
    for name in methods:
        m = get_method(name)
        model = build(name)
        elbo = m.elbo()
        pyro.clear_param_store()
        step = [0]

        def one(m=m, elbo=elbo, model=model, step=step):
            model.zero_grad()
            loss_and_grads(m, elbo, model, batch, step[0], m.kl_scale(step[0]))
            step[0] += 1

        ms = median_ms(one, args.reps)
        own = f"{ms / forward:>26.2f}" if name == "hmm-exact" else ""
        print(f"{name:<30}{ms:>10.1f}{ms / base:>24.2f}{own}")
        if name == "hmm-exact":
            old = _enumerated_sites_step(model, batch)
            ms_old = median_ms(old, args.reps)
            print(f"{'hmm-exact (enumerated sites)':<30}{ms_old:>10.1f}{ms_old / base:>24.2f}"
                  f"{ms_old / forward:>26.2f}")
            print(f"{'enumerated sites / chain':<28}{ms_old / ms:>10.2f}")


def _enumerated_sites_step(model, batch):
    """A training step of the formulation MonotonicAlignment replaced: T sequential enumerated
    sites under pyro.markov, TraceEnum_ELBO's forward algorithm site by site."""
    from pyro.infer import TraceEnum_ELBO

    elbo = TraceEnum_ELBO(max_plate_nesting=2)

    def step():
        model.zero_grad()
        elbo.differentiable_loss(lambda b: model.markov_model_enumerated(b, enumerate_z=True),
                                 lambda b: None, batch).backward()
    return step


if __name__ == "__main__":
    main()
