"""``ppl-attention check-twin PYRO_MODEL NUMPYRO_MODEL``: a Pyro model and its NumPyro twin give
the same loss and gradients on the same weights and draws, for every method both train."""

from __future__ import annotations

import sys

from ..common.contract import declared, model_backend
from ..common.devices import jax_default_device, torch_device
from ..common.registry import load_model_class
from ..core import jsonio
from ..core.errors import UserError
from ..data.kinds import data_kind
from .options import add_device, model_options

DEFAULT_TOLERANCE = 1e-4


def add_parser(sub) -> None:
    p = sub.add_parser(
        "check-twin", help="Pyro model = NumPyro twin: loss and gradients, every method",
        description="Build both models with the same options, move the Pyro model's weights to "
        "the NumPyro one by parameter name (twin_parameters where names or layouts differ), and "
        "compare one step's loss and gradients on the same batch — at the same draws where the "
        "method samples the alignment — for every method both train. Fails above --tolerance.")
    p.add_argument("pyro_model", help="the Pyro model: a registry name, path/to/file.py:Class "
                   "or module:Class")
    p.add_argument("numpyro_model", help="its NumPyro twin, the same forms")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--task", help="a built-in task of the models' data kind")
    src.add_argument("--data-dir", help="a folder with train.tsv (…)")
    p.add_argument("--task-seed", type=int, default=0)
    p.add_argument("--methods", help="comma-separated (default: every method both train)")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                   help="a model option, the same for both (repeatable)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0, help="weights and draws")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help=f"largest relative difference that passes (default {DEFAULT_TOLERANCE})")
    p.add_argument("--json", action="store_true")
    add_device(p)
    p.set_defaults(fn=cmd_check_twin)


def _options(cls, given: list[str]) -> dict:
    known = model_options(cls)
    out = {}
    for item in given:
        name, eq, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not eq or name not in known:
            raise UserError(f"--option {item!r}: expected NAME=VALUE with NAME one of "
                            f"{', '.join(known) or 'none'} ({cls.__name__}'s options)")
        typ = known[name].type
        try:
            out[name] = (text.lower() in ("1", "true", "yes")) if typ is bool else typ(text)
        except ValueError:
            raise UserError(f"--option {item!r}: {name} takes a {typ.__name__}") from None
    return out


def cmd_check_twin(args) -> int:
    from ..common.backends import get_backend

    get_backend("numpyro")  # the extra installed, before any work
    from ..tools.parity import twin_methods, twin_parity

    pyro_cls = load_model_class(args.pyro_model)
    numpyro_cls = load_model_class(args.numpyro_model)
    for cls, want, where in ((pyro_cls, "pyro", args.pyro_model),
                             (numpyro_cls, "numpyro", args.numpyro_model)):
        if model_backend(cls) != want:
            raise UserError(f"{where}: {cls.__name__} is a {model_backend(cls)} model; "
                            f"check-twin takes the Pyro model first, then the NumPyro one")
    if declared(pyro_cls, "data") != declared(numpyro_cls, "data"):
        raise UserError(f"{pyro_cls.__name__} reads {declared(pyro_cls, 'data')} data, "
                        f"{numpyro_cls.__name__} {declared(numpyro_cls, 'data')}: not twins")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {args.batch_size}")
    if not args.tolerance > 0:
        raise UserError(f"--tolerance must be > 0, got {args.tolerance}")
    options = _options(pyro_cls, args.option)
    both = twin_methods(pyro_cls, numpyro_cls)
    methods = args.methods.split(",") if args.methods else both
    bad = [m for m in methods if m not in both]
    if bad:
        raise UserError(f"--methods {','.join(bad)}: not trained by both models (both train: "
                        f"{', '.join(both)})")
    device = torch_device(args.device)
    args.context.enter_context(jax_default_device(args.device))
    kind = data_kind(declared(pyro_cls, "data"))
    data = kind.load(kind.source(args.task, args.data_dir, args.task_seed))
    batch = kind.batches(data.train, data.vocabs, args.batch_size)[0]
    rows = []
    for method in methods:
        print(f"[check-twin] {method}", file=sys.stderr)
        try:
            r = twin_parity(pyro_cls, numpyro_cls, data.dims, options, batch, method, args.seed,
                            device)
            r["ok"] = max(r["loss_rel"], r["grad_rel"]) <= args.tolerance
        except Exception as e:  # a model failing under one method: report it, go on
            r = {"method": method, "ok": False, "error": f"{type(e).__name__}: {e}"}
        rows.append(r)
    if args.json:
        print(jsonio.dumps(rows, indent=1))
    else:
        print(f"{pyro_cls.__name__} (Pyro) against {numpyro_cls.__name__} (NumPyro), batch of "
              f"{batch.size}, seed {args.seed}; relative differences, tolerance "
              f"{args.tolerance:g}\n")
        print("| method | draws | loss Pyro | loss NumPyro | loss rel. | gradient rel. | "
              "largest at | |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            if "error" in r:
                print(f"| {r['method']} | | | | | | | FAIL: {r['error']} |")
                continue
            print(f"| {r['method']} | {'same' if r['sampled'] else '—'} | "
                  f"{r['loss_pyro']:.6g} | {r['loss_numpyro']:.6g} | {r['loss_rel']:.1e} | "
                  f"{r['grad_rel']:.1e} | {r['worst']} | {'pass' if r['ok'] else 'FAIL'} |")
    failed = [r["method"] for r in rows if not r["ok"]]
    if failed:
        print(f"error: {len(failed)} of {len(rows)} methods differ beyond {args.tolerance:g}: "
              f"{', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
