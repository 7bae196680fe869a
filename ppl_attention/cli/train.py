"""``ppl-attention train``: one model, one method, one seed → a run directory."""

from __future__ import annotations

import sys
from pathlib import Path

from ..common.registry import MODELS, load_model_class
from ..core import jsonio
from ..tools.experiment import check_experiment, train_one
from .options import (
    add_data_source,
    add_model_flag,
    add_model_options,
    add_training,
    experiment_from_args,
)


def default_method(model: str) -> str:
    return MODELS[model].default_method if model in MODELS else "exact"


def add_parser(sub, model: str | None) -> None:
    """The ``train`` parser, its options those of ``model`` (None: the command is not the one
    run — listed by name only, so no model is imported for it)."""
    text = "train one method, write a run directory"
    if model is None:
        sub.add_parser("train", help=text)
        return
    cls = load_model_class(model)
    p = sub.add_parser("train", help=text,
                       description=f"Train --model {model} ({cls.__name__}) by one method.")
    add_model_flag(p)
    p.add_argument("--method", default=default_method(model),
                   help=f"an inference method (default {default_method(model)}; "
                   f"ppl_attention.pyro.inference.METHODS)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="run directory to write")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--checkpoint-every", type=int,
                   help="save a resumable PARTIAL run directory every N steps")
    add_data_source(p, cls)
    add_training(p, cls)
    add_model_options(p, cls)
    p.set_defaults(fn=cmd_train)


def _distributed():
    """The torchrun launch this process is part of (None: a plain run, torch not imported)."""
    import os

    if os.environ.get("WORLD_SIZE") in (None, "", "1"):
        return None
    from ..pyro.inference.distributed import Distributed

    return Distributed.from_env()


def cmd_train(args) -> int:
    exp = experiment_from_args(args)
    check_experiment(exp, [args.method])
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        from ..core.errors import UserError

        raise UserError(f"--checkpoint-every must be at least 1, got {args.checkpoint_every}")
    distributed = _distributed()
    try:
        _, report = train_one(exp, args.method, args.seed, Path(args.out),
                              distributed=distributed, checked=True)
    finally:
        if distributed is not None:
            distributed.stop()
    if report is not None:  # rank 0 of a torchrun launch, or a one-process run
        print(jsonio.dumps(report, indent=1))
        print(f"wrote run directory {args.out}", file=sys.stderr)
    return 0
