"""Option groups of the command line. A model's options come from its constructor (name,
default, type — :func:`model_options`), its data kind's from the kind, the training options from
:data:`~ppl_attention.core.training.TRAINING_DEFAULTS` with the model's own defaults shown; an
option that the chosen model does not have is not defined, so argparse refuses it."""

from __future__ import annotations

import argparse
import inspect
import sys
import typing
from dataclasses import dataclass

from ..common.backends import BACKENDS
from ..common.contract import declared
from ..common.devices import DEVICE_HELP
from ..core.errors import UserError
from ..core.schedules import LR_SCHEDULES
from ..core.training import TRAINING_DEFAULTS, training_options
from ..data.kinds import DATA_KINDS, data_kind

TRAINING_HELP = {
    "steps": "training steps (one batch a step)",
    "lr": "peak Adam learning rate",
    "lr_schedule": "cosine or constant",
    "batch_size": "pairs (examples) per batch",
    "clip": "global gradient-norm clipping (0: none)",
    "weight_decay": "Adam's L2 weight decay",
    "kl_weight": "η: weight of the alignment sites' KL (1: the ELBO)",
    "anneal_rho": "ρ of the KL annealing η·sigmoid(t·ρ − 6) of methods that anneal (BAM)",
    "valid_every": "validate every N steps (best weights kept)",
}
_TYPES = {"steps": int, "lr": float, "lr_schedule": str, "batch_size": int, "clip": float,
          "weight_decay": float, "kl_weight": float, "anneal_rho": float, "valid_every": int}


@dataclass(frozen=True)
class ModelOption:
    name: str
    type: type
    default: object
    required: bool
    help: str


def _option_type(hint, default):
    """int/float/str/bool from an annotation (``int | None`` → int) or the default's type."""
    args = typing.get_args(hint)
    if args:
        real = [a for a in args if a is not type(None)]
        hint = real[0] if len(real) == 1 else hint
    if hint in (int, float, str, bool):
        return hint
    if default is not None and type(default) in (int, float, str, bool):
        return type(default)
    return None


def model_options(cls) -> dict[str, ModelOption]:
    """The options of a model class: its constructor's keyword arguments other than the data
    dimensions and ``family``. Refuses an option the command line cannot offer."""
    kind = data_kind(declared(cls, "data"))
    init = cls.__init__
    init = getattr(init, "__wrapped__", init)
    try:
        hints = typing.get_type_hints(init)
    except Exception:  # unresolvable annotations: fall back to the defaults' types
        hints = {}
    helps = getattr(cls, "option_help", {}) or {}
    out = {}
    for name, p in list(inspect.signature(init).parameters.items())[1:]:
        if name in kind.dims or name == "family" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        default = None if p.default is p.empty else p.default
        typ = _option_type(hints.get(name, p.annotation), default)
        if typ is None:
            raise UserError(f"{cls.__name__}: option {name!r} has no int, float, str or bool "
                            f"type (annotate it or give it such a default)")
        clash = name in TRAINING_DEFAULTS or name in kind.options or name in (
            "task", "data_dir", "task_seed", "method", "methods", "seed", "out", "backend",
            "devices", "device", "calibrate", "model", "resume", "checkpoint_every", "set",
            "seeds", "jobs", "ray")
        if clash:
            raise UserError(f"{cls.__name__}: option {name!r} has the name of a command-line "
                            f"option of its own; rename it")
        out[name] = ModelOption(name, typ, default, p.default is p.empty, helps.get(name, ""))
    return out


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_model_options(p, cls) -> list[str]:
    g = p.add_argument_group(f"options of the model {cls.__name__} (its constructor's)")
    names = []
    for o in model_options(cls).values():
        text = (o.help + " " if o.help else "") + ("(required)" if o.required else
                                                   f"(default: {o.default})")
        if o.type is bool:
            g.add_argument(flag(o.name), dest=f"model__{o.name}",
                           action=argparse.BooleanOptionalAction, default=None, help=text,
                           required=o.required)
        else:
            g.add_argument(flag(o.name), dest=f"model__{o.name}", type=o.type, default=None,
                           help=text, required=o.required, metavar=o.type.__name__.upper())
        names.append(o.name)
    return names


