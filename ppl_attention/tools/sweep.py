"""Sweeps: every (method, seed, setting) job of a comparison trained as its own run directory —
one after another in this process, ``--jobs N`` at a time in worker processes, or as Ray tasks
(``--ray ADDRESS|local``) — then one ``results.csv`` / ``results.md`` and figures.

A job that fails is reported with its error and the others finish; a rerun of the same command
skips every job whose run directory is complete (resume), so nothing finished is lost or redone.
A job whose training diverged (:mod:`ppl_attention.core.divergence`) is a result too: its row
says "diverged at step N", it is left out of the figures, and a rerun keeps it (the same options
would diverge again; sweep ``--set lr=…`` to try others).
``ppl-attention compare`` and ``ppl-attention sweep`` are this machinery.

Ray jobs train in a temporary directory on whichever node runs them and send the run directory
back, so ``--out`` need only exist where the command runs; a ``--data-dir`` corpus is read here
and sent with the jobs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import re
import socket
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..common.devices import job_device
from ..common.runs import COMPLETE, DIVERGED, PARTIAL, divergence_of, run_extra
from ..core import jsonio
from ..core.divergence import Diverged
from ..core.errors import UserError
from ..data.corpus import atomic_write_text, write_directory_atomically

#: options a ``--set key=v1,v2`` may sweep besides the training, model and data options
SETTABLE_OTHER = ("backend", "devices", "task_seed")
PREFIXES = ("train__", "method__", "model__", "data__")
#: what a job reports (columns of results.csv after method, seed, the swept settings, status)
COLUMNS = ["nll_per_token", "elbo_per_token", "aer", "ms_per_step"]
#: …and where the data scores decoding, gold trees (``--task trees``), segments (``phrases``) or
#: frames (``durations``)
DECODE_COLUMNS = ["prefix_accuracy", "sequence_accuracy", "uas", "segment_f1",
                  "frame_accuracy", "support"]
#: …and where a run compiles (NumPyro): its compiled step's time, its compile time and count
COMPILE_COLUMNS = ["ms_per_step_compiled", "compile_seconds", "compilations"]
COMPILE_HEADS = {"ms_per_step_compiled": "compiled ms/step", "compile_seconds": "compile s",
                 "compilations": "compilations"}
#: …and for the methods of global latents (MCMC and SVI against it)
GLOBAL_COLUMNS = ["seconds", "rhat_max", "ess_bulk_min", "ess_tail_min", "divergences",
                  "vs_nuts_mean_error_sd", "vs_nuts_sd_ratio", "vs_nuts_w1_sd"]
#: …and for a model scored by its own report on labelled data (images, graphs)
LABEL_COLUMNS = ["accuracy", "ece", "pavpu", "accuracy_noisy", "ece_noisy", "pavpu_noisy",
                 "ms_per_step"]
LABEL_HEADS = ["accuracy", "ECE", "PAvPU", "accuracy noisy", "ECE noisy", "PAvPU noisy",
               "ms/step"]
DATA_FILES = ("train.tsv", "valid.tsv", "test.tsv", "train.align", "valid.align", "test.align")


@dataclass(frozen=True)
class Job:
    """One run of a sweep: a method, a seed and the swept ``(key, value)`` settings."""

    method: str
    seed: int
    settings: tuple[tuple[str, object], ...] = ()

    @property
    def label(self) -> str:
        """The method and its settings (the row of results.md this job's seed belongs to)."""
        return " ".join([self.method] + [f"{k}={v}" for k, v in self.settings])

    @property
    def name(self) -> str:
        """The run directory's name: ``exact-seed0``, ``exact-hidden=32-lr=0.01-seed1``."""
        parts = [self.method] + [f"{k}={v}" for k, v in self.settings] + [f"seed{self.seed}"]
        return "-".join(parts).replace(os.sep, "_").replace(" ", "_")


def settable(parser) -> dict:
    """Key → argparse action of every option a ``--set`` may sweep: the training options, the
    model's options, the data options, backend, devices and task_seed."""
    out = {}
    for a in parser._actions:
        for pre in PREFIXES:
            if a.dest.startswith(pre):
                out[a.dest[len(pre):]] = a
        if a.dest in SETTABLE_OTHER:
            out[a.dest] = a
    return out


def parse_settings(specs: list[str], parser) -> list[tuple[str, list]]:
    """``["hidden=32,64", "lr=1e-2"]`` → ``[("hidden", [32, 64]), ("lr", [0.01])]``, each value
    converted and checked as the option ``--hidden`` / ``--lr`` of ``parser`` would."""
    actions = settable(parser)
    out, seen = [], set()
    for spec in specs:
        key, eq, values = spec.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not eq or not key:
            raise UserError(f"--set {spec!r}: expected KEY=V1,V2,… (e.g. --set hidden=32,64)")
        if key not in actions:
            raise UserError(f"--set {spec!r}: {key!r} cannot be swept; valid keys: "
                            f"{', '.join(sorted(actions))}")
        if key in seen:
            raise UserError(f"--set {key} is given twice; list its values once: "
                            f"--set {key}=V1,V2")
        seen.add(key)
        raw = [v.strip() for v in values.split(",")]
        if not all(raw):
            raise UserError(f"--set {spec!r}: an empty value")
        out.append((key, [_convert(actions[key], key, v) for v in raw]))
    return out


def _convert(action, key: str, value: str):
    if action.type is None and action.nargs == 0:  # a --flag / --no-flag option
        lowered = value.lower()
        if lowered not in ("true", "false", "yes", "no", "1", "0"):
            raise UserError(f"--set {key}={value}: expected true or false")
        return lowered in ("true", "yes", "1")
    try:
        v = action.type(value) if action.type else value
    except (TypeError, ValueError):
        kind = getattr(action.type, "__name__", "value")
        raise UserError(f"--set {key}={value}: not a valid {kind}") from None
    if action.choices is not None and v not in action.choices:
        raise UserError(f"--set {key}={value}: valid values: "
                         f"{', '.join(map(str, action.choices))}")
    return v


def expand(methods: list[str], seeds: int, settings: list[tuple[str, list]]) -> list[Job]:
    """Every (method, setting, seed) combination, in that nesting order."""
    keys = [k for k, _ in settings]
    combos = list(itertools.product(*(vs for _, vs in settings))) or [()]
    return [Job(m, s, tuple(zip(keys, combo)))
            for m in methods for combo in combos for s in range(seeds)]


def job_args(args, job: Job):
    """The experiment with the job's settings in place."""
    return args.with_settings(job.settings)


def check_run_dir(path: Path) -> None:
    """Refuse to write a run over a directory that is not one (nothing already written is lost)."""
    if path.exists() and not any((path / m).exists() for m in (COMPLETE, PARTIAL, DIVERGED)) \
            and (not path.is_dir() or any(path.iterdir())):
        raise FileExistsError(f"{path}: exists and is not a run directory; refusing to "
                              f"overwrite it (move it away and rerun)")


def calibrate_job(exp, run, run_dir: Path) -> dict:
    """``--calibrate``: the run's guide (best weights) calibrated by simulation on its test
    split, the report written into its run directory; the table's columns back."""
    from ..analysis.sbc import calibrate, uncalibratable, write_report
    from ..common.contract import declared
    from ..common.devices import jax_default_device
    from ..data.kinds import data_kind
    from .experiment import best_weights

    if uncalibratable(run):  # its row says so: the training still counts
        return {"cal_none": True}
    kind = data_kind(declared(run.model, "data"))
    test = kind.load(exp.source()).test
    place = jax_default_device(exp.device) if run.backend == "numpyro" else \
        contextlib.nullcontext()
    with place, best_weights(run):
        res = calibrate(run, test.pairs, getattr(test, "gold", None), progress=False)
    write_report(res, run_dir)
    return calibration_columns(res)


def calibrate_completed(args, job, path: Path, done: dict) -> dict:
    """``--calibrate`` over a job trained before without it (or whose calibration failed):
    its run loaded back and calibrated, the columns added to its read-back result."""
    from ..common.devices import torch_device
    from ..common.runs import Run

    try:
        a = job_args(args, job)
        device = torch_device(a.device) if done["report"].get("backend", "pyro") == "pyro" \
            else None
        run = Run.load(path, which="best", device=device)
        done["report"].update(calibrate_job(a, run, path))
        return done
    except Exception as e:  # the job's failure is its result; the sweep goes on
        return failed(e, traceback.format_exc())


def calibration_columns(res: dict) -> dict:
    """The comparison table's calibration columns: the smallest uniformity p-value and the 90 %
    coverage of the first posterior (the guide; the exact posterior for an exact method)."""
    row = res["rows"][0]
    return {"cal_p_min": row["p_min"], "cal_cov_90": row["coverage"]["0.90"],
            "cal_pass": row["passes"]}


def against_nuts(out: Path, jobs: list, results: list[dict]) -> None:
    """Put each global-latent posterior (an ``svi-*`` or ``hmc`` run) against the ``nuts``
    run of the same seed and settings: its discrepancy per global parameter
    (:func:`ppl_attention.numpyro.inference.bayes.discrepancy`) into its report — the mean over
    the parameters in the table's columns, each parameter in ``against_nuts.md``."""
    from ..core.arrays import load_arrays

    def samples(job):
        path = out / "runs" / job.name / "samples.npz"
        return load_arrays(path).get("posterior") if path.exists() else None

    refs = {(j.seed, j.settings): samples(j) for j, r in zip(jobs, results)
            if j.method == "nuts" and r["status"] == "ok"}
    if not refs:
        return
    from ..numpyro.inference.bayes import discrepancy

    lines = ["| method | seed | parameter | mean error (NUTS sd) | sd ratio | W1 (NUTS sd) |",
             "|---|---|---|---|---|---|"]
    for j, r in zip(jobs, results):
        ref = refs.get((j.seed, j.settings))
        if j.method == "nuts" or r["status"] != "ok" or ref is None or "predictive" not in \
                r["report"]:
            continue
        mine = samples(j)
        if mine is None:
            continue
        d = discrepancy(ref, mine)
        for site, v in d.items():
            lines.append(f"| {j.label} | {j.seed} | {site} | {v['mean_error_sd']:.3f} | "
                         f"{v['sd_ratio']:.3f} | {v['w1_sd']:.3f} |")
        for key in ("mean_error_sd", "sd_ratio", "w1_sd"):
            r["report"][f"vs_nuts_{key}"] = float(sum(v[key] for v in d.values()) / len(d))
    atomic_write_text(out / "against_nuts.md", "\n".join(lines) + "\n")


def diverged_result(stop: Diverged | dict, history: list | None = None) -> dict:
    """A diverged job's result: its record, the one-line reason, the history up to the stop."""
    rec = stop.record() if isinstance(stop, Diverged) else dict(stop)
    return {"status": "diverged", "diverged": rec, "history": history or [],
            "error": f"diverged at step {rec.get('step')}: {rec.get('what')} = "
                     f"{_short(rec.get('value'))}"}


def _short(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def completed(path: Path) -> dict | None:
    """The result of a finished job read back from its run directory (a diverged one too), or
    None if unfinished."""
    rec = divergence_of(path)
    if rec is not None:
        try:
            history = json.loads((path / "metrics.json").read_text())["history"]
        except (OSError, ValueError, KeyError):
            history = []
        return {**diverged_result(rec, history), "resumed": True}
    if not (path / COMPLETE).exists():
        return None
    try:
        extra = run_extra(path)
        history = json.loads((path / "metrics.json").read_text())["history"]
    except (OSError, ValueError, KeyError, RuntimeError):
        return None
    if "test_report" not in extra:
        return None
    report = dict(extra["test_report"])
    if (path / "calibration.json").exists():
        try:
            report.update(calibration_columns(json.loads((path / "calibration.json").read_text())))
        except (OSError, ValueError, KeyError, IndexError):
            pass
    return {"status": "ok", "report": report, "history": history, "resumed": True}


def read_data_files(data_dir: str | None) -> dict[str, bytes] | None:
    if not data_dir:
        return None
    d = Path(data_dir)
    return {n: (d / n).read_bytes() for n in DATA_FILES if (d / n).is_file()}


def run_job(train_fn: Callable, args, job: Job, run_dir: str, threads: int | None = None,
            ship: bool = False, data_files: dict[str, bytes] | None = None) -> dict:
    """Train one job; never raises for the job's own errors (it reports them).

    ``ship``: train in a temporary directory and return the run directory's files (a Ray
    task on any node); otherwise write ``run_dir`` directly. ``data_files``: a ``--data-dir``
    corpus sent with the job. Returns ``{"status": "ok", "report", "history"[, "files"]}`` or
    ``{"status": "failed", "error", "traceback"}``."""
    try:
        if threads is not None:
            if "torch" in sys.modules:
                sys.modules["torch"].set_num_threads(threads)
            else:  # torch reads it when (and if) a Pyro job imports it
                os.environ["OMP_NUM_THREADS"] = str(threads)
            if threads == 1 and "jax" not in sys.modules:  # XLA reads its flags at import
                os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
        a = job_args(args, job)
        if not ship:
            check_run_dir(Path(run_dir))
            run, report = train_fn(a, job.method, job.seed, Path(run_dir),
                                   progress=threads is None)
            if a.calibrate:
                report.update(calibrate_job(a, run, Path(run_dir)))
            return {"status": "ok", "report": report, "history": run.history}
        with tempfile.TemporaryDirectory(prefix="ppl-attention-job-") as tmp:
            if data_files is not None:
                (Path(tmp) / "data").mkdir()
                for n, b in data_files.items():
                    (Path(tmp) / "data" / n).write_bytes(b)
                a.data_dir_record, a.data_dir = a.data_dir, str(Path(tmp) / "data")
            run, report = train_fn(a, job.method, job.seed, Path(tmp) / "run", progress=False)
            if a.calibrate:
                report.update(calibrate_job(a, run, Path(tmp) / "run"))
            root = Path(tmp) / "run"
            files = {str(p.relative_to(root)): p.read_bytes()
                     for p in sorted(root.rglob("*")) if p.is_file()}
        return {"status": "ok", "report": report, "history": run.history, "files": files}
    except Diverged as stop:  # its run directory is written, marked DIVERGED
        res = diverged_result(stop, stop.run.history if stop.run is not None else [])
        if ship and stop.run is not None:
            with tempfile.TemporaryDirectory(prefix="ppl-attention-job-") as tmp:
                root = stop.run.save(Path(tmp) / "run", diverged=stop)
                res["files"] = {str(p.relative_to(root)): p.read_bytes()
                                for p in sorted(root.rglob("*")) if p.is_file()}
        return res
    except Exception as e:  # the job's failure is its result; the sweep goes on
        return failed(e, traceback.format_exc())


def failed(e: BaseException, tb: str = "") -> dict:
    """A failed job's result: the error's type and first line (for an error Ray wraps, the
    cause's, or the wrapped message's last line)."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        e = cause
    lines = [x for x in re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines() if x.strip()]
    if lines and lines[0].startswith("ray::"):  # "ray::run_job() (pid=…)" then the traceback
        lines = lines[-1:]
    return {"status": "failed", "error": f"{type(e).__name__}: {lines[0] if lines else ''}",
            "traceback": tb or str(e)}


def write_run_dir(path: Path, files: dict[str, bytes]) -> None:
    """Write a run directory sent back by a Ray job: a temporary sibling, then one rename."""
    check_run_dir(path)

    def fill(tmp: Path) -> None:
        for rel, b in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(b)

    write_directory_atomically(path, fill)


# --- executors --------------------------------------------------------------------------------

def check_ray_address(address: str) -> None:
    """Fail fast, before any work, when nothing listens at a ``host:port`` / ``ray://host:port``
    address (``ray.init`` would otherwise retry for a long time)."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and other forms: ray.init says what is wrong
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        raise UserError(f"--ray {address}: no Ray cluster there ({e.strerror or e}); start one "
                         f"with `ray start --head` and give its address, or use --ray local") \
            from None


def check_ray(address: str) -> None:
    """What ``--ray ADDRESS`` needs, checked before any work: Ray installed, and something
    listening at the address."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UserError("--ray needs Ray: pip install -e '.[ray]'") from None
    if not address.strip():
        raise UserError("--ray: give a cluster address (HOST:PORT, ray://HOST:PORT, auto) or "
                         "local")
    if address != "local":
        check_ray_address(address)


def start_ray(address: str, quiet: bool = True):
    """``ray.init`` for ``--ray local`` (a local cluster on this machine's CPUs) or an address
    of a running cluster (``HOST:PORT``, ``ray://HOST:PORT``, ``auto``). This package's code
    travels to the cluster's workers (``runtime_env.py_modules``); its dependencies must be
    installed there."""
    check_ray(address)
    import ray

    kwargs = dict(include_dashboard=False, log_to_driver=not quiet,
                  logging_level="WARNING", configure_logging=True)
    try:
        if address == "local":
            ray.init(address="local", **kwargs)
        else:
            import ppl_attention

            ray.init(address=address, runtime_env={
                "py_modules": [str(Path(ppl_attention.__file__).parent)]}, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise UserError(f"--ray {address}: could not join a Ray cluster: "
                         f"{str(e).strip().splitlines()[0]}") from None
    return ray


def execute(train_fn: Callable, args, jobs: list[Job], out: Path, *, workers: int = 1,
            ray_address: str | None = None, cpus_per_job: int = 1,
            on_done: Callable[[int, dict], None] = lambda i, r: None) -> list[dict]:
    """Run the jobs whose run directory under ``out/runs`` is not complete; return every job's
    result (``completed`` ones read back), in the order of ``jobs``. Each job gets its own
    device (:func:`ppl_attention.common.devices.job_device`: ``cuda`` spreads them over the
    GPUs)."""
    results: list = [None] * len(jobs)
    todo = []
    for i, job in enumerate(jobs):
        done = completed(out / "runs" / job.name)
        if done is not None and getattr(args, "calibrate", False) \
                and not {"cal_p_min", "cal_none"} & set(done["report"]):
            done = calibrate_completed(args, job, out / "runs" / job.name, done)
        if done is not None:
            results[i] = done
        else:
            todo.append(i)
    if len(todo) < len(jobs):
        print(f"[sweep] {len(jobs) - len(todo)} of {len(jobs)} jobs already complete in "
              f"{out}/runs: kept", file=sys.stderr)

    def finish(i, res):
        if res["status"] in ("ok", "diverged") and "files" in res:
            try:
                write_run_dir(out / "runs" / jobs[i].name, res.pop("files"))
            except OSError as e:
                res = failed(e, traceback.format_exc())
        log = out / "errors" / f"{jobs[i].name}.txt"  # a failed job's traceback, till it works
        if res["status"] in ("ok", "diverged"):
            log.unlink(missing_ok=True)
        else:
            log.parent.mkdir(exist_ok=True)
            atomic_write_text(log, res.get("traceback") or res["error"])
        results[i] = res
        on_done(i, res)

    per_job = {}
    for k, i in enumerate(todo):
        device = job_device(args.device, k, args.backend_name())
        per_job[i] = args if device == args.device else dataclasses.replace(args, device=device)
    if ray_address is not None:
        _execute_ray(train_fn, per_job, jobs, todo, out, ray_address, cpus_per_job, finish)
    elif workers > 1:
        _execute_pool(train_fn, per_job, jobs, todo, out, workers, finish)
    else:
        for i in todo:
            print(f"[sweep] {jobs[i].label} seed {jobs[i].seed}", file=sys.stderr)
            finish(i, run_job(train_fn, per_job[i], jobs[i], str(out / "runs" / jobs[i].name)))
    return results


def _execute_pool(train_fn, per_job, jobs, todo, out, workers, finish):
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    threads = max(1, (os.cpu_count() or 1) // workers)
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(run_job, train_fn, per_job[i], jobs[i],
                               str(out / "runs" / jobs[i].name), threads): i for i in todo}
        for f in as_completed(futures):
            try:
                res = f.result()
            except Exception as e:  # the worker process died (killed, out of memory)
                res = failed(e)
            finish(futures[f], res)


def _execute_ray(train_fn, per_job, jobs, todo, out, address, cpus_per_job, finish):
    import ray

    started = not ray.is_initialized()  # the caller may have joined the cluster already
    if started:
        start_ray(address)
    try:
        task = ray.remote(num_cpus=cpus_per_job, max_retries=0)(run_job)
        data = read_data_files(getattr(per_job[todo[0]], "data_dir", None)) if todo else None
        data_ref = ray.put(data) if data is not None else None
        refs = {task.remote(train_fn, per_job[i], jobs[i], str(out / "runs" / jobs[i].name),
                            cpus_per_job, True, data_ref): i for i in todo}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                res = ray.get(ready[0])
            except ray.exceptions.RayError as e:  # the worker died (killed, out of memory)
                res = failed(e)
            finish(refs[ready[0]], res)
    finally:
        if started:
            ray.shutdown()


# --- tables -----------------------------------------------------------------------------------

def mean_sd(xs):
    """(mean, sample sd) of the values that are not None, or None when none are."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    m = sum(xs) / len(xs)
    sd = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0
    return (m, sd)


def _csv_cell(v) -> str:
    s = "" if v is None else str(v)
    return f'"{s.replace(chr(34), chr(34) * 2)}"' if any(c in s for c in ',"\n') else s


def write_results(out: Path, jobs: list[Job], results: list[dict], title: str,
                  seeds: int) -> list[str]:
    """``results.csv`` (one row per job, failed ones with their error), ``results.md`` (mean ±
    sd over seeds per method and setting), ``learning_curves.png``, ``nll.png`` (the floor
    drawn) and ``aer_vs_nll.png``.
    Returns the table's lines."""
    from ..common.plots import plot_aer_vs_nll, plot_curves, plot_nll

    keys = list(dict.fromkeys(k for j in jobs for k, _ in j.settings))
    reports = [r.get("report", {}) for r in results]
    labelled = any("accuracy" in rep for rep in reports) and \
        not any("nll_per_token" in rep for rep in reports)
    columns = LABEL_COLUMNS if labelled else COLUMNS
    extra_cols = [] if labelled else ["floor_nll_per_token"]
    decoded = [c for c in DECODE_COLUMNS if any(c in rep for rep in reports)]
    compiled = [] if labelled else \
        [c for c in COMPILE_COLUMNS if any(c in rep for rep in reports)]
    extra_cols += decoded + compiled
    csv = [",".join(["method", "seed", *keys, "status", *([] if labelled else ["exact"]),
                     *columns, *extra_cols, "error"])]
    for job, res in zip(jobs, results):
        s = dict(job.settings)
        rep = res.get("report", {})
        csv.append(",".join(_csv_cell(v) for v in [
            job.method, job.seed, *(s.get(k) for k in keys), res["status"],
            *([] if labelled else [rep.get("exact")]),
            *(rep.get(c) for c in columns + extra_cols), res.get("error")]))
    atomic_write_text(out / "results.csv", "\n".join(csv) + "\n")

    labels = list(dict.fromkeys(j.label for j in jobs))
    summary, curves, floor = [], {}, None
    for label in labels:
        ok = [(j, r) for j, r in zip(jobs, results) if j.label == label and r["status"] == "ok"]
        if not ok:
            continue
        reps = [r["report"] for _, r in ok]
        floor = floor if floor is not None else reps[0].get("floor_nll_per_token")
        curves.setdefault(label, ok[0][1]["history"])
        summary.append({"method": label, "exact": reps[0].get("exact"), "n": len(ok),
                        **{c: mean_sd([r.get(c) for r in reps])
                           for c in columns + decoded + compiled + ["cal_p_min", "cal_cov_90"]
                           + GLOBAL_COLUMNS}})

    def fmt(v, digits=3):
        if v is None:
            return "—"
        return f"{v[0]:.{digits}f}" + (f" ± {v[1]:.{digits}f}" if seeds > 1 else "")

    md = [title + (f" Floor (generator's exact NLL/token): {floor:.3f}."
                   if floor is not None else ""), ""]
    bayes = any(rep.get("predictive") for rep in reports)
    if bayes:
        md += ["| method | NLL/token (posterior predictive) | AER | seconds | max R-hat | "
               "min ESS bulk | min ESS tail | divergences | vs NUTS: mean error (sd) | "
               "sd ratio | W1 (sd) |", "|---|" + "---|" * 10]
    elif labelled:
        md += ["| method | " + " | ".join(LABEL_HEADS) + " |",
               "|---|" + "---|" * len(LABEL_HEADS)]
    else:
        cal = any("cal_p_min" in rep for rep in reports)
        heads = {"prefix_accuracy": "correct before 1st error", "sequence_accuracy": "exact",
                 "uas": "UAS", "segment_f1": "segment F1", "frame_accuracy": "frame accuracy",
                 "support": "mean support"}
        md += ["| method | NLL/token | exact | ELBO/token | AER | ms/step |"
               + "".join(f" {COMPILE_HEADS[c]} |" for c in compiled)
               + "".join(f" {heads[c]} |" for c in decoded)
               + (" calibration min p | coverage 90 % |" if cal else ""),
               "|---|---|---|---|---|---|" + "---|" * (len(compiled) + len(decoded))
               + ("---|---|" if cal else "")]
    gone = [(j, r) for j, r in zip(jobs, results) if r["status"] == "diverged"]
    gone_steps = {}
    for j, r in gone:
        gone_steps.setdefault(j.label, []).append(str(r["diverged"].get("step")))
    for s in summary:
        seeds_note = "" if s["n"] == seeds else f" ({s['n']} of {seeds} seeds)"
        if s["method"] in gone_steps:
            seeds_note = (f" ({s['n']} of {seeds} seeds; diverged at step "
                          f"{', '.join(gone_steps[s['method']])})")
        if bayes:
            md.append(f"| {s['method']}{seeds_note} | " + " | ".join(
                fmt(s[c], d) for c, d in zip(["nll_per_token", "aer"] + GLOBAL_COLUMNS,
                                             [3, 3, 1, 4, 0, 0, 0, 3, 3, 3])) + " |")
            continue
        if labelled:
            cells = [fmt(s[c], 1 if c == "ms_per_step" else 3) for c in columns]
            md.append(f"| {s['method']}{seeds_note} | " + " | ".join(cells) + " |")
            continue
        bound = "yes" if s["exact"] else "IWAE-10"
        md.append(f"| {s['method']}{seeds_note} | {fmt(s['nll_per_token'])} | {bound} | "
                  f"{fmt(s['elbo_per_token'])} | {fmt(s['aer'])} | "
                  f"{fmt(s['ms_per_step'], 1)} |"
                  + "".join(f" {fmt(s[c], 0 if c == 'compilations' else 1)} |"
                            for c in compiled)
                  + "".join(f" {fmt(s[c])} |" for c in decoded)
                  + (f" {fmt(s['cal_p_min'])} | {fmt(s['cal_cov_90'])} |" if cal else ""))
    columns_in_table = md[2].count("|") - 1
    for label, at in gone_steps.items():
        if not any(s_["method"] == label for s_ in summary):  # every seed diverged
            md.append(f"| {label} | diverged at step {', '.join(at)} |"
                      + " — |" * (columns_in_table - 2))
    if not bayes and not labelled and cal and any(rep.get("cal_none") for rep in reports):
        md += ["", "Calibration `—`: the method's family samples nothing (soft attention, CRF "
               "marginals) or sums a Markov chain out exactly; there is no posterior to "
               "calibrate."]
    if gone:
        md += ["", "Diverged runs (left out of the means and the figures; their run directories "
               "are marked DIVERGED — try a smaller learning rate: compare's `--lr`, or "
               "`--set lr=…` in a sweep):", ""]
        md += [f"- `{j.name}`: {r['error']}" for j, r in gone]
    bad = [(j, r) for j, r in zip(jobs, results) if r["status"] == "failed"]
    if bad:
        md += ["", "Failed jobs (rerun the same command to run only these):", ""]
        md += [f"- `{j.name}`: {r['error']} (traceback: `errors/{j.name}.txt`)" for j, r in bad]
    atomic_write_text(out / "results.md", "\n".join(md) + "\n")
    if summary:
        plot_curves(curves, out / "learning_curves.png")
    if summary and not labelled:
        plot_nll(summary, out / "nll.png", floor)
        if any(s["aer"] for s in summary):
            plot_aer_vs_nll(summary, out / "aer_vs_nll.png", floor)
    return md


def check_sweep_dir(out: Path, fixed: dict) -> None:
    """Record the sweep's fixed options in ``out/sweep.json``; refuse, before any work, to mix
    runs made with other fixed options into the same directory."""
    path = out / "sweep.json"
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            raise UserError(f"{path}: not valid JSON; move it away or use another --out") \
                from None
        # an option missing on one side is its default there (a run without --lr against one
        # with --lr 0.05 is another experiment, not the same one resumed)
        diff = sorted(k for k in set(old) | set(fixed) if old.get(k) != fixed.get(k))
        if diff:
            def show(d, k):
                return f"{k}={d[k]!r}" if d.get(k) is not None else f"{k} (default)"

            was = ", ".join(show(old, k) for k in diff)
            now = ", ".join(show(fixed, k) for k in diff)
            raise UserError(f"{out} holds a sweep made with {was}; this one asks {now} — use "
                             f"another --out, or the same options to resume it")
    atomic_write_text(path, jsonio.dumps(fixed, indent=1, sort_keys=True) + "\n")
