"""``ppl-attention compare`` and ``sweep``: the options checked before any work, the jobs run by
:mod:`ppl_attention.tools.sweep` (in this process, worker processes or Ray), one table at the
end."""

from __future__ import annotations

import sys
from pathlib import Path

from ..common.backends import get_backend
from ..common.contract import check_method, global_latents, model_backend
from ..common.registry import load_model_class
from ..core.divergence import EXIT_DIVERGED
from ..core.errors import UserError
from ..core.method_specs import METHOD_SPECS, global_methods_for
from ..core.progress import progress_bar
from ..tools import sweep
from ..tools.experiment import check_experiment
from .options import (
    add_data_source,
    add_model_flag,
    add_model_options,
    add_training,
    experiment_from_args,
)


def supported_methods(cls, backend: str | None = None) -> list[str]:
    """The registry's methods this model class can be trained by (a model with global latents:
    the methods for them); with ``backend``, those that backend runs for it."""
    return list(method_support(cls, backend)[0])


def method_support(cls, backend: str | None = None) -> tuple[list[str], dict[str, str]]:
    """(the methods ``cls`` can be trained by under ``backend`` — its own backend when None —,
    {method: why not} for the registry's other methods)."""
    if global_latents(cls):
        return global_methods_for(cls), {}
    ops = get_backend(backend or model_backend(cls))
    ok, why = [], {}
    for name, spec in METHOD_SPECS.items():
        try:
            check_method(cls, spec)
            ops.check(cls, name)
        except UserError as e:
            why[name] = str(e)
            continue
        ok.append(name)
    return ok, why


def add_parsers(sub, model: str | None, command: str | None = None) -> None:
    """The ``compare`` and ``sweep`` parsers, with the options of ``model``; the one that is
    not ``command`` (and both when ``model`` is None) listed by name only."""
    cls = None if model is None else load_model_class(model)
    for name, text in (("compare", "train several methods × seeds, tabulate and plot"),
                       ("sweep", "methods × seeds × --set settings, in this process, worker "
                        "processes or on Ray; resumable")):
        if cls is None or name != command:
            sub.add_parser(name, help=text)
            continue
        p = sub.add_parser(name, help=text, description=f"{text} (--model {model}).")
        add_model_flag(p)
        p.add_argument("--methods", default=None,
                       help="comma-separated methods (default: every method this model takes "
                       "under its backend: " + ", ".join(supported_methods(cls)) + ")")
        p.add_argument("--seeds", type=int, default=1)
        p.add_argument("--set", action="extend", nargs="+", metavar="KEY=V1,V2",
                       help="sweep options over values: training, model or data options, "
                       "backend, devices, task_seed — e.g. --set hidden=32,64 lr=1e-2,3e-3")
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
        p.add_argument("--calibrate", action="store_true",
                       help="also calibrate each run's guide by simulation (ppl-attention "
                       "calibrate: 200 simulated targets, 99 draws) and add its columns")
        add_data_source(p, cls)
        add_training(p, cls)
        add_model_options(p, cls)
        p.set_defaults(fn=cmd_sweep, parser=p)


