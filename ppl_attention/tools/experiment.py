"""One experiment = one model class, its options, a data source, training options and a backend;
``train_one`` trains it by one method and seed into a run directory and scores it. The command
line's ``train``, every job of ``compare`` / ``sweep`` (in this process, worker processes or on
Ray) and resumed runs all go through here, for built-in models and users' models alike.

Below both backends: everything backend-specific comes from the backend's module
(:mod:`ppl_attention.common.backends`), so a NumPyro model trains and is scored without torch
loading.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from ..common.backends import get_backend
from ..common.contract import capabilities, check_method, declared, model_backend
from ..common.devices import describe, jax_default_device, torch_device
from ..common.evaluation import evaluate
from ..common.registry import load_model_class
from ..common.runs import COMPLETE, PARTIAL, Run, check_not_diverged
from ..core.divergence import Diverged, check_figure, hint
from ..core.errors import MissingCapability, UserError
from ..core.method_specs import (
    ALIGNMENT_OPTIONS,
    METHOD_OPTIONS,
    METHOD_SPECS,
    is_global_method,
    method_spec,
)
from ..core.training import TRAINING_DEFAULTS, training_options
from ..data.kinds import data_kind

__all__ = ["Experiment", "train_one", "check_experiment", "report", "eval_batches",
           "best_weights", "ReportFailed", "check_report"]


@dataclass
class Experiment:
    """What a run is made of (everything but the method and the seed).

    ``model``: a registry name or ``path/to/file.py:Class`` / ``module:Class``;
    ``model_options``: its constructor's options (None values: the model's defaults);
    ``task`` / ``data_dir`` / ``task_seed`` / ``data_options``: the data source;
    ``training``: training options (None: the model's defaults, else the package's);
    ``method_options``: a method for global latents' own (``chains``, ``warmup``, …:
    :data:`~ppl_attention.core.method_specs.METHOD_OPTIONS`; the method's defaults where
    absent);
    ``backend``, ``device``, ``devices``: where it runs (``backend`` None: the model's own —
    ``pyro`` for a Pyro model, ``numpyro`` for a NumPyro model; ``device``: cpu, cuda, cuda:N or
    auto, :mod:`ppl_attention.common.devices`; ``devices``: NumPyro's data-parallel device count);
    ``resume``, ``checkpoint_every``: a long run; ``calibrate``: a sweep also calibrates each
    run's guide by simulation (:mod:`ppl_attention.analysis.sbc`);
    ``model_source``: the bytes of a user's model file shipped with a Ray job."""

    model: str = "seq2seq"
    model_options: dict = field(default_factory=dict)
    task: str | None = None
    data_dir: str | None = None
    task_seed: int = 0
    data_options: dict = field(default_factory=dict)
    training: dict = field(default_factory=dict)
    method_options: dict = field(default_factory=dict)
    backend: str | None = None
    devices: int = 1
    device: str = "cpu"
    calibrate: bool = False
    resume: bool = False
    checkpoint_every: int | None = None
    model_source: bytes | None = None
    data_dir_record: str | None = None

    def with_settings(self, settings) -> Experiment:
        """A copy with ``(key, value)`` settings in place: a training option, a model option,
        a data option, or ``backend`` / ``devices`` / ``task_seed``."""
        exp = dataclasses.replace(self, model_options=dict(self.model_options),
                                  data_options=dict(self.data_options),
                                  training=dict(self.training),
                                  method_options=dict(self.method_options))
        settings = list(settings)
        data_options = data_kind(declared(self.model_class(), "data")).options if settings else {}
        for k, v in settings:
            if k in ("backend", "devices", "device", "task_seed"):
                setattr(exp, k, v)
            elif k in TRAINING_DEFAULTS:
                exp.training[k] = v
            elif k in METHOD_OPTIONS:
                exp.method_options[k] = v
            elif k in data_options:
                exp.data_options[k] = v
            else:
                exp.model_options[k] = v
        return exp

    def model_class(self):
        return load_model_class(self.model, source=self.model_source)

    def backend_name(self) -> str:
        """``backend``, or the one the model class is written for."""
        return self.backend or model_backend(self.model_class())

    def source(self) -> dict:
        kind = data_kind(declared(self.model_class(), "data"))
        return kind.source(self.task, self.data_dir, self.task_seed, **self.data_options)


def _model_spec(exp: Experiment) -> str:
    """How the run directory records the model: a registry name as is, a file by its full
    path."""
    location, colon, name = exp.model.rpartition(":")
    if colon and (location.endswith(".py") or "/" in location):
        return f"{Path(location).expanduser().resolve()}:{name}"
    return exp.model


def check_experiment(exp: Experiment, methods: list[str]) -> None:
    """Everything that can be refused before any work: the model class and its contract, the
    data source, the model's options, each method for this model and backend."""
    cls = exp.model_class()
    exp.source()
    backend = get_backend(exp.backend_name())
    describe(exp.device, exp.backend_name())  # a GPU asked for and absent: refused now
    alignment_given = {k: v for k, v in exp.method_options.items() if k in ALIGNMENT_OPTIONS}
    for m in methods:
        backend.check(cls, m)
        if is_global_method(m):
            backend.check_global_options(m, exp.training, {
                k: v for k, v in exp.method_options.items() if k not in ALIGNMENT_OPTIONS})
            continue
        spec = method_spec(m)
        given = {k: v for k, v in exp.method_options.items() if k in spec.options}
        wrong = sorted(set(exp.method_options) - set(ALIGNMENT_OPTIONS))
        if wrong:
            raise UserError(f"{METHOD_OPTIONS[wrong[0]].flag} is an option of the methods for "
                            f"global latents; --method {m} is an alignment method")
        spec.resolve_options(given)  # bad values: refused now
        check_method(cls, spec)
    aligners = [m for m in methods if not is_global_method(m)]
    if len(aligners) == 1:  # one method: refused naming the options it takes
        method_spec(aligners[0]).resolve_options(alignment_given)
    taken = {k for m in aligners for k in method_spec(m).options}
    idle = sorted(set(alignment_given) - taken)
    if idle:
        takers = [n for n, sp in METHOD_SPECS.items() if idle[0] in sp.options]
        raise UserError(f"{METHOD_OPTIONS[idle[0]].flag} applies to none of the methods "
                        f"{', '.join(methods)} (it is an option of {', '.join(takers)})")
    preflight = getattr(backend, "preflight", None)
    alignment_methods = [m for m in methods if not is_global_method(m)]
    if callable(preflight) and alignment_methods:  # a NumPyro model's programs run once
        preflight(cls, alignment_methods, exp)
    opts = training_options(cls, **exp.training)
    if opts["batch_size"] < 1 or opts["steps"] < 1:
        raise UserError(f"--steps and --batch-size must be at least 1 (got {opts['steps']}, "
                        f"{opts['batch_size']})")
    if exp.task_seed and exp.data_dir is not None:
        raise UserError("--task-seed seeds a built-in --task's generator, not a --data-dir")
    m_fams = [method_spec(m).family_spec for m in methods if not is_global_method(m)]
    if "kl_weight" in exp.training and m_fams and all(f.deterministic for f in m_fams):
        raise UserError(f"--kl-weight weighs the KL of a latent alignment; "
                        f"{', '.join(methods)} has none")
    if exp.devices != 1 and exp.backend_name() != "numpyro":
        raise UserError("--devices shards batches over JAX devices: use --backend numpyro "
                        "(Pyro data parallelism is torchrun + DistributedDataParallel)")


def method_options_of(exp: Experiment, method: str) -> dict:
    """The options of ``exp`` that alignment method ``method`` takes (in a compare of several
    methods, each takes its own; :func:`check_experiment` refused those no method takes)."""
    spec = method_spec(method)
    return {k: v for k, v in exp.method_options.items() if k in spec.options}


def eval_batches(kind, split, vocabs: dict, model, source: dict, batch_size: int = 64) -> list:
    return kind.batches(split, vocabs, batch_size, model=model, source=source)


def report(run: Run, split, source: dict, *, backend: str = "pyro", iwae_k: int | None = None,
           samples: int | None = None, beam: int = 1, ensemble: list | None = None,
           importance: dict | None = None, seed: int = 0) -> dict:
    """The report of ``run`` on ``split`` of its data kind: for token data (pairs, sequences)
    :func:`~ppl_attention.pyro.inference.evaluate.evaluate` plus the model's ``extra_report``; for
    labelled data (images, graphs) the model's ``extra_report`` (accuracy, calibration).
    ``seed``: the Monte Carlo estimates' (the same figures on every call with the same seed).

    ``extra_report`` (docs/architecture.md) is called as ``extra_report(batches)`` — plus
    ``iwae_k=K`` when ``--iwae-k`` is given and it names that parameter — for token data, and
    ``extra_report(split, samples=N)`` for labelled data; it returns a dict of JSON numbers. A
    NumPyro model's is run with its trained parameters substituted (its ``numpyro.param`` sites
    read them) under ``handlers.seed``."""
    model = run.model
    kind = data_kind(declared(model, "data"))
    extra = get_backend(run.backend).extra_report(run, seed)
    if is_global_method(run.method):  # posterior draws of global latents: Bayesian report
        if iwae_k is not None or beam != 1 or ensemble or samples is not None or importance:
            raise UserError(f"--iwae-k, --beam, --ensemble, --samples and --posterior "
                            f"importance do not apply to a {run.method} run: its NLL is the "
                            f"posterior predictive")
        batches = eval_batches(kind, split, {"src_vocab": run.src_vocab,
                                             "tgt_vocab": run.tgt_vocab}, model, source)
        return get_backend("numpyro").global_report(run, batches, getattr(split, "gold", None))
    if not kind.token_data:
        if iwae_k is not None or beam != 1 or ensemble or importance:
            raise UserError(f"--iwae-k, --beam, --ensemble and --posterior importance score "
                            f"token data; {type(model).__name__} reads {kind.name} data")
        if not callable(extra):
            raise MissingCapability(f"{type(model).__name__} reads {kind.name} data and has no "
                                    f"extra_report(test, samples) to score it")
        return {"method": run.method, **_checked_extra(model, extra(split, samples=samples or 20))}
    if samples is not None:
        raise UserError("--samples sets the posterior draws of ECE/PAvPU (images and graph "
                        "models)")
    takes_k = callable(extra) and "iwae_k" in _parameters(model.extra_report)
    if iwae_k is not None and not takes_k and (
            importance or "exact-likelihood" in capabilities(model)):
        raise UserError("--iwae-k sets the draws of the IWAE bound, which this evaluation does "
                        "not compute: " + ("--posterior importance draws "
                                            "--importance-samples" if importance else
                                            f"the NLL of {type(model).__name__} ({run.method}, "
                                            f"{model.family.name} family) is exact"))
    batches = eval_batches(kind, split, {"src_vocab": run.src_vocab,
                                         "tgt_vocab": run.tgt_vocab}, model, source)
    out = evaluate(run, batches, gold=getattr(split, "gold", None),
                   log_likelihood=getattr(split, "log_likelihood", None), iwae_k=iwae_k or 10,
                   backend=backend, references=getattr(split, "references", None), beam=beam,
                   ensemble=ensemble, gold_trees=getattr(split, "trees", None),
                   decode_pairs=split.pairs if getattr(split, "decode_metrics", False) else None,
                   importance=importance, seed=seed, segments=getattr(split, "segments", False),
                   frames=getattr(split, "frames", False))
    if callable(extra):
        out.update(_checked_extra(model, extra(batches, **({"iwae_k": iwae_k} if iwae_k and
                                                           takes_k else {}))))
    return out


def _parameters(fn) -> set[str]:
    import inspect

    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _checked_extra(model, rep) -> dict:
    """A model's ``extra_report`` result, refused unless it is a dict."""
    if not isinstance(rep, dict):
        raise UserError(f"{type(model).__name__}.extra_report returned {type(rep).__name__}; it "
                        f"returns a dict of named figures (docs/architecture.md)")
    return rep


def train_one(exp: Experiment, method: str, seed: int, out: Path, progress: bool = True,
              distributed=None, checked: bool = False) -> tuple[Run, dict | None]:
    """Train ``exp`` by ``method`` with ``seed`` into the run directory ``out`` (resuming it
    when ``exp.resume`` and it holds a run), then score the best weights on the test split.
    ``checked``: the caller has run :func:`check_experiment` on ``exp`` with this method
    (``train`` and ``compare`` do, before any work); otherwise it runs here, once."""
    if not checked:
        check_experiment(exp, [method])
    cls = exp.model_class()
    kind = data_kind(declared(cls, "data"))
    source = exp.source()
    if exp.data_dir_record:
        source["data_dir"] = exp.data_dir_record
    if is_global_method(method):
        return _train_global(exp, cls, kind, source, method, seed, out, progress)
    backend_name = exp.backend_name()
    backend = get_backend(backend_name)
    opts = training_options(cls, **exp.training)
    data = kind.load(exp.source())
    resume = None
    out = Path(out)
    if exp.resume:
        check_not_diverged(out)
    if exp.resume and ((out / COMPLETE).exists() or (out / PARTIAL).exists()):
        resume = Run.load(out, which="last", partial=True, model_class=cls)
    device = describe(exp.device, backend_name)  # what the run directory records
    native = model_backend(cls) == "numpyro"
    torch_dev = torch_device(exp.device) if backend_name == "pyro" else None
    if resume is not None and torch_dev is not None:
        resume.model.to(torch_dev)
    if not native:  # a Pyro model draws its initial weights from torch's generator
        import torch

        torch.manual_seed(seed)
    method_options = method_options_of(exp, method)
    if resume is None:
        family = backend.method_family(method, cls, method_options) if native else \
            get_backend("pyro").method_family(method, cls, method_options)
        try:
            model = cls(**data.dims, **exp.model_options, family=family)
        except TypeError as e:
            raise UserError(f"--model {exp.model}: {e}") from None
        if not isinstance(getattr(model, "config", None), dict):  # not an AlignmentModel
            model.config = {**data.dims, **exp.model_options}
        if torch_dev is not None and not native:
            model.to(torch_dev)
    else:
        model = resume.model
    train = kind.batches(data.train, data.vocabs, opts["batch_size"], shuffle=True, seed=seed,
                         model=model, source=source)
    valid_split = data.valid if data.valid is not None else \
        (data.test if kind.token_data else None)
    valid = None if valid_split is None else eval_batches(kind, valid_split, data.vocabs, model,
                                                          source)
    if valid is None and "valid_every" in exp.training:
        raise UserError(f"--valid-every: {kind.name} data has no validation split (the run "
                        f"keeps its last weights)")
    extra = {}
    if distributed is not None:
        if backend_name != "pyro" or exp.devices != 1:
            raise UserError("torchrun launches Pyro data parallelism; NumPyro shards batches "
                            "over JAX devices in one process (--backend numpyro --devices N)")
        distributed.check_batches(train)
        distributed.start()
        extra["distributed"] = distributed
    if backend_name == "numpyro":
        if exp.devices != 1:
            backend.check_devices(exp.devices, max(b.size for b in train))
        extra["devices"] = exp.devices
    train_opts = {k: v for k, v in exp.training.items() if k != "batch_size"}  # fit fills the
    # rest from the model's defaults
    place = jax_default_device(exp.device) if backend_name == "numpyro" else \
        contextlib.nullcontext()
    with place:
        try:
            run = backend.fit(model, train, method, seed=seed,
                              src_vocab=data.vocabs.get("src_vocab"),
                              tgt_vocab=data.vocabs.get("tgt_vocab"), valid=valid,
                              resume=resume, progress=progress,
                              out=out if exp.checkpoint_every else None,
                              checkpoint_every=exp.checkpoint_every,
                              config={"data": source, "batch_size": opts["batch_size"],
                                      "device": device},
                              model_spec=_model_spec(exp), method_options=method_options,
                              **train_opts, **extra)
        except Diverged as stop:
            if stop.run is not None and (distributed is None or distributed.main):
                stop.run.save(out, diverged=stop)
            raise
        if distributed is not None and not distributed.main:
            return run, None  # rank 0 evaluates and writes the run directory
        run.save(out)  # the trained run first: a report that fails below loses nothing
        with best_weights(run):
            try:
                rep = report(run, data.test, source, backend=backend_name)
            except (UserError, Diverged):
                raise
            except Exception as e:
                raise ReportFailed(out, e) from e
    for key in ("ms_per_step", "ms_per_step_compiled", "compilations", "compile_seconds"):
        if key in run.extra:
            rep[key] = run.extra[key]
    run.extra["test_report"] = rep
    check_report(run, rep, out, discrete=kind.discrete_observations)
    run.save(out)  # the last weights, for --resume
    return run, rep


class ReportFailed(Exception):
    """The run trained and is written (complete, usable by every tool), but its test report
    failed — in the model's own ``extra_report`` or a scoring step. Not bad input: the cause is
    chained, its traceback kept."""

    def __init__(self, out, cause: BaseException):
        self.out, self.cause = out, cause
        where = "the model's extra_report" if _in_extra_report(cause) else "the test report"
        super().__init__(f"{out}: the run is trained and written (COMPLETE, usable by every "
                         f"tool); {where} failed: {type(cause).__name__}: {cause}")


def _in_extra_report(e: BaseException) -> bool:
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "extra_report":
            return True
        tb = tb.tb_next
    return False


def check_report(run: Run, rep: dict, out, discrete: bool = True) -> None:
    """A test report whose NLL/token is not finite, or impossible for discrete observations,
    marks the run DIVERGED (written to ``out``) and raises
    :class:`~ppl_attention.core.divergence.Diverged`."""
    if "nll_per_token" not in rep:
        return
    try:
        check_figure(run.step, run.method, "test NLL per token", rep["nll_per_token"],
                     discrete=discrete, advice=hint(method_spec(run.method), run.config.get("lr")))
    except Diverged as stop:
        stop.kept, stop.run = run.step, run
        run.extra["diverged"] = stop.record()
        run.save(out, diverged=stop)
        raise


def _train_global(exp: Experiment, cls, kind, source: dict, method: str, seed: int, out: Path,
                  progress: bool) -> tuple[Run, dict]:
    """A method for global latents (:mod:`ppl_attention.core.method_specs`): the posterior of
    the globals from every training pair, then the posterior-predictive report on the test
    split."""
    backend = get_backend("numpyro")
    backend.check(cls, method)
    if exp.resume or exp.checkpoint_every:
        raise UserError(f"--resume / --checkpoint-every: {method} infers from the whole training "
                        f"set at once; it has no steps to resume")
    if exp.devices != 1:
        raise UserError(f"--devices: {method} runs its chains on one device")
    data = kind.load(exp.source())
    try:
        model = cls(**data.dims, **exp.model_options, family=backend.method_family(method, cls))
    except TypeError as e:
        raise UserError(f"--model {exp.model}: {e}") from None
    batch_size = training_options(cls, **exp.training)["batch_size"]
    train = kind.batches(data.train, data.vocabs, batch_size, model=model, source=source)
    test = eval_batches(kind, data.test, data.vocabs, model, source)
    training = {k: v for k, v in exp.training.items() if k != "batch_size"}
    with jax_default_device(exp.device):
        run = backend.fit_global(model, train, method, seed=seed,
                                 src_vocab=data.vocabs.get("src_vocab"),
                                 tgt_vocab=data.vocabs.get("tgt_vocab"), progress=progress,
                                 config={"data": source, "batch_size": batch_size,
                                         "device": describe(exp.device, "numpyro")},
                                 model_spec=_model_spec(exp),
                                 method_options=exp.method_options, **training)
        rep = backend.global_report(run, test, getattr(data.test, "gold", None))
    run.extra["test_report"] = rep
    run.save(out)
    return run, rep


@contextlib.contextmanager
def best_weights(run: Run):
    """The run's best-validation weights in place while the block runs, its last ones
    after."""
    if model_backend(run.model) == "numpyro":
        last = run.params
        run.params = run.extra.get("best_model", last)
        try:
            yield run
        finally:
            run.params = last
        return
    last = copy.deepcopy(run.model.state_dict())
    run.model.load_state_dict(run.extra.get("best_model", last))
    try:
        yield run
    finally:
        run.model.load_state_dict(last)
