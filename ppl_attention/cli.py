"""The ``ppl-attention`` command: train | evaluate | align | decode | analyze | diagnose |
sample | compare | sweep (``sweep_cli``).

Bad input (a malformed TSV or Pharaoh file, an unknown method, a missing run) ends with one
``error: …`` line naming the file, line and field, and exit status 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import sys
from pathlib import Path

import torch

from . import bam_cli
from .data import DataError, Vocab, make_batches, make_task, read_pharaoh, read_tsv
from .data.corpus import atomic_write_text
from .data.pharaoh import format_pharaoh
from .data.tasks import Split
from .inference import METHODS, Run, evaluate, fit, get_method
from .inference.distributed import Distributed
from .inference.evaluate import alignment_links
from .models import Seq2SeqAlignment
from .seq_vae_cli import (
    add_model_arguments,
    cmd_sample,
    eval_sequences,
    evaluate_seq_vae,
    print_report,
    train_seq_vae,
)
from .sweep import mean_sd  # noqa: F401  (re-exported for the benchmarks)
from .sweep_cli import cmd_sweep


def _load_split(data_dir: Path, name: str, required: bool = True) -> Split | None:
    tsv = data_dir / f"{name}.tsv"
    if not tsv.exists():
        if required:
            raise DataError(f"{tsv}: missing (a --data-dir holds train.tsv, valid.tsv, test.tsv)")
        return None
    pairs = read_tsv(tsv)
    align = data_dir / f"{name}.align"
    gold = read_pharaoh(align, pairs) if align.exists() else None
    return Split(pairs, gold)


def _data(args) -> tuple[dict, dict[str, Split | None]]:
    """The data source recorded in the run's config and its splits."""
    if getattr(args, "data_dir", None):
        if args.n_train is not None:
            raise ValueError("--n-train sets the size of a built-in --task, not of a --data-dir")
        d = Path(args.data_dir)
        splits = {s: _load_split(d, s, s != "valid") for s in ("train", "valid", "test")}
        record = getattr(args, "data_dir_record", None) or str(d.resolve())
        return {"data_dir": record}, splits
    source = {"task": args.task, "task_seed": args.task_seed}
    if args.n_train is not None:
        source["n_train"] = args.n_train
    if getattr(args, "stress", False):
        if args.task != "g2p":
            raise ValueError("--stress applies to --task g2p only")
        source["stress"] = True
    task = _task(**source)
    return source, {"train": task.train, "valid": task.valid, "test": task.test}


@functools.lru_cache(maxsize=2)
def _task(task: str, task_seed: int = 0, n_train: int | None = None, stress: bool = False):
    """A built-in task, made once per process (``compare`` trains many runs on it)."""
    if n_train is not None and n_train < 1:
        raise ValueError(f"--n-train must be at least 1, got {n_train}")
    kwargs = {} if n_train is None else {"n_train": n_train}
    if stress:
        kwargs["stress"] = True
    return make_task(task, seed=task_seed, **kwargs)


def _eval_split(run: Run, args) -> Split:
    if args.data:
        pairs = read_tsv(args.data)
        gold = read_pharaoh(args.gold, pairs) if args.gold else None
        return Split(pairs, gold)
    if args.data_dir:
        return _load_split(Path(args.data_dir), "test")
    src = run.config.get("data", {})
    if "task" in src:
        return _task(**src).test
    if "data_dir" in src and (Path(src["data_dir"]) / "test.tsv").is_file():
        return _load_split(Path(src["data_dir"]), "test")  # the corpus the run was trained on
    raise DataError("give --data FILE.tsv or --data-dir DIR (this run was not trained on a task, "
                    "and the corpus it was trained on has no test.tsv here)")


