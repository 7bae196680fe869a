"""``ppl-attention wordalign`` and ``symmetrize``: word alignment of plain parallel text as
eflomal-align and fast_align do it — ``source ||| target`` lines in, Pharaoh links out — by
the Bayesian aligners of :mod:`ppl_attention.numpyro.aligners` and their samplers
(:mod:`ppl_attention.numpyro.inference.word_alignment`)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..core import jsonio
from ..core.errors import UserError
from ..core.method_specs import GLOBAL_METHODS, METHOD_OPTIONS, at_corpus, options_help
from ..data.aligner_tables import (
    ALIGNER_DEFAULTS,
    ALIGNER_KINDS,
    ALIGNERS,
    NULL_PRIOR,
    default_aligner,
    default_null_prior,
)

#: the methods ``wordalign`` runs and the options each takes, with their defaults: the one
#: method registry's (:data:`~ppl_attention.core.method_specs.GLOBAL_METHODS`, the same
#: declarations ``train --model word-hmm`` reads)
METHODS = {n: m for n, m in GLOBAL_METHODS.items() if m.serves("wordalign")}
#: every method option some wordalign method takes
OPTIONS = [k for k in METHOD_OPTIONS if any(k in m.options["wordalign"]
                                            for m in METHODS.values())]


def add_parsers(sub) -> None:
    from ..common.symmetrize import HEURISTICS

    p = sub.add_parser("wordalign", help="align plain parallel text (source ||| target), "
                       "write Pharaoh links", description=__doc__.splitlines()[0])
    p.add_argument("-i", "--input", required=True, help="parallel text, 'source ||| target' "
                   "per line (UTF-8, space-separated tokens)")
    p.add_argument("--model", choices=ALIGNERS, help="default fertility (eflomal's default, "
                   "its -m 3: the HMM's jumps times a fertility table per source word, started "
                   "from the HMM; by gibbs or vb), hmm for svb; with --load, the tables' model")
    p.add_argument("--method", default="gibbs", choices=list(METHODS),
                   help="; ".join(f"{n}: {m.description}" for n, m in METHODS.items()))
    p.add_argument("-f", "--forward", help="write the forward links (each target word to a "
                   "source word or none) here")
    p.add_argument("-r", "--reverse", help="write the reverse links (the corpus aligned the "
                   "other way, as source-target) here")
    p.add_argument("--scores", help="write each forward link's posterior probability here, "
                   "one line per pair as the Pharaoh links: i-j:p per link, null-j:p for a "
                   "target word aligned to nothing (its NULL posterior); with --gold, a "
                   "reliability table (per posterior bin, the share of links that is gold)")
    p.add_argument("--symmetrize", choices=HEURISTICS, help="also symmetrize forward and "
                   "reverse (both directions are aligned) and write them to --output")
    p.add_argument("-o", "--output", help="the symmetrized links (default: standard output)")
    p.add_argument("--gold", help="Pharaoh gold links (i-j sure, i?j possible) of the input's "
                   "first lines — all of them, or the test sentences put first in a larger "
                   "corpus: report AER, precision and recall of those lines on stderr")
    p.add_argument("--out", help="a run directory: the link posteriors, traces and report "
                   "(report.json, posterior.nc)")
    p.add_argument("--save", metavar="DIR", help="write the trained tables here (tables.npz, "
                   "meta.json and eflomal.priors: plain data), for --load")
    p.add_argument("--load", metavar="DIR", help="align the input with tables a --save wrote: "
                   "their counts become the prior (Gibbs or VB on the input only; a word they "
                   "never saw keeps --alpha; the chains start from the tables' means); the "
                   "model and its options are the tables'")
    p.add_argument("--priors", metavar="FILE", help="eflomal's priors file (eflomal-makepriors "
                   "format: LEX, HMMF, HMMR, FERF, FERR lines) as pseudo-counts of the prior; "
                   "lines the model has no use for are named on stderr")
    for flag, kind, default, text in (
            ("--alpha", float, ALIGNER_DEFAULTS["alpha"],
             "translation Dirichlet concentration per target word"),
            ("--gamma", float, ALIGNER_DEFAULTS["gamma"],
             "distortion / jump Dirichlet concentration"),
            ("--max-jump", int, ALIGNER_DEFAULTS["max_jump"],
             "jumps and displacements clipped to [-D, D]")):
        p.add_argument(flag, type=kind, help=f"{text} (default {default}; with --load, the "
                       f"tables')")
    p.add_argument("--null-prior", type=float, help=f"NULL's weight ν: a target word's NULL "
                   f"link weighs ν · θ_NULL(f) against a real link's θ_e(f) · δ(jump), the real "
                   f"buckets learned (eflomal's null_prior); 0 learns NULL's as one more bucket "
                   f"(default {NULL_PRIOR} for ibm2, hmm and fertility; ibm1 has no NULL "
                   f"bucket; with --load, the tables')")
    p.add_argument("--threshold", type=float, help="links where the posterior marginal reaches "
                   "this (default: each target word's most probable position, none if NULL)")
    for name in OPTIONS:
        o = METHOD_OPTIONS[name]
        flags = [o.flag] + (["--burn-in"] if name == "warmup" else [])  # --burn-in: its old name
        p.add_argument(*flags, dest=name, type=o.kind, metavar=o.kind.__name__.upper(),
                       help=options_help(name, "wordalign"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=1024, help="sentence pairs per batch")
    p.set_defaults(fn=cmd_wordalign)

    s = sub.add_parser("symmetrize", help="symmetrize forward and reverse Pharaoh links")
    s.add_argument("forward")
    s.add_argument("reverse")
    s.add_argument("--heuristic", default="grow-diag-final-and", choices=HEURISTICS)
    s.add_argument("-o", "--output", help="default: standard output")
    s.set_defaults(fn=cmd_symmetrize)


def _method_options(args) -> dict:
    return METHODS[args.method].resolve("wordalign", {k: getattr(args, k) for k in OPTIONS})


def _writable(path, what):
    if path is None:
        return None
    path = Path(path)
    if not path.parent.exists():
        raise UserError(f"{what} {path}: folder {path.parent} does not exist")
    if path.is_dir():
        raise UserError(f"{what} {path}: is a folder")
    return path


#: the aligner's options and their defaults, the aligner spec's (``--load``: the tables'
#: instead; ``model``: the first of :data:`~ppl_attention.data.aligner_tables.DEFAULT_ALIGNERS`
#: the method runs; ``null_prior``: :func:`~ppl_attention.data.aligner_tables.
#: default_null_prior` of the model)
SPEC_DEFAULTS = {"model": None, **ALIGNER_DEFAULTS, "null_prior": None}


def _spec(args):
    """The aligner of the resolved options (refused here if they do not fit it)."""
    from ..numpyro.aligners import aligner

    return aligner(args.model, alpha=args.alpha, gamma=args.gamma, max_jump=args.max_jump,
                   null_prior=args.null_prior)


def _resolve_tables(args) -> tuple[dict | None, int]:
    """The aligner's options (``args`` updated) and, with ``--load`` or ``--priors``, each
    direction's tables of pseudo-counts — read and checked before any work —, and the pairs
    the tables were trained on (0 without tables or for priors)."""
    from ..data.aligner_tables import load_tables, read_eflomal_priors

    if args.load and args.priors:
        raise UserError("--load and --priors: give one (both are the prior's pseudo-counts)")
    if args.load:
        saved = load_tables(args.load)
        for k in SPEC_DEFAULTS:
            given, theirs = getattr(args, k), saved.meta[k]
            if given is not None and given != theirs:
                flag = "--" + k.replace("_", "-")
                raise UserError(f"{flag} {given}: the tables in {args.load} are {flag} {theirs} "
                                f"(--load takes the model and its options from the tables)")
            setattr(args, k, theirs)
        if (args.reverse or args.symmetrize) and "reverse" not in saved.directions:
            raise UserError(f"--load {args.load}: its tables are of the forward direction only "
                            f"(saved without -r / --symmetrize), so -r / --symmetrize cannot run")
        trained = saved.meta.get("n_pairs")
        return saved.directions, trained if isinstance(trained, int) and trained > 0 else 0
    if args.model is None:
        args.model = default_aligner(args.method)
    for k, v in SPEC_DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.null_prior is None:
        args.null_prior = default_null_prior(args.model)
    _spec(args)
    if args.priors:
        tables, unused = read_eflomal_priors(args.priors, args.model, args.max_jump)
        if unused:
            print(f"[wordalign] --priors {args.priors}: not used by --model {args.model}: "
                  + ", ".join(f"{n} {k} lines" for k, n in unused.items())
                  + " (fertility priors need a fertility model; jump priors the HMM)",
                  file=sys.stderr)
        return tables, 0
    return None, 0


def check_wordalign(args):
    """Everything that can be refused before any work: the options, the tables or priors to
    load, the input (named by line), the gold, the output paths. Returns (pairs, gold or None,
    options, tables or None)."""
    from ..data.parallel import read_gold, read_parallel

    opts = _method_options(args)
    tables, trained_pairs = _resolve_tables(args)
    args.trained_pairs = trained_pairs
    if args.load and "init_sweeps" in opts and args.init_sweeps is None:
        opts["init_sweeps"] = 0  # the chains start from the tables' means, not IBM1's
    _spec(args)
    if args.method not in ALIGNER_KINDS[args.model].methods:
        raise UserError(f"--model {args.model} runs by "
                        f"{' or '.join(ALIGNER_KINDS[args.model].methods)}, not --method "
                        f"{args.method}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.threshold is not None and not 0 < args.threshold <= 1:
        raise UserError(f"--threshold must be in (0, 1], got {args.threshold}")
    if args.output and not args.symmetrize:
        raise UserError("--output writes the symmetrized links: give --symmetrize too")
    if not (args.forward or args.reverse or args.symmetrize or args.gold or args.out
            or args.scores or args.save):
        raise UserError("nothing to write: give -f, -r, --symmetrize, --scores, --gold, --out "
                        "or --save")
    written = {}
    for path, what in ((args.forward, "-f"), (args.reverse, "-r"), (args.output, "-o"),
                       (args.scores, "--scores"), (args.out, "--out"), (args.save, "--save"),
                       (args.load, "--load"), (args.priors, "--priors")):
        if path is None:
            continue
        key = Path(path).expanduser().resolve()
        if key == Path(args.input).expanduser().resolve():
            raise UserError(f"{what} {path}: is the input -i")
        if key in written:
            raise UserError(f"{what} {path}: also given to {written[key]}")
        written[key] = what
        if what in ("-f", "-r", "-o", "--scores"):
            _writable(path, what)
    for path, what in ((args.out, "--out"), (args.save, "--save")):
        if path and Path(path).exists():
            if not Path(path).is_dir():
                raise UserError(f"{what} {path}: exists and is not a folder")
            if any(Path(path).iterdir()):
                raise UserError(f"{what} {path}: exists and is not empty")
        if path and not Path(path).parent.exists():
            raise UserError(f"{what} {path}: folder {Path(path).parent} does not exist")
    pairs = read_parallel(args.input)
    gold = read_gold(args.gold, pairs, prefix=True) if args.gold else None
    # sampling lengths scaled to the evidence: this text and the text the tables hold
    opts = at_corpus(opts, len(pairs) + trained_pairs)
    return pairs, gold, opts, tables


def _gibbs(wa, spec, corpus, opts, seed, prior) -> dict:
    res = wa.run_gibbs(spec, corpus, chains=opts["chains"], warmup=opts["warmup"],
                       samples=opts["samples"], thinning=opts["thin"], seed=seed,
                       track=opts["track"], init_sweeps=opts["init_sweeps"], release_host=True,
                       prior=prior, release_compiled=True,
                       parallel_chains=opts["parallel_chains"])
    if opts["chains"] > 1:
        res["diagnostics"] = {**wa.link_rhat(res["traces"]["track"]),
                              **wa.chain_diagnostics(res["traces"]["track"],
                                                     res.pop("agreement"))}
    else:
        res["diagnostics"] = None
    return res


def _vb(wa, spec, corpus, opts, seed, prior) -> dict:
    return wa.run_vb(spec, corpus, iterations=opts["iterations"], tol=opts["tol"],
                     release_host=True, prior=prior)


def _svb(wa, spec, corpus, opts, seed, prior) -> dict:
    return wa.run_svb(spec, corpus, epochs=opts["epochs"], tau=opts["tau"],
                      kappa=opts["kappa"], seed=seed, prior=prior)


#: each registry method's runner: (word_alignment module, aligner, corpus, options, seed,
#: prior pseudo-counts or None) → result (tests/cli/test_method_registry.py checks that the
#: keys are the registry's)
RUNNERS = {"gibbs": _gibbs, "vb": _vb, "svb": _svb}


def _align(spec, method, opts, pairs, batch_size, seed, threshold, desc, scores=False,
           tables=None, save=False, consume=False):
    """One direction (``consume``: ``pairs`` is emptied once indexed, its memory given back
    while the chains run): ``tables`` (saved tables or priors, :mod:`~ppl_attention.data.
    aligner_tables`) the prior's pseudo-counts; ``save``: the posterior's tables (the
    pseudo-counts plus this text's expected counts) in ``res["tables"]``."""
    from ..data.aligner_tables import merge_tables, prior_for_corpus, tables_from_corpus
    from ..data.indexed import index_pairs
    from ..numpyro.inference import word_alignment as wa

    corpus, src_words, tgt_words = index_pairs(
        pairs, batch=batch_size, src_vocab=tables.src_words if tables else None,
        tgt_vocab=tables.tgt_words if tables else None)
    if consume:
        pairs.clear()
    print(f"[wordalign] {desc}: {corpus.n_pairs} pairs, {corpus.n_cells} word pairs "
          f"co-occurring, {len(corpus.classes)} shape classes", file=sys.stderr)
    prior = prior_for_corpus(tables, corpus) if tables else None
    res = RUNNERS[method](wa, spec, corpus, opts, seed, prior)
    if save:
        new = tables_from_corpus(corpus, src_words, tgt_words, *res["counts"])
        res["tables"] = merge_tables(tables, new) if tables else new
    if threshold is None and not scores:  # a few MiB until the sets are needed
        res["links"], res["scores"] = wa.BestLinks.of(corpus, res.pop("marginals")), None
    else:
        found = wa.links_from_marginals(corpus, res.pop("marginals"), threshold, scores)
        res["links"], res["scores"] = found if scores else (found, None)
    del corpus
    import gc

    import jax

    from ..core.allocator import return_free_memory

    jax.clear_caches()  # this direction's compiled sweeps, before the other's
    gc.collect()
    return_free_memory()
    return res  # the marginals and the corpus freed before the other direction


def cmd_wordalign(args) -> int:
    from ..core.allocator import collect_at_stage_ends, tune_allocator

    tune_allocator()  # a corpus's sweeps leave glibc's arenas fragmented otherwise
    with collect_at_stage_ends():  # each direction collects as it ends (_align)
        return _wordalign(args)


def _wordalign(args) -> int:
    from ..common.symmetrize import symmetrize_corpus
    from ..data.pharaoh import format_pharaoh, links_of_own_line, write_pharaoh
    from ..numpyro.inference.word_alignment import BestLinks

    pairs, gold, opts, tables = check_wordalign(args)
    n_pairs = len(pairs)
    spec = _spec(args)
    print(f"[wordalign] {args.model} by {args.method}: "
          + ", ".join(f"{METHOD_OPTIONS[k].flag} {v}" for k, v in opts.items()),
          file=sys.stderr)
    both = bool(args.reverse or args.symmetrize)
    tables = tables or {}
    fwd = _align(spec, args.method, opts, pairs, args.batch_size, args.seed, args.threshold,
                 "forward", scores=bool(args.scores), tables=tables.get("forward"),
                 save=bool(args.save))
    if args.scores:
        from ..data.corpus import atomic_write_text
        from ..data.pharaoh import format_scores

        atomic_write_text(args.scores, "".join(format_scores(sc) + "\n"
                                               for sc in fwd["scores"]))
    report = {"model": args.model, "method": args.method, "options": opts,
              "alpha": args.alpha, "gamma": args.gamma, "max_jump": args.max_jump,
              "null_prior": args.null_prior,
              "n_pairs": n_pairs, "forward_seconds": fwd["seconds"]}
    for flag in ("load", "priors", "save"):
        if getattr(args, flag):
            report[flag] = str(getattr(args, flag))
    # held while the other direction runs: each word's best position (a few MiB), or where a
    # threshold or scores made sets of them, Pharaoh lines (a tenth of the sets' memory)
    forward = fwd.pop("links")
    if not isinstance(forward, BestLinks):
        forward = [format_pharaoh(a) for a in forward]
    if both:
        reverse_pairs = [(t, s) for s, t in pairs]
        del pairs  # the reverse direction's list holds the words now, until it is indexed
        rev = _align(spec, args.method, opts, reverse_pairs, args.batch_size,
                     args.seed + 1, args.threshold, "reverse", tables=tables.get("reverse"),
                     save=bool(args.save), consume=True)
        report["reverse_seconds"] = rev["seconds"]
    as_sets = bool(args.symmetrize or gold is not None)  # else lines straight from the arrays
    if isinstance(forward, BestLinks):
        results = {"forward": forward.sets()} if as_sets else {}
        if args.forward:
            _write_lines(args.forward, forward.lines())
    else:
        if args.forward:  # the lines as they are, not formatted twice
            _write_lines(args.forward, forward)
        results = {"forward": [links_of_own_line(line) for line in forward]}
    del forward
    if both:
        reverse = rev.pop("links")
        if isinstance(reverse, BestLinks) and not as_sets:
            if args.reverse:
                _write_lines(args.reverse, reverse.lines(transpose=True))
        else:
            reverse = reverse.sets() if isinstance(reverse, BestLinks) else reverse
            results["reverse"] = [{(i, j) for j, i in links} for links in reverse]
        del reverse
    if args.symmetrize:
        results[args.symmetrize] = symmetrize_corpus(results["forward"], results["reverse"],
                                                     args.symmetrize)
    if args.reverse and "reverse" in results:
        write_pharaoh(args.reverse, results["reverse"])
    if args.symmetrize:
        text = "".join(format_pharaoh(a) + "\n" for a in results[args.symmetrize])
        if args.output:
            from ..data.corpus import atomic_write_text

            atomic_write_text(args.output, text)
        else:
            sys.stdout.write(text)
    for name, res in (("forward", fwd),) + ((("reverse", rev),) if both else ()):
        for k, v in (res.get("diagnostics") or {}).items():
            report[f"{name}_links_{k}"] = v
        d = res.get("diagnostics") or {}
        if d.get("mixed") is not None:
            print(f"[wordalign] {name} chains: {100 * d['share_settled']:.1f} % of the tracked "
                  f"words settled, {100 * d['share_stuck']:.1f} % stuck, "
                  f"{100 * d['share_moving']:.1f} % moving (R-hat ≤ {_rhat(d)}); "
                  f"chains' disagreement mean {d['disagreement_mean']:.3f}, max "
                  f"{d['disagreement_max']:.3f}"
                  + (f"; over all {d['words']} target words, the chains' link marginals "
                     f"{d['marginal_tv_mean']:.3f} apart on average (total variation), "
                     f"{100 * d['share_marginal_tv_over']:.1f} % over {_tv_limit()}"
                     if "words" in d else "")
                  + ("" if d["mixed"] else f" — WARNING: {d['advice']}"), file=sys.stderr)
        if res.get("elbo"):
            report[f"{name}_elbo"] = res["elbo"]
    if gold is not None:
        from ..common.metrics import alignment_scores

        report["scores"] = {name: alignment_scores(links, *gold)
                            for name, links in results.items()}
        for name, sc in report["scores"].items():
            print(f"[wordalign] {name}: AER {sc['aer']:.4f}, precision {sc['precision']:.4f}, "
                  f"recall {sc['recall']:.4f}", file=sys.stderr)
        if args.scores:
            from ..common.metrics import link_reliability

            report["reliability"] = link_reliability(fwd["scores"], *gold)
            print("[wordalign] forward link posteriors against gold (--scores):",
                  file=sys.stderr)
            for row in report["reliability"]:
                if row["links"]:
                    print(f"  p in [{row['low']:.1f}, {row['high']:.1f}): {row['links']:7d} "
                          f"links, mean posterior {row['mean_posterior']:.3f}, gold "
                          f"{row['gold_share']:.3f}", file=sys.stderr)
    fwd.pop("scores", None)
    if args.save:
        from ..data.aligner_tables import SavedTables, save_tables

        saved = {"forward": fwd.pop("tables")}
        if both:
            saved["reverse"] = rev.pop("tables")
        elif args.load and "reverse" in tables:  # not run this time: kept as loaded
            saved["reverse"] = tables["reverse"]
        meta = {k: getattr(args, k) for k in SPEC_DEFAULTS}
        meta.update(method=args.method, n_pairs=n_pairs + args.trained_pairs,
                    trained_on=str(args.input), prior=report.get("load") or report.get("priors"))
        save_tables(args.save, SavedTables(meta, saved))
        print(f"[wordalign] tables saved to {args.save} ({', '.join(saved)})", file=sys.stderr)
    if args.out:
        _save_run(Path(args.out), report, fwd, rev if both else None)
    print(jsonio.dumps({k: v for k, v in report.items() if not k.endswith("_elbo")}, indent=1),
          file=sys.stderr)
    return 0


def _write_lines(path, lines: list[str]) -> None:
    from ..data.corpus import atomic_write_text

    atomic_write_text(path, "".join(line + "\n" for line in lines))


def _tv_limit() -> float:
    from ..numpyro.inference.word_alignment import TV_LIMIT

    return TV_LIMIT


def _rhat(d: dict) -> str:
    r = d["rhat_max_moving"]
    return r if isinstance(r, str) else f"{r:.3g}"


def _save_run(out: Path, report, fwd, rev) -> None:
    """The run directory: report.json and posterior.nc (ArviZ: per direction — ``posterior``
    forward, ``posterior_reverse`` — the Gibbs traces: the corpus log-likelihood, the bucket
    weights and the tracked target words' drawn positions ``link_draw``; for VB the ELBO per
    sweep)."""
    import numpy as np

    from ..common import arviz_api
    from ..data.corpus import atomic_write_text, write_directory_atomically

    def fill(tmp: Path) -> None:
        atomic_write_text(tmp / "report.json", jsonio.dumps(report, indent=1) + "\n")
        groups = {}
        for name, res in (("forward", fwd), ("reverse", rev)):
            if res is None:
                continue
            if "traces" in res:
                t = res["traces"]
                groups[name] = {"loglik": t["loglik"], "link_draw": t["track"].astype(np.int32)}
                if t["log_dist"].shape[-1]:
                    groups[name]["buckets"] = np.exp(t["log_dist"])
            else:
                groups[name] = {"elbo": np.asarray(res["elbo"])[None]}
        first = next(iter(groups))
        idata = arviz_api.from_dict(posterior={f"{k}": v for k, v in groups[first].items()})
        for name, g in groups.items():
            if name != first:
                arviz_api.add_group(idata, f"posterior_{name}",
                                    arviz_api.from_dict(posterior=g)["posterior"])
        idata.to_netcdf(str(tmp / "posterior.nc"))

    write_directory_atomically(out, fill)


def cmd_symmetrize(args) -> int:
    from ..common.symmetrize import symmetrize_corpus
    from ..data.corpus import DataError, atomic_write_text
    from ..data.pharaoh import format_pharaoh, read_pharaoh

    fwd, rev = read_pharaoh(args.forward), read_pharaoh(args.reverse)
    if len(fwd) != len(rev):
        raise DataError(f"{args.forward}: {len(fwd)} lines but {args.reverse}: {len(rev)}")
    text = "".join(format_pharaoh(a) + "\n" for a in symmetrize_corpus(fwd, rev, args.heuristic))
    if args.output:
        atomic_write_text(_writable(args.output, "-o"), text)
    else:
        sys.stdout.write(text)
    return 0
