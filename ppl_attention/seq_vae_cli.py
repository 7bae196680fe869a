"""The sequence-VAE side of the ``ppl-attention`` command: ``train --model seq-vae``,
``evaluate`` of a seq-vae run (posterior-collapse diagnostics) and ``sample`` (prior samples,
reconstructions, interpolations).

Data: a built-in ``--task`` (its ``--side``, target by default: ``--task g2p --side source``
gives CMUdict spellings) or a ``--data-dir`` whose train/valid/test files are one-column files or
``source<TAB>target`` TSVs read on ``--side``.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch

from .data import DataError, Vocab, make_batches, read_sequences

SEQ_VAE_DEFAULTS = dict(hidden=128, latent=16)


def add_model_arguments(p) -> None:
    g = p.add_argument_group("sequence VAE (--model seq-vae)")
    g.add_argument("--model", choices=["seq2seq", "seq-vae", "bam-classifier", "gat"],
                   default="seq2seq")
    g.add_argument("--side", choices=["source", "target"], default="target",
                   help="seq-vae: which side of a pair corpus (or task) is the sequence")
    g.add_argument("--latent", type=int, default=16, help="seq-vae: dimensions of z")
    g.add_argument("--encoder", choices=["gru", "transformer"], default="gru")
    g.add_argument("--decoder", choices=["gru", "transformer"], default="gru")
    g.add_argument("--attention", choices=["none", "additive", "bilinear"], default="additive",
                   help="seq-vae: the GRU decoder's attention score")
    g.add_argument("--memory", choices=["decoder", "encoder"], default="decoder",
                   help="seq-vae: attend over the decoder's past states (a generative model) "
                   "or over the encoder states of x itself (the leaky variant)")
    g.add_argument("--z-input", choices=["init", "concat", "both"], default="both")
    g.add_argument("--family", default="soft",
                   help="seq-vae: alignment family of the decoder's attention (soft, "
                   "categorical — enumerated exactly —, dirichlet, weibull, lognormal)")
    g.add_argument("--free-bits", type=float, default=0.0, help="seq-vae: KL floor λ per dim")
    g.add_argument("--kl-anneal", choices=["none", "linear", "sigmoid"], default="none")
    g.add_argument("--anneal-steps", type=int, default=1000)
    g.add_argument("--word-dropout", type=float, default=0.0)
    g.add_argument("--max-len", type=int, default=64, help="seq-vae: longest sequence (tokens)")
    g.add_argument("--on-long", choices=["error", "truncate"], default="error",
                   help="seq-vae: a sequence longer than --max-len is an error, or truncated "
                   "with a warning")
    g.add_argument("--n-eval", type=int, help="seq-vae: score only the first N test sequences "
                   "after training (default: all)")
    g.add_argument("--prior", choices=["contextual", "constant"], default="contextual",
                   help="bam-classifier / gat: the BAM prior of the attention weights")
    g.add_argument("--kl-weight", type=float, default=1e-3,
                   help="bam-classifier / gat: η on the attention KLs (1 = the ELBO)")
    g.add_argument("--noise", type=float,
                   help="bam-classifier / gat: sd of the noise of the noisy test inputs "
                   "(default 0.3 on pixels, 1.0 on graph features)")
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--layers", type=int, default=1)


def _sequences(args, split: str, required: bool = True) -> tuple[list[list[str]], str] | None:
    """The split's sequences and where they come from (for messages)."""
    if getattr(args, "data_dir", None):
        path = Path(args.data_dir) / f"{split}.tsv"
        if not path.exists():
            if required:
                raise DataError(f"{path}: missing (a --data-dir holds train.tsv, valid.tsv, "
                                "test.tsv)")
            return None
        return read_sequences(path, args.side), str(path)
    from .cli import _task

    source = {"task": args.task, "task_seed": args.task_seed}
    if args.n_train is not None:
        source["n_train"] = args.n_train
    task = _task(**source)
    pairs = getattr(task, split).pairs
    return [s if args.side == "source" else t for s, t in pairs], f"--task {args.task} {split}"


def _limit(seqs: list[list[str]], where: str, max_len: int, on_long: str) -> list[list[str]]:
    long = [i for i, s in enumerate(seqs) if len(s) > max_len]
    if not long:
        return seqs
    if on_long == "error":
        i = long[0]
        raise DataError(f"{where}: sequence {i + 1} has {len(seqs[i])} tokens, more than "
                        f"--max-len {max_len} ({len(long)} such; --on-long truncate cuts them)")
    warnings.warn(f"{where}: {len(long)} sequence(s) longer than --max-len {max_len} truncated",
                  stacklevel=2)
    return [s[:max_len] for s in seqs]


def _batches(seqs, vocab, batch_size, shuffle=False, seed=0):
    return make_batches([(s, s) for s in seqs], vocab, vocab, batch_size, shuffle=shuffle,
                        seed=seed)


