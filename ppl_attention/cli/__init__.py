"""The ``ppl-attention`` command: train | evaluate | align | decode | analyze | diagnose |
calibrate | sample | check-twin | wordalign | symmetrize | compare | sweep | models.

``train``, ``compare`` and ``sweep`` take ``--model NAME`` (the registry: ``ppl-attention models``)
or a user's model, ``--model path/to/file.py:ClassName`` / ``package.module:ClassName``; their
options then are that model's (``train --model X --help`` lists them), its data kind's, and the
training options with the model's defaults. An option the model does not have is refused.

Bad input — a malformed file, an unknown name, an option that does not apply, a model that lacks
what a command needs — ends with one ``error: …`` line naming what and where, and exit status
2, before any work. Training that diverges (a non-finite loss or gradient, an impossible
figure: :mod:`ppl_attention.core.divergence`) ends with one ``error: training diverged at step
N …`` line, the run written marked DIVERGED, exit status 3. A run that trained but whose test
report failed (the model's own ``extra_report``, say) is written complete; the failure's
traceback and one ``error:`` line naming it follow, exit status 1. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from ..core.divergence import EXIT_DIVERGED, Diverged
from ..core.errors import UserError
from . import analyze, compare, evaluate_align, sample, train, twin, wordalign
from .options import peek_model


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors as one line naming the command (exit 2)."""

    def error(self, message):
        self.exit(2, f"error: {self.prog}: {message}\n")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser; the options of train / compare / sweep depend on ``--model`` in ``argv``."""
    ap = _Parser(prog="ppl-attention", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)
    command = next((a for a in argv if not a.startswith("-")), None)
    # only the command run builds its model-dependent options (and imports its model)
    model = peek_model(argv) if command in ("train", "compare", "sweep") else None
    train.add_parser(sub, model if command == "train" else None)
    evaluate_align.add_parsers(sub)
    analyze.add_parsers(sub)
    sample.add_parser(sub)
    twin.add_parser(sub)
    wordalign.add_parsers(sub)
    compare.add_parsers(sub, model if command in ("compare", "sweep") else None, command)
    p = sub.add_parser("models", help="the model registry: name, data, reference")
    p.set_defaults(fn=_cmd_models)
    return ap


def _cmd_models(args) -> int:
    from ..common.registry import MODELS

    for e in MODELS.values():
        print(f"{e.name:<15} {e.data:<10} {e.description}\n{'':<26} reference: {e.reference}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(argv).parse_args(argv)
        with contextlib.ExitStack() as args.context:  # what a command sets up, undone after
            return args.fn(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Diverged as e:
        print(f"error: {e.message()}", file=sys.stderr)
        return EXIT_DIVERGED
    except Exception as e:
        from ..tools.experiment import ReportFailed

        if not isinstance(e, ReportFailed):
            raise
        import traceback

        traceback.print_exception(e.cause, file=sys.stderr)
        print(f"error: {e}", file=sys.stderr)
        return 1
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        return e.code if isinstance(e.code, int) else 2


__all__ = ["main", "build_parser"]
