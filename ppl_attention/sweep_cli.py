"""``ppl-attention sweep`` and ``compare``: the options checked before any work, the jobs run by
:mod:`ppl_attention.sweep` (in this process, worker processes or Ray), one table at the end."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm.auto import tqdm

from . import sweep
from .inference import get_method


def cmd_sweep(args) -> int:
    """``sweep`` / ``compare``: every (method, seed, setting) job, then one table and figures."""
    from .cli import _add_data_source, _add_training, _data

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods:
        raise ValueError("--methods: give at least one method")
    for m in methods:
        get_method(m)
    if args.jobs < 1 or args.seeds < 1:
        raise ValueError(f"--jobs and --seeds must be at least 1 (got {args.jobs}, {args.seeds})")
    if args.ray is not None and args.jobs != 1:
        raise ValueError("--jobs runs worker processes on this machine; with --ray the cluster "
                         "decides how many jobs run at once (--cpus-per-job)")
    if args.cpus_per_job < 1:
        raise ValueError(f"--cpus-per-job must be at least 1, got {args.cpus_per_job}")
    if args.ray is not None:
        sweep.check_ray(args.ray)  # Ray installed, a cluster at the address: before any work
    if args.data_dir is not None:  # jobs may run elsewhere (Ray): the corpus by its full path
        args.data_dir = str(Path(args.data_dir).resolve())
    options = argparse.ArgumentParser(add_help=False)
    _add_data_source(options, required=False)
    _add_training(options)
    settings = sweep.parse_settings(getattr(args, "set", None) or [], options)
    jobs = sweep.expand(methods, args.seeds, settings)
    if args.data_dir is not None and any(k in ("n_train", "task_seed") for k, _ in settings):
        raise ValueError("--set n_train / task_seed sweep a built-in --task, not a --data-dir")
    for job in {j.settings: j for j in jobs}.values():  # bad data or options: before any work
        a = sweep.job_args(args, job)
        _data(a)
        if a.backend == "pyro" and a.devices != 1:
            raise ValueError("--devices shards batches over JAX devices: set backend numpyro "
                             "with it (Pyro data parallelism is torchrun)")
        if a.backend == "numpyro":
            from .numpyro.inference import get_method as numpyro_method

            for m in methods:
                numpyro_method(m)
    swept = {k for k, _ in settings}
    fixed = {k: getattr(args, k) for k in (*sweep.SETTABLE, "task", "data_dir", "stress")
             if k not in swept and hasattr(args, k)}
    if fixed.get("data_dir"):
        fixed["data_dir"] = str(Path(fixed["data_dir"]).resolve())
    out = Path(args.out).resolve()
    ray = sweep.start_ray(args.ray) if args.ray is not None else None  # joined before any work
    try:
        if ray is not None:
            cpus = ray.cluster_resources().get("CPU", 0)
            if args.cpus_per_job > cpus:  # Ray would wait for such a node for ever
                raise ValueError(f"--cpus-per-job {args.cpus_per_job}: the Ray cluster at "
                                 f"{args.ray} has {cpus:g} CPUs in all")
        return _sweep(args, jobs, settings, fixed, out)
    finally:
        if ray is not None:
            ray.shutdown()


def _sweep(args, jobs, settings, fixed, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    sweep.check_sweep_dir(out, fixed)

    where = f"Ray ({args.ray})" if args.ray else f"{args.jobs} worker(s)"
    bar = tqdm(total=len(jobs), desc=f"sweep, {where}", unit="job",
               disable=args.jobs == 1 and args.ray is None)

    def on_done(i, res):
        j = jobs[i]
        if res["status"] == "ok":
            r = res["report"]
            msg = (f"[sweep] {j.label} seed {j.seed}: NLL/token {r['nll_per_token']:.3f}"
                   + (f", AER {r['aer']:.3f}" if r.get("aer") is not None else ""))
        else:
            msg = f"[sweep] FAILED {j.label} seed {j.seed}: {res['error']}"
        bar.write(msg, file=sys.stderr)
        bar.update()

    # by reference to the module's importable name (under `python -m ppl_attention.cli` this
    # module is __main__, which a Ray worker cannot import) and without the command's function
    from ppl_attention.cli import train_one as train_fn

    job_options = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "fn"})
    results = sweep.execute(train_fn, job_options, jobs, out, workers=args.jobs,
                            ray_address=args.ray, cpus_per_job=args.cpus_per_job,
                            on_done=on_done)
    bar.close()
    swept_text = "; ".join(f"{k} ∈ {{{', '.join(map(str, vs))}}}" for k, vs in settings)
    title = (f"Task `{args.task or args.data_dir}`, {args.seeds} seed(s), {args.steps} steps, "
             f"hidden {args.hidden}, batch {args.batch_size}"
             + (f"; swept: {swept_text}" if settings else "") + ".")
    md = sweep.write_results(out, jobs, results, title, args.seeds)
    print("\n".join(md))
    print(f"wrote {out}/results.csv, results.md and figures; run directories in {out}/runs",
          file=sys.stderr)
    bad = [j.name for j, r in zip(jobs, results) if r["status"] != "ok"]
    if bad:
        print(f"error: {len(bad)} of {len(jobs)} jobs failed ({', '.join(bad)}); the others are "
              f"complete — rerun the same command to run only the failed ones", file=sys.stderr)
        return 1
    return 0