def train_one(args, method: str, seed: int, out: Path, progress: bool = True) -> tuple[Run, dict]:
    m = get_method(method)
    source, splits = _data(args)
    train = splits["train"]
    src_vocab = Vocab.build(s for s, _ in train.pairs)
    tgt_vocab = Vocab.build(t for _, t in train.pairs)
    torch.manual_seed(seed)
    if args.backend == "numpyro" and args.dropout:
        raise ValueError("--dropout: the NumPyro backend trains without dropout; use the Pyro "
                         "backend or --dropout 0")
    model = Seq2SeqAlignment(len(src_vocab), len(tgt_vocab), hidden=args.hidden,
                             embed=args.embed, score=args.score, family=m.family(args.hidden),
                             q_prior=args.q_prior, dropout=args.dropout,
                             encoder_layers=getattr(args, "encoder_layers", 1))
    batches = make_batches(train.pairs, src_vocab, tgt_vocab, args.batch_size, shuffle=True,
                           seed=seed)
    valid = splits["valid"] or splits["test"]
    valid_b = make_batches(valid.pairs, src_vocab, tgt_vocab, 64)
    resume = None
    if getattr(args, "resume", False) and ((out / "COMPLETE").exists()
                                           or (out / "PARTIAL").exists()):
        resume = Run.load(out, which="last", partial=True)
    devices = getattr(args, "devices", 1)
    extra = {}
    distributed = Distributed.from_env()
    if distributed is not None:  # a torchrun launch: checks before joining the process group
        if args.backend != "pyro" or devices != 1:
            raise ValueError("torchrun launches Pyro data parallelism; NumPyro shards batches "
                             "over JAX devices in one process (--backend numpyro --devices N)")
        distributed.check_batches(batches)
        distributed.start()
        extra["distributed"] = distributed
    if args.backend == "numpyro":
        from .numpyro.inference import fit as fit_fn
        from .numpyro.inference import get_method as numpyro_method
        from .numpyro.inference.fit import data_parallel

        numpyro_method(method)  # refuses methods NumPyro cannot run, before any work
        if devices != 1:
            data_parallel(devices, max(b.size for b in batches))  # refuses before any work
            extra["devices"] = devices
    else:
        if devices != 1:
            raise ValueError("--devices shards batches over JAX devices: use --backend numpyro "
                             "(Pyro data parallelism is torchrun + DistributedDataParallel)")
        fit_fn = fit
    run = fit_fn(model if resume is None else resume.model, batches, method, args.steps, seed,
              src_vocab=src_vocab, tgt_vocab=tgt_vocab, valid=valid_b, lr=args.lr,
              valid_every=args.valid_every, resume=resume, progress=progress,
              lr_schedule=args.lr_schedule,
              **({"checkpoint_every": args.checkpoint_every, "out": out}
                 if getattr(args, "checkpoint_every", None) else {}),
              config={"data": source, "batch_size": args.batch_size}, **extra)
    if distributed is not None and not distributed.main:
        return run, None  # rank 0 evaluates and writes the run directory
    test = splits["test"]
    last = copy.deepcopy(run.model.state_dict())
    run.model.load_state_dict(run.extra.get("best_model", last))
    report = evaluate(run, make_batches(test.pairs, src_vocab, tgt_vocab, 64, gold=test.gold),
                      gold=test.gold, log_likelihood=test.log_likelihood, backend=args.backend,
                      references=getattr(test, "references", None))
    report["ms_per_step"] = run.extra["ms_per_step"]
    run.extra["test_report"] = report
    run.model.load_state_dict(last)  # the checkpoint keeps the last weights for --resume
    run.save(out)
    return run, report


