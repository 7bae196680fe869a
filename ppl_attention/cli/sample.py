"""``ppl-attention sample``: a generative sequence model's prior samples, reconstructions and
interpolations (a model with ``generate(z, bos, eos)`` and ``encode(batch)``, such as
``--model seq-vae``)."""

from __future__ import annotations

from ..core.errors import UserError
from ..data import make_batches
from .evaluate_align import add_run_model, eval_split, load_run


def add_parser(sub) -> None:
    p = sub.add_parser("sample", help="a sequence VAE run: prior samples, reconstructions, "
                       "interpolations")
    p.add_argument("run")
    p.add_argument("--data", help="sequences to reconstruct (default: the run's test split)")
    p.add_argument("--data-dir", help="a folder with test.tsv")
    p.add_argument("--n", type=int, default=5, help="prior samples and reconstructions")
    p.add_argument("--steps", type=int, default=5, help="points on the interpolation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--join", action="store_true", help="print tokens without spaces")
    add_run_model(p)
    p.set_defaults(fn=cmd_sample)


def cmd_sample(args) -> int:
    """Prior samples, reconstructions of test sequences (z = μ(x)), and interpolations between
    two test sequences' μ, greedy decoding."""
    import torch

    if args.n < 1 or args.steps < 2:
        raise UserError("--n must be ≥ 1 and --steps ≥ 2")
    run = load_run(args.run, args)
    model, v = run.model, run.src_vocab
    if not callable(getattr(model, "generate", None)) or not hasattr(model, "latent"):
        raise UserError(f"{args.run}: a {type(model).__name__} run; `sample` needs a generative "
                        f"sequence model with a global latent (e.g. --model seq-vae)")
    if not model.generative:
        raise UserError(f"{args.run}: memory='encoder' reads x itself: no prior samples")
    args.gold = None
    seqs = eval_split(run, args)[0][: max(2, args.n)]
    g = torch.Generator().manual_seed(args.seed)
    sep = "" if args.join else " "
    forbid = (v.pad, v.bos, v.unk)

    def show(ids):
        return sep.join(v.decode(ids))

    z = torch.randn((args.n, model.latent), generator=g)
    print("# prior samples (z ~ N(0, I), greedy)")
    for ids in model.generate(z, v.bos, v.eos, forbid=forbid):
        print(show(ids))
    batches = make_batches([(s, s) for s in seqs], v, v, len(seqs))
    with torch.no_grad():
        _, mu, _ = model.encode(batches[0])
    order = batches[0].index.tolist()
    print("\n# reconstructions (z = μ(x), greedy): input → output")
    for row, i in enumerate(order):
        out = model.generate(mu[row:row + 1], v.bos, v.eos, forbid=forbid)[0]
        print(f"{sep.join(seqs[i])}\t{show(out)}")
    a, b = mu[order.index(0)], mu[order.index(1)]
    print(f"\n# interpolation between {sep.join(seqs[0])!r} and {sep.join(seqs[1])!r}")
    for k in range(args.steps):
        w = k / (args.steps - 1)
        out = model.generate(((1 - w) * a + w * b).unsqueeze(0), v.bos, v.eos, forbid=forbid)[0]
        print(f"{w:.2f}\t{show(out)}")
    return 0