def add_data_source(p, cls, required: bool = True) -> None:
    kind = data_kind(declared(cls, "data"))
    g = p.add_argument_group(f"data ({kind.name})")
    src = g.add_mutually_exclusive_group(required=required)
    src.add_argument("--task", choices=kind.tasks, help="a built-in task")
    if kind.data_dir_help:
        src.add_argument("--data-dir", help=kind.data_dir_help)
    g.add_argument("--task-seed", type=int, default=0, help="seed of the task generator")
    for name, (default, text, typ) in kind.options.items():
        if typ is bool:
            g.add_argument(flag(name), dest=f"data__{name}", action="store_true", default=None,
                           help=text)
        else:
            g.add_argument(flag(name), dest=f"data__{name}", type=typ, default=None,
                           help=f"{text} (default: {default})", metavar=typ.__name__.upper())


def add_training(p, cls) -> None:
    defaults = training_options(cls)
    g = p.add_argument_group(f"training (defaults for {cls.__name__})")
    for name, typ in _TYPES.items():
        kw = {"choices": list(LR_SCHEDULES)} if name == "lr_schedule" else {}
        if not kw:
            kw["metavar"] = typ.__name__.upper()
        g.add_argument(flag(name), dest=f"train__{name}", type=typ, default=None,
                       help=f"{TRAINING_HELP[name]} (default: {defaults[name]})", **kw)
    add_backend(g)
    add_device(g, per_job=True)
    add_method_options(p, cls)
    g.add_argument("--devices", type=int, default=1,
                   help="numpyro: data-parallel SVI, each batch sharded over N JAX devices")


def add_method_options(p, cls) -> None:
    """For a model with global latents, the options of the methods that infer them, each
    declared once in :data:`~ppl_attention.core.method_specs.METHOD_OPTIONS` (``wordalign``
    reads the same declarations); a method refuses one it does not take."""
    from ..common.contract import global_latents
    from ..core.method_specs import GLOBAL_METHODS, METHOD_OPTIONS, options_help

    if not global_latents(cls):
        add_alignment_method_options(p, cls)
        return
    g = p.add_argument_group("method options (the methods for global latents)")
    used = {k for m in GLOBAL_METHODS.values() if m.serves("train") for k in m.options["train"]}
    for name, o in METHOD_OPTIONS.items():
        if name in used:
            g.add_argument(o.flag, dest=f"method__{name}", type=o.kind, default=None,
                           metavar=o.kind.__name__.upper(), help=options_help(name, "train"))


def add_alignment_method_options(p, cls) -> None:
    """The options of the alignment methods (a relaxation's temperature and noise, SparseMAP's
    slots, α-entmax's α), each declared once in
    :data:`~ppl_attention.core.method_specs.METHOD_OPTIONS`; a method refuses one it does not
    take, and ``compare`` one that none of its methods takes. A model option of the same name
    keeps its flag."""
    from ..core.method_specs import ALIGNMENT_OPTIONS, METHOD_OPTIONS, METHOD_SPECS

    taken = set(model_options(cls))
    g = p.add_argument_group("method options (the alignment methods: relaxations, SparseMAP, "
                             "entmax)")
    for name in ALIGNMENT_OPTIONS:
        if name in taken:
            continue
        o = METHOD_OPTIONS[name]
        takers = [f"{m} {spec.options[name]}" for m, spec in METHOD_SPECS.items()
                  if name in spec.options]
        text = f"{o.help} (default: {', '.join(takers)})"
        if o.kind is bool:
            g.add_argument(o.flag, dest=f"method__{name}", action=argparse.BooleanOptionalAction,
                           default=None, help=text)
        elif o.kind is str:
            g.add_argument(o.flag, dest=f"method__{name}", choices=o.choices, default=None,
                           help=text)
        else:
            g.add_argument(o.flag, dest=f"method__{name}", type=o.kind, default=None,
                           metavar=o.kind.__name__.upper(), help=text)