def cmd_train(args) -> int:
    distributed = Distributed.from_env()
    if distributed is not None and args.model != "seq2seq":
        raise ValueError(f"torchrun data parallelism trains --model seq2seq, not {args.model}")
    if args.model != "seq2seq" and args.encoder_layers != 1:
        raise ValueError(f"--encoder-layers stacks the BiLSTM encoder of --model seq2seq; "
                         f"--model {args.model} does not use it (the sequence VAE's Transformer "
                         f"takes --layers)")
    if args.model in bam_cli.MODELS:
        if args.noise is None:
            args.noise = 0.3 if args.task == "digits" else 1.0
        report = bam_cli.train(args, Path(args.out))
        print(json.dumps(report))
        print(f"wrote run directory {args.out}", file=sys.stderr)
        return 0
    if args.task in ("digits", "sbm", "karate"):
        raise ValueError(f"--task {args.task} is for --model bam-classifier / gat")
    if args.model == "seq-vae":
        _, report = train_seq_vae(args, args.seed, Path(args.out))
        print_report(report, as_json=True)
        print(f"wrote run directory {args.out}", file=sys.stderr)
        return 0
    try:
        _, report = train_one(args, args.method, args.seed, Path(args.out))
    finally:
        if distributed is not None:
            distributed.stop()
    if report is not None:  # rank 0 of a torchrun launch, or a one-process run
        print(json.dumps(report, indent=1))
        print(f"wrote run directory {args.out}", file=sys.stderr)
    return 0


ENSEMBLE_NEEDS_G2P = ("--ensemble decodes for WER/PER, which only G2P runs report "
                      "(a run trained with --task g2p)")


def cmd_evaluate(args) -> int:
    if args.ensemble and (bam_cli.is_bam_run(args.run) or Run.load(args.run).method == "seq-vae"):
        raise ValueError(ENSEMBLE_NEEDS_G2P)
    if bam_cli.is_bam_run(args.run):
        print_report(bam_cli.evaluate_run(args.run, samples=args.samples), args.json)
        return 0
    run = Run.load(args.run)
    if run.method == "seq-vae":
        report = evaluate_seq_vae(run, eval_sequences(run, args), iwae_k=args.iwae_k or 100)
        print_report(report, args.json)
        return 0
    args.iwae_k = args.iwae_k or 10
    split = _eval_split(run, args)
    ensemble = [Run.load(r) for r in args.ensemble]
    if ensemble:
        from .inference.decode import check_ensemble

        if not getattr(split, "references", None):
            raise ValueError(ENSEMBLE_NEEDS_G2P)
        check_ensemble([run, *ensemble])
    batches = make_batches(split.pairs, run.src_vocab, run.tgt_vocab, 64, gold=split.gold)
    report = evaluate(run, batches, gold=split.gold, log_likelihood=split.log_likelihood,
                      iwae_k=args.iwae_k, backend=args.backend,
                      references=getattr(split, "references", None), beam=args.beam,
                      ensemble=ensemble)
    if report["n_unk"]:
        print(f"note: {report['n_unk']} token(s) unseen in training were mapped to <unk>",
              file=sys.stderr)
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:>20}: {v:.4f}" if isinstance(v, float) else f"{k:>20}: {v}")
    return 0


def _read_sources(path: Path, plain_words: bool) -> list[tuple[int, str, list[str] | None]]:
    """(line number, the line as given, its tokens or None when it cannot be decoded)."""
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.strip()
        tokens = (list(text) if plain_words else text.split()) if text else None
        out.append((n, line, tokens))
    return out


def cmd_decode(args) -> int:
    from .inference.decode import beam_search, check_ensemble

    if args.beam < 1:
        raise ValueError(f"--beam must be at least 1, got {args.beam}")
    runs = check_ensemble([Run.load(r) for r in args.run])
    run = runs[0]
    plain = run.config.get("data", {}).get("task") == "g2p"
    failed = 0
    for n, line, tokens in _read_sources(Path(args.data), plain):
        if tokens is None:
            print(f"error: {args.data}:{n}: empty line, nothing to decode", file=sys.stderr)
            failed += 1
            sys.stdout.write(f"{line}\t\n")
            continue
        unk = run.src_vocab.encode(tokens)[1]
        if unk:
            print(f"note: {args.data}:{n}: {unk} token(s) unseen in training decoded as <unk>",
                  file=sys.stderr)
        hyp, _ = beam_search(runs, tokens, beam=args.beam)
        sys.stdout.write(f"{line}\t{' '.join(hyp)}\n")
    return 1 if failed else 0


