"""The C allocator's settings for a long array program on the CPU.

JAX on the CPU takes its buffers from the C library's ``malloc``. glibc serves a block below its
mmap threshold from an arena, one arena per thread up to eight per core, and after each large
block it frees it raises that threshold, up to 32 MiB. A run that allocates and frees buffers of
a few MiB again and again — one batch's temporaries, sweep after sweep — then leaves its arenas
fragmented: the process holds memory it no longer uses, and its resident size grows from one
stage to the next. Fixing the threshold (a block above it is mapped, and unmapped when freed)
and capping the arenas keeps the resident size near what the program holds (the word aligner
at 100,000 sentence pairs: docs/results.md, the word aligners against eflomal, *Memory*).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import sys

__all__ = ["tune_allocator", "return_free_memory", "ALLOCATOR_ENV", "collect_at_stage_ends",
           "collect_young"]

#: glibc's environment variables for the same settings: one that is set is the user's choice,
#: and :func:`tune_allocator` then changes nothing
ALLOCATOR_ENV = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                 "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # glibc's malloc.h


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def tune_allocator(mmap_threshold: int = 1 << 20, arenas: int = 4) -> bool:
    """Fix glibc's mmap (and trim) threshold at ``mmap_threshold`` bytes and cap its arenas at
    ``arenas``, through ``mallopt``. Returns whether they were set: False off Linux's glibc, or
    when one of :data:`ALLOCATOR_ENV` is set (the user's own settings stand). One arena would
    hold a little less memory but serializes the compiler's threads (a cold 10k-pair fertility
    run 95 s → 117 s); 1 MiB and 4 arenas cost no time there."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or any(v in os.environ for v in ALLOCATOR_ENV):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(option, value) == 1 for option, value in (
        (_M_MMAP_THRESHOLD, mmap_threshold), (_M_TRIM_THRESHOLD, mmap_threshold),
        (_M_ARENA_MAX, arenas)))


def return_free_memory() -> bool:
    """Give the free pages inside glibc's arenas back to the system (``malloc_trim(0)``), as
    between two stages of a run: what one stage freed is then not counted into the next one's
    resident size. Returns whether any was given back (False off glibc)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    return trim(0) == 1


@contextlib.contextmanager
def collect_at_stage_ends():
    """Python's cyclic garbage collector off inside (back to how it was after), for a run that
    holds millions of small objects — a corpus's words, its links — and calls ``gc.collect()``
    itself where a stage ends. Left on, the collector walks them again and again as new
    objects pile up: 6 s of a 79 s word-alignment run at 100,000 sentence pairs, and the run 8 s
    slower in all (docs/results.md)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def collect_young() -> int:
    """Collect the cycles among the objects made since the last collection (Python's two young
    generations), as a stage ends inside :func:`collect_at_stage_ends`: a stage's garbage — a
    tracing's jaxprs, a lowered module — is young, and a full ``gc.collect()`` would walk every
    object the run holds again (a 100,000-pair corpus's words: 0.2–0.5 s each time, 14 times
    in a word-alignment run). The survivors move to the old generation, which a full
    collection at a direction's end still visits. Returns the objects collected."""
    return gc.collect(1)