def cmd_sweep(args) -> int:
    """``sweep`` / ``compare``: every (method, seed, setting) job, then one table and figures."""
    if args.methods is None:  # every method the model and its backend support; the rest said
        cls = load_model_class(args.model)
        methods, why = method_support(cls, args.backend)
        if why and not global_latents(cls):
            print(f"[{args.command}] default methods for {cls.__name__}"
                  f"{' under ' + args.backend if args.backend else ''}: {', '.join(methods)}; "
                  f"left out: " + "; ".join(f"{m} ({r})" for m, r in why.items()),
                  file=sys.stderr)
    else:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods:
        raise UserError("--methods: give at least one method")
    if args.jobs < 1 or args.seeds < 1:
        raise UserError(f"--jobs and --seeds must be at least 1 (got {args.jobs}, {args.seeds})")
    if args.ray is not None and args.jobs != 1:
        raise UserError("--jobs runs worker processes on this machine; with --ray the cluster "
                        "decides how many jobs run at once (--cpus-per-job)")
    if args.cpus_per_job < 1:
        raise UserError(f"--cpus-per-job must be at least 1, got {args.cpus_per_job}")
    if args.ray is None and args.cpus_per_job != 1:
        raise UserError("--cpus-per-job is what each Ray job asks for: it goes with --ray")
    if args.ray is not None:
        sweep.check_ray(args.ray)  # Ray installed, a cluster at the address: before any work
    if args.data_dir is not None:  # jobs may run elsewhere (Ray): the corpus by its full path
        args.data_dir = str(Path(args.data_dir).resolve())
    exp = experiment_from_args(args)
    settings = sweep.parse_settings(getattr(args, "set", None) or [], args.parser)
    jobs = sweep.expand(methods, args.seeds, settings)
    if args.data_dir is not None and any(k in ("n_train", "task_seed") for k, _ in settings):
        raise UserError("--set n_train / task_seed sweep a built-in --task, not a --data-dir")
    for combo in {j.settings: j for j in jobs}.values():  # bad data or options: before any work
        check_experiment(sweep.job_args(exp, combo), methods)
    location = exp.model.rpartition(":")[0]
    if args.ray is not None and (location.endswith(".py") or "/" in location):
        exp.model_source = Path(location).expanduser().read_bytes()  # travels with the jobs
    swept = {k for k, _ in settings}
    fixed = {"model": exp.model, **{f"model.{k}": v for k, v in exp.model_options.items()},
             **{k: v for k, v in exp.training.items()}, **exp.method_options,
             **exp.data_options,
             "task": exp.task, "data_dir": exp.data_dir, "task_seed": exp.task_seed,
             "backend": exp.backend, "devices": exp.devices}
    fixed = {k: v for k, v in fixed.items() if k.split(".")[-1] not in swept}
    out = Path(args.out).resolve()
    ray = sweep.start_ray(args.ray) if args.ray is not None else None  # joined before any work
    try:
        if ray is not None:
            cpus = ray.cluster_resources().get("CPU", 0)
            if args.cpus_per_job > cpus:  # Ray would wait for such a node for ever
                raise UserError(f"--cpus-per-job {args.cpus_per_job}: the Ray cluster at "
                                f"{args.ray} has {cpus:g} CPUs in all")
        return _sweep(args, exp, jobs, settings, fixed, out)
    finally:
        if ray is not None:
            ray.shutdown()


def _sweep(args, exp, jobs, settings, fixed, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    sweep.check_sweep_dir(out, fixed)

    where = f"Ray ({args.ray})" if args.ray else f"{args.jobs} worker(s)"
    bar = progress_bar(total=len(jobs), desc=f"sweep, {where}", unit="job",
               disable=args.jobs == 1 and args.ray is None)

    def on_done(i, res):
        j = jobs[i]
        if res["status"] == "ok":
            r = res["report"]
            score = (f"NLL/token {r['nll_per_token']:.3f}" if "nll_per_token" in r else
                     f"accuracy {r.get('accuracy', float('nan')):.3f}")
            msg = (f"[sweep] {j.label} seed {j.seed}: {score}"
                   + (f", AER {r['aer']:.3f}" if r.get("aer") is not None else ""))
        elif res["status"] == "diverged":
            msg = f"[sweep] DIVERGED {j.label} seed {j.seed}: {res['error']}"
        else:
            msg = f"[sweep] FAILED {j.label} seed {j.seed}: {res['error']}"
        bar.write(msg, file=sys.stderr)
        bar.update()

    # by its importable name (a Ray worker imports it), not a function of this command; every
    # job's experiment was checked above
    import functools

    from ppl_attention.tools.experiment import train_one

    results = sweep.execute(functools.partial(train_one, checked=True), exp, jobs, out,
                            workers=args.jobs, ray_address=args.ray,
                            cpus_per_job=args.cpus_per_job, on_done=on_done)
    bar.close()
    sweep.against_nuts(out, jobs, results)
    swept_text = "; ".join(f"{k} ∈ {{{', '.join(map(str, vs))}}}" for k, vs in settings)
    steps = exp.training.get("steps", "default")
    title = (f"Model `{exp.model}`, task `{args.task or args.data_dir}`, {args.seeds} seed(s), "
             f"{steps} steps" + (f"; swept: {swept_text}" if settings else "") + ".")
    md = sweep.write_results(out, jobs, results, title, args.seeds)
    print("\n".join(md))
    print(f"wrote {out}/results.csv, results.md and figures; run directories in {out}/runs",
          file=sys.stderr)
    bad = [j.name for j, r in zip(jobs, results) if r["status"] == "failed"]
    gone = [j.name for j, r in zip(jobs, results) if r["status"] == "diverged"]
    if gone:
        print(f"error: {len(gone)} of {len(jobs)} runs diverged ({', '.join(gone)}): marked "
              f"DIVERGED, left out of the table's means and the figures — try a smaller --lr",
              file=sys.stderr)
    if bad:
        print(f"error: {len(bad)} of {len(jobs)} jobs failed ({', '.join(bad)}); the others are "
              f"complete — rerun the same command to run only the failed ones", file=sys.stderr)
        return 1
    return EXIT_DIVERGED if gone else 0
