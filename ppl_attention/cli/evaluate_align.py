"""``ppl-attention evaluate | align | decode``: a run directory scored, aligned, decoded."""

from __future__ import annotations

import sys
from pathlib import Path

from ..common.contract import declared, require
from ..common.devices import jax_default_device, torch_device
from ..common.registry import load_model_class
from ..common.runs import Run
from ..core import jsonio
from ..core.errors import UserError
from ..core.method_specs import is_global_method
from ..data import DataError, make_batches
from ..data.batching import array_kind
from ..data.kinds import data_kind
from ..data.pharaoh import format_pharaoh
from ..tools.experiment import report
from .options import add_backend, add_device, add_posterior, posterior_options


def get_backend_checked(name: str, run):
    """The backend ``name``, having refused a run it cannot evaluate (a NumPyro model's run
    under pyro; a Pyro model without a NumPyro twin under numpyro)."""
    from ..common.backends import check_pyro_model, get_backend

    if name == "pyro":
        check_pyro_model(type(run.model))
    ops = get_backend(name)
    ops.check_run(run)
    return ops


def add_eval_data(p) -> None:
    """What a run is evaluated on: --data-dir (its test split), --data F [--gold F.align], or
    neither (the test split of the run's own data)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--data-dir", help="a folder with test.tsv (+ test.align)")
    g.add_argument("--data", help="a TSV file (or, for a sequence model, one sequence a line)")
    p.add_argument("--gold", help="Pharaoh alignments for --data")


def add_run_model(p) -> None:
    add_device(p)
    p.add_argument("--model", help="the run's model class, where config.json's record no longer "
                   "finds it: path/to/file.py:ClassName or package.module:ClassName")


def load_run(path, args, which: str = "best") -> Run:
    """The run directory ``path`` on ``--device``: a Pyro model moved there; for NumPyro work
    (a NumPyro model's run, or ``--backend numpyro``) the device made JAX's default for the
    rest of the command."""
    cls = load_model_class(args.model) if getattr(args, "model", None) else None
    spec = getattr(args, "device", "cpu")
    run = Run.load(path, which=which, model_class=cls)
    if run.backend == "pyro":
        run.model.to(torch_device(spec))
    if (run.backend == "numpyro" or getattr(args, "backend", None) == "numpyro") \
            and hasattr(args, "context"):
        if not getattr(args, "_on_jax_device", False):
            args.context.enter_context(jax_default_device(spec))
            args._on_jax_device = True
    return run


def eval_split(run: Run, args):
    kind = data_kind(declared(run.model, "data"))
    return kind.evaluation_split(run.config.get("data", {}), getattr(args, "data", None),
                                 getattr(args, "gold", None), getattr(args, "data_dir", None))


def add_parsers(sub) -> None:
    p = sub.add_parser("evaluate", help="NLL/token (exact where defined), ELBO, AER; a model's "
                       "own report (seq-vae diagnostics, classifier accuracy and calibration)")
    p.add_argument("run")
    add_eval_data(p)
    p.add_argument("--iwae-k", type=int, help="importance samples of the IWAE bound where the "
                   "NLL is not exact (default 10; a seq-vae's diagnostics: 100)")
    p.add_argument("--beam", type=int, default=1, help="beam for WER/PER (G2P runs)")
    p.add_argument("--ensemble", nargs="+", metavar="RUN", default=[],
                   help="G2P: more runs (same training data) decoding with RUN as an ensemble "
                   "for WER/PER; the other numbers stay RUN's")
    p.add_argument("--samples", type=int,
                   help="posterior draws for ECE / PAvPU (image and graph models; default 20)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of every Monte Carlo estimate (the IWAE bound, a sampled ELBO, "
                   "importance draws): the same seed gives the same figures (default 0)")
    add_posterior(p)
    add_backend(p)
    add_run_model(p)
    p.set_defaults(fn=cmd_evaluate)

    p = sub.add_parser("align", help="MAP alignments in Pharaoh format to stdout (a tree "
                                     "family: each source's MAP tree in CoNLL-U)")
    p.add_argument("run")
    p.add_argument("--data", help="a TSV file of pairs (bags: an .npz file); default: the test "
                   "split of the run's own data")
    add_posterior(p)
    p.add_argument("--khat", metavar="FILE", help="with --posterior importance: write each "
                   "pair's k̂ to FILE, one a line (nan where not estimated)")
    add_backend(p)
    add_run_model(p)
    p.set_defaults(fn=cmd_align)

    p = sub.add_parser("decode", help="greedy / beam-search hypotheses, source<TAB>hypothesis")
    p.add_argument("run", nargs="+", help="a run directory, or several (same training data) "
                   "decoding as an ensemble: the mean of their predictive distributions")
    p.add_argument("--data", required=True, help="one source a line (a plain word for g2p runs)")
    p.add_argument("--beam", type=int, default=1)
    add_backend(p, "the decoder")
    add_run_model(p)
    p.set_defaults(fn=cmd_decode)


ENSEMBLE_NEEDS_G2P = ("--ensemble decodes for WER/PER, which only G2P runs report "
                      "(a run trained with --task g2p)")


def cmd_evaluate(args) -> int:
    if args.beam < 1:
        raise UserError(f"--beam must be at least 1, got {args.beam}")
    if args.iwae_k is not None and args.iwae_k < 1:
        raise UserError(f"--iwae-k must be at least 1, got {args.iwae_k}")
    importance = posterior_options(args)
    run = load_run(args.run, args)
    get_backend_checked(args.backend or run.backend, run)
    if importance:
        from ..common.importance_weights import check_importance

        check_importance(run, importance["samples"])
    split = eval_split(run, args)
    has_refs = bool(getattr(split, "references", None))
    if (args.ensemble or args.beam != 1) and not has_refs:
        raise UserError(ENSEMBLE_NEEDS_G2P if args.ensemble else
                        "--beam sets the beam of G2P decoding (WER/PER); this run's data has no "
                        "reference pronunciations")
    ensemble = [load_run(r, args) for r in args.ensemble]
    if ensemble:
        from ..pyro.inference.decode import check_ensemble

        check_ensemble([run, *ensemble])
    rep = report(run, split, run.config.get("data", {}), backend=args.backend or run.backend,
                 iwae_k=args.iwae_k, samples=args.samples, beam=args.beam, ensemble=ensemble,
                 importance=importance, seed=args.seed)
    if rep.get("n_unk"):
        print(f"note: {rep['n_unk']} token(s) unseen in training were mapped to <unk>",
              file=sys.stderr)
    if importance and rep["khat_unreliable"]:
        from ..common.importance_weights import unreliable_note

        print(unreliable_note([f"pair {i}" for i in rep["khat_unreliable"]], rep["n_pairs"],
                              importance["threshold"],
                              numbering="pairs counted from 0, as khat_unreliable in the "
                              "report"), file=sys.stderr)
    print_report(rep, args.json)
    return 0


def print_report(rep: dict, as_json: bool) -> None:
    if as_json:
        print(jsonio.dumps(rep))
        return
    for k, v in rep.items():
        if isinstance(v, list):
            v = " ".join(f"{x:.3f}" if isinstance(x, float) else str(x) for x in v)
        print(f"{k:>20}: {v:.4f}" if isinstance(v, float) else f"{k:>20}: {v}")


def cmd_align(args) -> int:
    importance = posterior_options(args)
    if args.khat and not importance:
        raise UserError("--khat writes the k̂ of --posterior importance; give that too")
    run = load_run(args.run, args)
    require(run.model, "alignment", tool="align")
    kind = data_kind(declared(run.model, "data"))
    pairs = kind.evaluation_split(run.config.get("data", {}), args.data).pairs
    batches = make_batches(pairs, run.src_vocab, run.tgt_vocab, 64,
                           array=array_kind(run.model))
    n_unk = sum(b.n_unk for b in batches)
    if n_unk:
        print(f"note: {args.data}: {n_unk} token(s) unseen in training were mapped to <unk>",
              file=sys.stderr)
    backend = args.backend or run.backend
    if is_global_method(run.method):
        from ..numpyro.inference.bayes import global_alignment_links as links_fn
    elif backend == "numpyro":
        from ..common.backends import get_backend

        ops = get_backend("numpyro")
        ops.check_run(run)
        links_fn = ops.alignment_links
    else:
        from ..pyro.inference.evaluate import alignment_links as links_fn

        get_backend_checked("pyro", run)
    tree = getattr(run.model.family, "tree", False)
    if importance:
        return _align_importance(run, backend, pairs, batches, importance, args.khat, tree)
    if tree:  # the source's MAP tree, in CoNLL-U
        from ..common.backends import get_backend
        from ..data.conllu import format_conllu

        trees = get_backend(backend).map_trees_by_index(run, batches)
        sys.stdout.write("".join(format_conllu(pairs[i][0], trees[i], i + 1)
                                 for i in range(len(pairs))))
        return 0
    links = links_fn(run, batches)
    sys.stdout.write("".join(format_pharaoh(links[i]) + "\n" for i in range(len(pairs))))
    return 0


def _align_importance(run, backend, pairs, batches, importance, khat_file, tree) -> int:
    """``align --posterior importance``: the corrected posterior's MAP (links, or the best tree
    under its arc marginals), k̂ per pair to ``khat_file`` and a warning naming the unreliable
    ones."""
    from ..common.backends import get_backend
    from ..common.importance_weights import check_importance, corrected_alignments, unreliable_note
    from ..data.conllu import format_conllu

    ops = get_backend(backend)
    ops.check_run(run)
    k = importance["samples"]
    check_importance(run, k, max((b.size, b.tgt_out.shape[1], b.src.shape[1]) for b in batches))
    tree_map = None
    if tree:
        import numpy as np

        from ..core.heads import chu_liu_edmonds

        fam = run.model.family

        def tree_map(marginals, lengths):  # the tree of most expected correct arcs
            if fam.projective:
                import torch

                from ..pyro.trees import DependencyTree

                best = DependencyTree(torch.as_tensor(marginals), torch.as_tensor(lengths),
                                      single_root=fam.single_root).argmax()
                return [best[r, :L].tolist() for r, L in enumerate(lengths)]
            return [chu_liu_edmonds(np.asarray(m), L, single_root=fam.single_root)[:L].tolist()
                    for m, L in zip(marginals, lengths)]
    res = corrected_alignments(lambda b, kk, seed: ops.importance_arrays(run, b, kk, seed),
                               batches, k, tree_map=tree_map)
    if tree:
        sys.stdout.write("".join(format_conllu(pairs[i][0], res["trees"][i], i + 1)
                                 for i in range(len(pairs))))
    else:
        sys.stdout.write("".join(format_pharaoh(res["links"][i]) + "\n"
                                 for i in range(len(pairs))))
    khat = [res["khat"][i] for i in range(len(pairs))]
    if khat_file:
        from ..data.corpus import atomic_write_text

        atomic_write_text(Path(khat_file), "".join(f"{v:.4f}\n" for v in khat))
    note = unreliable_note([f"line {i + 1}" for i, v in enumerate(khat)
                            if v > importance["threshold"]], len(pairs), importance["threshold"],
                           numbering="lines of --data counted from 1, as the lines of --khat")
    if note:
        print(note, file=sys.stderr)
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
    from ..common.decoding import beam_search, check_ensemble

    if args.beam < 1:
        raise UserError(f"--beam must be at least 1, got {args.beam}")
    runs = [load_run(r, args) for r in args.run]
    for r in runs:
        get_backend_checked(args.backend or r.backend, r)
    runs = check_ensemble(runs, args.backend)
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
        hyp, _ = beam_search(runs, tokens, beam=args.beam, backend=args.backend)
        sys.stdout.write(f"{line}\t{' '.join(hyp)}\n")
    return 1 if failed else 0