def cmd_align(args) -> int:
    run = Run.load(args.run)
    pairs = read_tsv(args.data)
    batches = make_batches(pairs, run.src_vocab, run.tgt_vocab, 64)
    if args.backend == "numpyro":
        from .numpyro.inference import alignment_links as links_fn
    else:
        links_fn = alignment_links
    links = links_fn(run, batches)
    sys.stdout.write("".join(format_pharaoh(links[i]) + "\n" for i in range(len(pairs))))
    return 0


def _analysis_split(run: Run, args) -> Split:
    split = _eval_split(run, args)
    n_unk = n_tok = 0
    for pair in split.pairs:
        for side, vocab in ((pair[0], run.src_vocab), (pair[1], run.tgt_vocab)):
            n_tok += len(side)
            n_unk += vocab.encode(list(side))[1]
    if n_tok and n_unk / n_tok > 0.5:
        where = args.data or args.data_dir or "the data"
        raise DataError(f"{where}: {n_unk} of {n_tok} tokens are not in the run's vocabulary — "
                        f"this data does not fit the run {args.run}")
    if n_unk:
        print(f"note: {n_unk} token(s) unseen in training were mapped to <unk>", file=sys.stderr)
    return split


def cmd_analyze(args) -> int:
    import os
    import tempfile

    from .analysis import guide_diagnostics, plot_entropy, plot_pair_heatmaps, to_inference_data

    if args.num_samples <= 0:
        raise ValueError(f"--num-samples must be at least 1, got {args.num_samples}")
    run = Run.load(args.run)
    split = _analysis_split(run, args)
    if not 0 <= args.pair < len(split.pairs):
        raise ValueError(f"--pair {args.pair} is out of range: the data has {len(split.pairs)} "
                         f"pairs")
    idata = to_inference_data(run, split.pairs, num_samples=args.num_samples, seed=args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".posterior.nc.tmp-")
    os.close(fd)
    try:
        idata.to_netcdf(tmp)
        os.replace(tmp, out / "posterior.nc")
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    written = [out / "posterior.nc"]
    plot_pair_heatmaps(idata, args.pair, out / f"pair{args.pair}_heatmaps.png")
    plot_entropy(idata, out / "entropy.png")
    written += [out / f"pair{args.pair}_heatmaps.png", out / "entropy.png"]
    if split.gold is not None and run.model.family.name != "soft" and args.num_samples >= 2:
        diag = guide_diagnostics(run, split.pairs, split.gold, num_samples=args.num_samples,
                                 seed=args.seed)
        atomic_write_text(out / "diagnostics.json", json.dumps(diag, indent=1) + "\n")
        written.append(out / "diagnostics.json")
    for w in written:
        print(f"wrote {w}")
    return 0


DIAG_COLUMNS = [("kl_exact_q", "KL(exact ‖ q)/token"), ("expected_aer", "E_q[AER]"),
                ("khat_share", "share k̂ > 0.7"), ("khat_pairs", "pairs with k̂"),
                ("rel_ess", "ESS/K"), ("iwae_gap", "log p − IWAE"),
                ("elbo_gap", "log p − ELBO")]