def add_device(p, per_job: bool = False) -> None:
    p.add_argument("--device", default="cpu", metavar="DEVICE",
                   help=DEVICE_HELP + ("; compare/sweep: one device per job, jobs spread over "
                                       "the GPUs" if per_job else ""))


def add_backend(p, what: str = "the model") -> None:
    p.add_argument("--backend", choices=list(BACKENDS), default=None,
                   help=f"run {what} under Pyro (torch) or NumPyro (jax.jit): a NumPyro model "
                   f"runs under numpyro, a Pyro model under pyro or its NumPyro twin (default: "
                   f"the backend the model is written for)")


def add_model_flag(p, default: str | None = "seq2seq") -> None:
    from ..common.registry import MODELS

    p.add_argument("--model", default=default,
                   help=f"a registry name ({', '.join(MODELS)}) or your own: "
                   f"path/to/file.py:ClassName or package.module:ClassName"
                   + (f" (default {default})" if default else ""))


def peek_model(argv: list[str], default: str = "seq2seq") -> str:
    """The value of ``--model`` in ``argv`` (before the full parser, whose options depend on
    it)."""
    for i, a in enumerate(argv):
        if a == "--model" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--model="):
            return a.split("=", 1)[1]
    return default


def experiment_from_args(args):
    """An :class:`~ppl_attention.tools.experiment.Experiment` from parsed options."""
    from ..tools.experiment import Experiment

    def group(prefix):
        return {k[len(prefix):]: v for k, v in vars(args).items()
                if k.startswith(prefix) and v is not None}

    return Experiment(model=args.model, model_options=group("model__"),
                      task=getattr(args, "task", None), data_dir=getattr(args, "data_dir", None),
                      task_seed=getattr(args, "task_seed", 0), data_options=group("data__"),
                      training=group("train__"), method_options=group("method__"),
                      backend=args.backend,
                      devices=getattr(args, "devices", 1),
                      device=getattr(args, "device", "cpu"),
                      calibrate=getattr(args, "calibrate", False),
                      resume=getattr(args, "resume", False),
                      checkpoint_every=getattr(args, "checkpoint_every", None))


def known_kinds() -> str:
    return ", ".join(DATA_KINDS)


def eprint(*a) -> None:
    print(*a, file=sys.stderr)


def add_posterior(p) -> None:
    """``--posterior default|importance`` and its draws and threshold (see
    :mod:`ppl_attention.common.importance_weights`)."""
    from ..common.importance_weights import DEFAULT_SAMPLES, KHAT_THRESHOLD, POSTERIORS

    p.add_argument("--posterior", choices=POSTERIORS, default="default",
                   help="the posterior the tool reads: default (the exact one where the model "
                   "has it, else the guide) or importance (the guide corrected by "
                   "Pareto-smoothed importance sampling, with k̂ per sentence)")
    p.add_argument("--importance-samples", type=int, metavar="K",
                   help=f"draws of the guide per sentence for --posterior importance (default "
                   f"{DEFAULT_SAMPLES})")
    p.add_argument("--khat-threshold", type=float,
                   help=f"k̂ above which a sentence's corrected posterior is flagged unreliable "
                   f"(default {KHAT_THRESHOLD})")


def posterior_options(args) -> dict | None:
    """``{"samples": K, "threshold": t}`` for ``--posterior importance``, None for the default
    posterior; the importance options without it are refused (they would be ignored)."""
    from ..common.importance_weights import DEFAULT_SAMPLES, KHAT_THRESHOLD, check_samples

    given = [f for f, v in (("--importance-samples", args.importance_samples),
                            ("--khat-threshold", args.khat_threshold)) if v is not None]
    if args.posterior != "importance":
        if given:
            raise UserError(f"{given[0]} applies to --posterior importance only")
        return None
    k = check_samples(DEFAULT_SAMPLES if args.importance_samples is None
                      else args.importance_samples)
    t = KHAT_THRESHOLD if args.khat_threshold is None else args.khat_threshold
    if not 0.0 < t < 10.0:
        raise UserError(f"--khat-threshold must be a number in (0, 10), got {t}")
    return {"samples": k, "threshold": t}
