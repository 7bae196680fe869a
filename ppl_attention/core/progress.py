"""Progress bars for long work, written once for every tool: tqdm on a terminal as usual, and
written to a file or a pipe (a log, CI) at most every :data:`PIPE_INTERVAL` seconds instead of
at every step — a three-method, 300-step ``compare`` otherwise writes ~100 KB of updates."""

from __future__ import annotations

import sys

__all__ = ["progress_bar", "PIPE_INTERVAL"]

#: seconds between two updates of a bar whose stream is not a terminal
PIPE_INTERVAL = 5.0


def progress_bar(iterable=None, **kwargs):
    """``tqdm.auto.tqdm(iterable, **kwargs)``, updated every :data:`PIPE_INTERVAL` s when
    standard error is not a terminal (unless the caller sets ``mininterval``)."""
    from tqdm.auto import tqdm

    stream = kwargs.get("file") or sys.stderr
    if "mininterval" not in kwargs and not getattr(stream, "isatty", lambda: False)():
        kwargs["mininterval"] = PIPE_INTERVAL
    return tqdm(iterable, **kwargs)