def cmd_diagnose(args) -> int:
    from .analysis import guide_diagnostics

    if args.num_samples < 2:
        raise ValueError(f"--num-samples must be at least 2, got {args.num_samples}")
    rows = []
    for path in args.runs:
        run = Run.load(path)
        args.run = path
        split = _analysis_split(run, args)
        if split.gold is None:
            raise DataError(f"{path}: diagnostics need gold alignments (--gold, a --data-dir "
                            f"with test.align, or a built-in task)")
        print(f"[diagnose] {path}", file=sys.stderr)
        rows.append(guide_diagnostics(run, split.pairs, split.gold,
                                      num_samples=args.num_samples, seed=args.seed))
    md = [f"Guide diagnostics, {args.num_samples} draws of q per pair; per token; log p exact "
          f"where enumerable, else IWAE-{args.num_samples} (then the last column is "
          f"IWAE − ELBO); k̂ only for pairs whose draws give ≥ 20 distinct weights.", "",
          "| method | " + " | ".join(h for _, h in DIAG_COLUMNS) + " |",
          "|---|" + "---|" * len(DIAG_COLUMNS)]
    for r in rows:
        cells = ["—" if r[k] is None else str(r[k]) if isinstance(r[k], int) else f"{r[k]:.3f}"
                 for k, _ in DIAG_COLUMNS]
        if not r["log_lik_exact"]:  # log p is itself IWAE-K there: only log p − ELBO is news
            cells[5] = "—"
        md.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    print("\n".join(md))
    if args.out:
        atomic_write_text(Path(args.out), "\n".join(md) + "\n")
        atomic_write_text(Path(args.out).with_suffix(".json"), json.dumps(rows, indent=1) + "\n")
    return 0


def _add_data_source(p, required=True):
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--task", choices=["copy", "reverse", "reorder", "g2p", "digits", "sbm",
                                      "karate"],
                   help="built-in task (g2p: CMUdict letters → phones; digits: sklearn's 8×8 "
                   "digits for --model bam-classifier; sbm, karate: graphs for --model gat)")
    g.add_argument("--data-dir", help="folder with train.tsv, valid.tsv, test.tsv (+ *.align)")
    p.add_argument("--task-seed", type=int, default=0, help="seed of the task generator")
    p.add_argument("--n-train", type=int, help="training pairs of a built-in task (default: the "
                   "task's own; valid and test sets do not depend on it)")
    p.add_argument("--stress", action="store_true", help="g2p: keep stress digits on vowels")


def _add_backend(p):
    p.add_argument("--backend", choices=["pyro", "numpyro"], default="pyro",
                   help="run the model under Pyro (torch) or its NumPyro twin (jax.jit); run "
                   "directories are the same for both")


