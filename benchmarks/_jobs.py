"""What the table-making benchmarks share: run jobs in spawned worker processes (or in this
process), and format mean ± sd over seeds."""

from __future__ import annotations

import json
import multiprocessing as mp
import resource
import subprocess
import sys

from ppl_attention.tools.sweep import mean_sd


def run_jobs(fn, jobs: list, n_procs: int) -> list:
    """``[fn(j) for j in jobs]``, ``n_procs`` at a time in spawned processes when > 1; results
    in the order of ``jobs``."""
    if n_procs > 1:
        with mp.get_context("spawn").Pool(n_procs) as pool:
            return pool.map(fn, jobs)
    return [fn(j) for j in jobs]


def cell(xs, digits: int = 2) -> str:
    """``mean ± sd`` of the values that are not None, ``—`` when none are."""
    ms = mean_sd(xs)
    return "—" if ms is None else f"{ms[0]:.{digits}f} ± {ms[1]:.{digits}f}"


def spawn_one(script: str, job: dict) -> dict:
    """``python script --one JOB`` in a fresh interpreter — its own wall time, compilation and
    peak memory —, the result the JSON of its last line of standard output; a failed run ends
    the benchmark naming the job, with the tail of its standard error."""
    p = subprocess.run([sys.executable, script, "--one", json.dumps(job)], text=True,
                       capture_output=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-3000:])
        raise SystemExit(f"run failed: {job}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def cpu_seconds(who=resource.RUSAGE_SELF) -> float:
    """User plus system CPU seconds of this process (``RUSAGE_SELF``: all its threads) or of
    its finished children (``RUSAGE_CHILDREN``): on 2 cores, up to twice the wall time when
    both are busy."""
    use = resource.getrusage(who)
    return use.ru_utime + use.ru_stime


def answer_one(args, one) -> bool:
    """In a ``--one`` worker (:func:`spawn_one`): run ``one(job)``, print its JSON, return True."""
    if not args.one:
        return False
    print(json.dumps(one(json.loads(args.one))))
    return True
