"""What the table-making benchmarks share: run jobs in spawned worker processes (or in this
process), and format mean ± sd over seeds."""

from __future__ import annotations

import multiprocessing as mp

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