def _add_eval_data(p):
    """What a run is evaluated on: --data-dir (its test split), --data F.tsv [--gold F.align],
    or neither (a built-in task's test split)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--data-dir", help="a folder with test.tsv (+ test.align)")
    g.add_argument("--data", help="a TSV file")
    p.add_argument("--gold", help="Pharaoh alignments for --data")


def _add_training(p):
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--embed", type=int, help="embedding size (default: --hidden)")
    p.add_argument("--encoder-layers", type=int, default=1,
                   help="seq2seq: stacked BiLSTM layers of the source encoder")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="dropout on embeddings and the output layer's input (Pyro backend)")
    p.add_argument("--score", default="additive")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--q-prior", action=argparse.BooleanOptionalAction, default=True,
                   help="add the prior's logits to the inference network's (default; "
                   "--no-q-prior gives var-attn's plain q)")
    p.add_argument("--lr", type=float, default=1e-2, help="peak Adam learning rate")
    p.add_argument("--lr-schedule", choices=["cosine", "constant"], default="cosine")
    p.add_argument("--valid-every", type=int, default=250)
    p.add_argument("--devices", type=int, default=1,
                   help="numpyro: data-parallel SVI, each batch sharded over N JAX devices")
    _add_backend(p)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ppl-attention", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train one method, write a run directory")
    _add_data_source(p)
    _add_training(p)
    p.add_argument("--method", default="exact", help=f"one of {', '.join(METHODS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="run directory to write")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--checkpoint-every", type=int,
                   help="save a resumable PARTIAL run directory every N steps")
    add_model_arguments(p)
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser("evaluate", help="NLL/token (exact where defined), ELBO, AER")
    p.add_argument("run")
    _add_eval_data(p)
    p.add_argument("--iwae-k", type=int, help="importance samples (default 10; 100 for a "
                   "seq-vae run)")
    p.add_argument("--beam", type=int, default=1, help="beam for WER/PER (G2P runs)")
    p.add_argument("--ensemble", nargs="+", metavar="RUN", default=[],
                   help="G2P: more runs (same training data) decoding with RUN as an ensemble "
                   "for WER/PER; the other numbers stay RUN's")
    p.add_argument("--samples", type=int, default=20,
                   help="posterior draws for ECE / PAvPU (bam-classifier and gat runs)")
    p.add_argument("--json", action="store_true")
    _add_backend(p)
    p.set_defaults(fn=cmd_evaluate)

    p = sub.add_parser("align", help="MAP alignments in Pharaoh format to stdout")
    p.add_argument("run")
    p.add_argument("--data", required=True)
    _add_backend(p)
    p.set_defaults(fn=cmd_align)

    p = sub.add_parser("decode", help="greedy / beam-search hypotheses, source<TAB>hypothesis")
    p.add_argument("run", nargs="+", help="a run directory, or several (same training data) "
                   "decoding as an ensemble: the mean of their predictive distributions")
    p.add_argument("--data", required=True, help="one source a line (a plain word for g2p runs)")
    p.add_argument("--beam", type=int, default=1)
    p.set_defaults(fn=cmd_decode)

    p = sub.add_parser("analyze", help="posterior.nc (ArviZ) and figures of a run's alignments")
    p.add_argument("run")
    _add_eval_data(p)
    p.add_argument("--out", required=True)
    p.add_argument("--num-samples", type=int, default=100)
    p.add_argument("--pair", type=int, default=0, help="the pair drawn as heatmaps")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=cmd_analyze)

    p = sub.add_parser("diagnose", help="guide-vs-exact diagnostics table of several runs")
    p.add_argument("runs", nargs="+")
    _add_eval_data(p)
    p.add_argument("--num-samples", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the table (.md) and the numbers (.json) here")
    p.set_defaults(fn=cmd_diagnose)

    p = sub.add_parser("sample", help="a seq-vae run: prior samples, reconstructions, "
                       "interpolations")
    p.add_argument("run")
    p.add_argument("--data", help="sequences to reconstruct (default: the run's test split)")
    p.add_argument("--data-dir", help="a folder with test.tsv")
    p.add_argument("--n", type=int, default=5, help="prior samples and reconstructions")
    p.add_argument("--steps", type=int, default=5, help="points on the interpolation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--join", action="store_true", help="print tokens without spaces")
    p.set_defaults(fn=cmd_sample)

    for name, text in (("compare", "train several methods × seeds, tabulate and plot"),
                       ("sweep", "methods × seeds × --set settings, in this process, worker "
                        "processes or on Ray; resumable")):
        p = sub.add_parser(name, help=text)
        _add_data_source(p)
        _add_training(p)
        p.add_argument("--methods", default=",".join(METHODS))
        p.add_argument("--seeds", type=int, default=1)
        p.add_argument("--set", action="extend", nargs="+", metavar="KEY=V1,V2",
                       help="sweep training options over values, e.g. "
                       "--set hidden=32,64 lr=1e-2,3e-3 (or --set given several times)")
        p.add_argument("--jobs", type=int, default=1,
                       help="runs trained at once, in worker processes (default 1: in this "
                       "process)")
        p.add_argument("--ray", metavar="ADDRESS|local",
                       help="run every job as a Ray task: on a running cluster (HOST:PORT, "
                       "ray://HOST:PORT, auto) or a local one started for the sweep (local)")
        p.add_argument("--cpus-per-job", type=int, default=1,
                       help="with --ray: CPUs (and torch threads) each job asks for")
        p.add_argument("--out", required=True,
                       help="sweep directory: results.*, figures, runs/<job>/; rerunning into "
                       "it skips the jobs already complete")
        p.set_defaults(fn=cmd_sweep)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "gold", None) and not getattr(args, "data", None):
        print("error: --gold goes with --data", file=sys.stderr)
        return 2
    try:
        return args.fn(args)
    except (DataError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