def train_seq_vae(args, seed: int, out: Path, progress: bool = True):
    from .inference import Run, fit
    from .models import AttentionSeqVAE

    if getattr(args, "backend", "pyro") != "pyro":
        raise ValueError("--model seq-vae trains with the Pyro backend")
    splits = {}
    for split in ("train", "valid", "test"):
        got = _sequences(args, split, required=split != "valid")
        splits[split] = None if got is None else _limit(*got, args.max_len, args.on_long)
    vocab = Vocab.build(splits["train"])
    torch.manual_seed(seed)
    model = AttentionSeqVAE(len(vocab), hidden=args.hidden, latent=args.latent,
                            embed=args.embed, encoder=args.encoder, decoder=args.decoder,
                            attention=args.attention, memory=args.memory, z_input=args.z_input,
                            family=args.family, heads=args.heads, layers=args.layers,
                            word_dropout=args.word_dropout, free_bits=args.free_bits,
                            max_len=args.max_len)
    source = ({"data_dir": str(Path(args.data_dir).resolve())} if args.data_dir else
              {"task": args.task, "task_seed": args.task_seed,
               **({"n_train": args.n_train} if args.n_train is not None else {})})
    source["side"] = args.side
    resume = None
    if getattr(args, "resume", False) and ((out / "COMPLETE").exists()
                                           or (out / "PARTIAL").exists()):
        resume = Run.load(out, which="last", partial=True)
    valid = splits["valid"] or splits["test"]
    run = fit(model if resume is None else resume.model,
              _batches(splits["train"], vocab, args.batch_size, True, seed), "seq-vae",
              args.steps, seed, src_vocab=vocab, tgt_vocab=vocab,
              valid=_batches(valid, vocab, 64), lr=args.lr, valid_every=args.valid_every,
              resume=resume, progress=progress, out=out, lr_schedule=args.lr_schedule,
              checkpoint_every=getattr(args, "checkpoint_every", None),
              config={"data": source, "batch_size": args.batch_size,
                      "kl_anneal": args.kl_anneal, "anneal_steps": args.anneal_steps,
                      "on_long": args.on_long})
    last = {k: v.clone() for k, v in run.model.state_dict().items()}
    run.model.load_state_dict(run.extra.get("best_model", last))
    n_eval = getattr(args, "n_eval", None)
    if n_eval is not None and n_eval < 2:
        raise ValueError(f"--n-eval must be at least 2, got {n_eval}")
    report = evaluate_seq_vae(run, splits["test"][:n_eval])
    report["ms_per_step"] = run.extra["ms_per_step"]
    run.extra["test_report"] = report
    run.model.load_state_dict(last)
    run.save(out)
    return run, report


def evaluate_seq_vae(run, seqs: list[list[str]], iwae_k: int = 100, seed: int = 0) -> dict:
    from .analysis.latent import latent_diagnostics

    seqs = _limit(seqs, "evaluation data", run.model.config["max_len"],
                  run.config.get("on_long", "error"))
    batches = _batches(seqs, run.src_vocab, 64)
    report = latent_diagnostics(run.model, batches, iwae_k=iwae_k, seed=seed)
    report["n_unk"] = sum(b.n_unk for b in batches)
    return report


def eval_sequences(run, args) -> list[list[str]]:
    """The sequences ``evaluate`` scores: ``--data`` (one column or a TSV on the run's side),
    ``--data-dir``'s test file, or the test split of the run's own data."""
    side = run.config.get("data", {}).get("side", "target")
    if getattr(args, "data", None):
        return read_sequences(args.data, side)
    if getattr(args, "data_dir", None):
        return read_sequences(Path(args.data_dir) / "test.tsv", side)
    src = run.config.get("data", {})
    if "data_dir" in src and (Path(src["data_dir"]) / "test.tsv").exists():
        return read_sequences(Path(src["data_dir"]) / "test.tsv", side)
    if "task" not in src:
        raise DataError("give --data FILE or --data-dir DIR (the run's training data has no "
                        "test.tsv)")
    from .cli import _task

    task = _task(**{k: v for k, v in src.items() if k != "side"})
    return [s if side == "source" else t for s, t in task.test.pairs]


def cmd_sample(args) -> int:
    """Prior samples, reconstructions of test sequences (z = μ(x)), and interpolations between
    two test sequences' μ, greedy decoding."""
    from .inference import Run

    run = Run.load(args.run)
    if run.method != "seq-vae":
        raise ValueError(f"{args.run}: a {run.method} run; `sample` needs a --model seq-vae run")
    model, v = run.model, run.src_vocab
    if not model.generative:
        raise ValueError(f"{args.run}: memory='encoder' reads x itself: no prior samples")
    if args.n < 1 or args.steps < 2:
        raise ValueError("--n must be ≥ 1 and --steps ≥ 2")
    g = torch.Generator().manual_seed(args.seed)
    sep = "" if args.join else " "
    forbid = (v.pad, v.bos, v.unk)

    def show(ids):
        return sep.join(v.decode(ids))

    z = torch.randn((args.n, model.latent), generator=g)
    print("# prior samples (z ~ N(0, I), greedy)")
    for ids in model.generate(z, v.bos, v.eos, forbid=forbid):
        print(show(ids))
    seqs = eval_sequences(run, args)[: max(2, args.n)]
    batches = _batches(seqs, v, len(seqs))
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


def print_report(report: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report))
        return
    for k, val in report.items():
        if k == "kl_per_dim":
            val = " ".join(f"{x:.3f}" for x in val)
        print(f"{k:>20}: {val:.4f}" if isinstance(val, float) else f"{k:>20}: {val}",
              file=sys.stdout)
