"""``ppl-attention analyze | diagnose``: posteriors over alignments in ArviZ, guides against the
exact posterior."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from ..common.contract import require
from ..core import jsonio
from ..core.errors import DataError, UserError
from ..core.files import make_readable
from ..core.method_specs import is_global_method
from ..data.corpus import atomic_write_text
from .evaluate_align import add_eval_data, add_run_model, eval_split, load_run
from .options import add_posterior, posterior_options


def add_parsers(sub) -> None:
    p = sub.add_parser("analyze", help="posterior.nc (ArviZ) and figures of a run's alignments")
    p.add_argument("run")
    add_eval_data(p)
    p.add_argument("--out", required=True)
    p.add_argument("--num-samples", type=int, default=100)
    p.add_argument("--pair", type=int, default=0, help="the pair drawn as heatmaps")
    p.add_argument("--seed", type=int, default=0)
    add_posterior(p)
    add_run_model(p)
    p.set_defaults(fn=cmd_analyze)

    p = sub.add_parser("calibrate", help="simulation-based calibration of a run's guide (and "
                       "exact posterior): rank uniformity, coverage, gold coverage")
    p.add_argument("run")
    add_eval_data(p)
    p.add_argument("--num-sims", type=int, default=200,
                   help="targets simulated from the run's model (default 200)")
    p.add_argument("--draws", type=int, default=99,
                   help="alignments drawn from the guide per target (default 99)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="where calibration.{json,md,png} go (default: the run "
                   "directory)")
    add_posterior(p)
    add_run_model(p)
    p.set_defaults(fn=cmd_calibrate)

    p = sub.add_parser("diagnose", help="guide-vs-exact diagnostics table of several runs")
    p.add_argument("runs", nargs="+")
    add_eval_data(p)
    p.add_argument("--num-samples", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the table (.md) and the numbers (.json) here")
    add_run_model(p)
    p.set_defaults(fn=cmd_diagnose)


def _analysis_split(run, args, path):
    require(run.model, "alignment", tool=args.command)
    split = eval_split(run, args)
    n_unk = n_tok = 0
    for pair in split.pairs if run.src_vocab is not None else ():  # bags have no vocabulary
        for side, vocab in ((pair[0], run.src_vocab), (pair[1], run.tgt_vocab)):
            n_tok += len(side)
            n_unk += vocab.encode(list(side))[1]
    if n_tok and n_unk / n_tok > 0.5:
        where = args.data or args.data_dir or "the data"
        raise DataError(f"{where}: {n_unk} of {n_tok} tokens are not in the run's vocabulary — "
                        f"this data does not fit the run {path}")
    if n_unk:
        print(f"note: {n_unk} token(s) unseen in training were mapped to <unk>", file=sys.stderr)
    return split


def is_wordalign_run(path) -> bool:
    """Is ``path`` a ``wordalign --out`` directory (its report and posterior, no model)?"""
    path = Path(path)
    return (path / "report.json").is_file() and (path / "posterior.nc").is_file() \
        and not (path / "config.json").exists()


def _analyze_wordalign(args, importance) -> int:
    """``analyze`` of a ``wordalign --out`` directory: per direction, the discrete chains'
    diagnostics of its tracked links (:func:`~ppl_attention.numpyro.inference.word_alignment.
    chain_diagnostics`) and ArviZ's R-hat / ESS of the corpus log-likelihood; written to
    ``--out`` as ``wordalign_diagnostics.json`` and ``trace.png``. Options for a model's run
    are refused."""
    import numpy as np

    from ..common import arviz_api
    from ..core.jsonio import dumps
    from ..data.corpus import atomic_write_text
    from ..numpyro.inference.word_alignment import chain_diagnostics

    for flag, given in (("--num-samples", args.num_samples != 100), ("--pair", args.pair != 0),
                        ("--posterior importance", bool(importance)),
                        ("--data", getattr(args, "data", None) is not None),
                        ("--data-dir", getattr(args, "data_dir", None) is not None),
                        ("--gold", getattr(args, "gold", None) is not None),
                        ("--model", getattr(args, "model", None) is not None)):
        if given:
            raise UserError(f"{flag} does not apply to a wordalign run directory ({args.run}: "
                            f"its chains are analysed as they were drawn)")
    report = _read_json(Path(args.run) / "report.json")
    if report.get("method") != "gibbs":
        raise UserError(f"{args.run}: a wordalign run by {report.get('method')!r} has no "
                        f"chains to analyse (only gibbs keeps its draws)")
    try:
        idata = arviz_api.from_netcdf(str(Path(args.run) / "posterior.nc"))
    except Exception as e:  # a damaged or foreign file: name it
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise UserError(f"{args.run}/posterior.nc: not a readable netCDF posterior ({first})") \
            from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {}
    for group, name in (("posterior", "forward"), ("posterior_reverse", "reverse")):
        if not arviz_api.has_group(idata, group):
            continue
        post = idata[group]
        if "link_draw" not in post or "loglik" not in post:
            raise UserError(f"{args.run}/posterior.nc: group {group} has no link_draw / loglik "
                            f"(not written by wordalign --method gibbs)")
        track = np.asarray(post["link_draw"].values)
        track = track.reshape(track.shape[0], track.shape[1], -1)
        d = chain_diagnostics(track)
        loglik = arviz_api.from_dict(posterior={"loglik": np.asarray(post["loglik"].values)})
        if track.shape[0] > 1:
            s = arviz_api.summary(loglik, kind="diagnostics")
            d["loglik_rhat"] = float(s["r_hat"].iloc[0])
            d["loglik_ess_bulk"] = float(s["ess_bulk"].iloc[0])
        result[name] = d
        print(f"{name}: {track.shape[0]} chains × {track.shape[1]} draws, {track.shape[2]} "
              f"tracked words — settled {d.get('share_settled', float('nan')):.3f}, stuck "
              f"{d.get('share_stuck', float('nan')):.3f}, moving "
              f"{d.get('share_moving', float('nan')):.3f}; log-likelihood R-hat "
              f"{d.get('loglik_rhat', float('nan')):.3f}"
              + ("" if d["mixed"] is not False else f" — NOT MIXED: {d['advice']}"),
              file=sys.stderr)
        if name == "forward":
            arviz_api.save_trace_plot(loglik, out / "trace.png")
    atomic_write_text(out / "wordalign_diagnostics.json", dumps(result, indent=1) + "\n")
    print(f"wrote {out / 'wordalign_diagnostics.json'}\nwrote {out / 'trace.png'}")
    return 0


def _read_json(path: Path) -> dict:
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a readable report ({e})") from None


def cmd_analyze(args) -> int:
    from ..analysis import guide_diagnostics, plot_entropy, plot_pair_heatmaps, to_inference_data

    if args.num_samples <= 0:
        raise UserError(f"--num-samples must be at least 1, got {args.num_samples}")
    importance = posterior_options(args)
    if is_wordalign_run(args.run):
        return _analyze_wordalign(args, importance)
    run = load_run(args.run, args)
    if importance:
        from ..common.importance_weights import check_importance

        if is_global_method(run.method):
            raise UserError(f"--posterior importance: {run.method} infers global latents (its "
                            f"posterior draws are MCMC's or an autoguide's)")
        check_importance(run, importance["samples"])
    split = _analysis_split(run, args, args.run)
    if not 0 <= args.pair < len(split.pairs):
        raise UserError(f"--pair {args.pair} is out of range: the data has {len(split.pairs)} "
                        f"pairs")
    fam = run.model.family
    global_run = is_global_method(run.method)
    diagnose = (split.gold is not None and not fam.deterministic and not fam.markov
                and args.num_samples >= 2 and not global_run)
    if global_run:  # the globals' posterior draws, the alignment summed out
        from ..data.batching import make_batches
        from ..numpyro.inference.bayes import global_inference_data

        idata = global_inference_data(run, make_batches(split.pairs, run.src_vocab,
                                                        run.tgt_vocab, 64, array="numpy"),
                                      args.pair)
    else:
        idata = to_inference_data(run, split.pairs, num_samples=args.num_samples,
                                  seed=args.seed, importance=importance)
        if importance:
            from ..common.importance_weights import unreliable_note

            khat = idata["importance"]["khat"].values
            note = unreliable_note([f"pair {i}" for i, v in enumerate(khat)
                                    if v > importance["threshold"]], len(khat),
                                   importance["threshold"],
                                   numbering="pairs counted from 0, the coordinate 'pair'")
            if note:
                print(note, file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".posterior.nc.tmp-")
    os.close(fd)
    try:
        idata.to_netcdf(tmp)
        make_readable(tmp)
        os.replace(tmp, out / "posterior.nc")
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    written = [out / "posterior.nc"]
    if global_run:
        from ..common import arviz_api

        arviz_api.save_trace_plot(idata, out / "trace.png")
        written.append(out / "trace.png")
        if "link" in idata.posterior and idata.posterior.sizes["chain"] > 1:
            summary = arviz_api.summary(idata, var_names=["link"], kind="diagnostics")
            summary.to_csv(out / "link_diagnostics.csv")
            written.append(out / "link_diagnostics.csv")
            print(f"pair {args.pair}'s link marginals: max R-hat {summary['r_hat'].max():.3f}, "
                  f"min bulk ESS {summary['ess_bulk'].min():.0f} over {len(summary)} links",
                  file=sys.stderr)
    else:
        plot_pair_heatmaps(idata, args.pair, out / f"pair{args.pair}_heatmaps.png")
        plot_entropy(idata, out / "entropy.png")
        written += [out / f"pair{args.pair}_heatmaps.png", out / "entropy.png"]
    if diagnose:
        diag = guide_diagnostics(run, split.pairs, split.gold, num_samples=args.num_samples,
                                 seed=args.seed, gold_trees=getattr(split, "trees", None))
        atomic_write_text(out / "diagnostics.json", jsonio.dumps(diag, indent=1) + "\n")
        written.append(out / "diagnostics.json")
    for w in written:
        print(f"wrote {w}")
    return 0


def cmd_calibrate(args) -> int:
    from ..analysis.sbc import calibrate, uncalibratable, write_report

    importance = posterior_options(args)
    run = load_run(args.run, args)
    reason = uncalibratable(run)
    if reason:
        raise UserError(f"{args.run}: calibrate: {reason}")
    if importance:
        from ..common.importance_weights import check_importance

        check_importance(run, importance["samples"])
    split = _analysis_split(run, args, args.run)
    result = calibrate(run, split.pairs, split.gold, num_sims=args.num_sims, draws=args.draws,
                       seed=args.seed, importance=importance)
    for path in write_report(result, Path(args.out or args.run)):
        print(f"wrote {path}", file=sys.stderr)
    print((Path(args.out or args.run) / "calibration.md").read_text(), end="")
    return 0


DIAG_COLUMNS = [("kl_exact_q", "KL(exact ‖ q)/token"), ("expected_aer", "E_q[AER]"),
                ("expected_uas", "E_q[UAS]"),
                ("khat_share", "share k̂ > 0.7"), ("khat_pairs", "pairs with k̂"),
                ("rel_ess", "ESS/K"), ("iwae_gap", "log p − IWAE"),
                ("elbo_gap", "log p − ELBO")]


def cmd_diagnose(args) -> int:
    from ..analysis import guide_diagnostics

    if args.num_samples < 2:
        raise UserError(f"--num-samples must be at least 2, got {args.num_samples}")
    if args.out:  # checked, and its folder made, before any work (as analyze and calibrate do)
        out = Path(args.out)
        if out.is_dir():
            raise UserError(f"--out {out}: is a folder; give the table's file name")
        out.parent.mkdir(parents=True, exist_ok=True)
    runs, left_out = [], []
    for path in args.runs:  # every run and its data checked before any work
        run = load_run(path, args)
        split = _analysis_split(run, args, path)
        if run.model.family.deterministic or run.model.family.markov \
                or is_global_method(run.method):
            left_out.append(f"{path}: {run.method} has no alignment guide to diagnose")
            continue
        runs.append((path, run, split))
    for why in left_out:
        print(f"[diagnose] left out {why}", file=sys.stderr)
    if not runs:
        raise UserError("diagnostics compare an alignment guide with the exact posterior; none "
                        "of the runs has one (" + "; ".join(left_out) + ")")
    rows = []
    for path, run, split in runs:
        print(f"[diagnose] {path}", file=sys.stderr)
        rows.append(guide_diagnostics(run, split.pairs, split.gold,
                                      num_samples=args.num_samples, seed=args.seed,
                                      gold_trees=getattr(split, "trees", None)))
    md = [f"Guide diagnostics, {args.num_samples} draws of q per pair; per token; log p exact "
          f"where enumerable, else IWAE-{args.num_samples} (then the last column is "
          f"IWAE − ELBO); k̂ only for pairs whose draws give ≥ 20 distinct weights.", "",
          "| method | " + " | ".join(h for _, h in DIAG_COLUMNS) + " |",
          "|---|" + "---|" * len(DIAG_COLUMNS)]
    for r in rows:
        cells = ["—" if r[k] is None else str(r[k]) if isinstance(r[k], int) else f"{r[k]:.3f}"
                 for k, _ in DIAG_COLUMNS]
        if not r["log_lik_exact"]:  # log p is itself IWAE-K there: only log p − ELBO is news
            cells[6] = "—"
        md.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    md += ["", *(f"Left out: {why}." for why in left_out)] if left_out else []
    print("\n".join(md))
    if args.out:
        atomic_write_text(Path(args.out), "\n".join(md) + "\n")
        atomic_write_text(Path(args.out).with_suffix(".json"), jsonio.dumps(rows, indent=1) + "\n")
    return 0
