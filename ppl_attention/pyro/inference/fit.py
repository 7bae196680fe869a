"""Training under Pyro: one loop for every model that meets the contract
(:mod:`ppl_attention.pyro.models.base`) and every method of the registry — Adam on the method's
objective, gradient clipping, the lr schedule, the KL weight of annealed methods, validation,
best weights, periodic checkpoints, resume, and ``torchrun`` data parallelism."""

from __future__ import annotations

import copy
import random
import time

import pyro
import torch
from pyro import poutine

from ...common.runs import Run
from ...core.divergence import Diverged, check_figure, check_step, hint
from ...core.errors import NonFiniteScores, UserError
from ...core.method_specs import method_spec
from ...core.progress import progress_bar
from ...core.schedules import LR_SCHEDULES, batch_order
from ...core.training import check_resume_steps, training_options
from ...data.kinds import data_kind
from ..models.base import check_method, declared
from ..models.device import model_device
from .evaluate import nll_per_token
from .methods import Method, differentiable_loss, get_method, loss_and_grads


#: training options every model takes, with the package's defaults (a model's
#: ``training_defaults`` replace them for that model)
class MethodObjective:
    """A registered method on a model: its ELBO estimate at a step (KL weight η·λ(t) on the
    alignment sites, the model's own step arguments) and the validation score."""

    def __init__(self, method: str | Method, model, kl_weight: float = 1.0,
                 anneal_rho: float | None = None):
        self.method = get_method(method) if isinstance(method, str) else method
        self.elbo = self.method.elbo(declared(model, "max_plate_nesting"))
        self.kl_weight, self.anneal_rho = kl_weight, anneal_rho

    def kl(self, step: int) -> float:
        return self.method.kl_scale(step, self.kl_weight, self.anneal_rho)

    @staticmethod
    def step_kwargs(model, step: int) -> dict:
        fn = getattr(model, "step_arguments", None)
        return dict(fn(step)) if callable(fn) else {}

    def loss_and_grads(self, model, batch, step: int) -> float:
        return loss_and_grads(self.method, self.elbo, model, batch, step, self.kl(step),
                              self.step_kwargs(model, step))

    def differentiable_loss(self, model, batch, step: int):
        return differentiable_loss(self.method, self.elbo, model, batch, step, self.kl(step),
                                   self.step_kwargs(model, step))

    def validate(self, run: Run, batches: list) -> float:
        own = getattr(run.model, "validation_loss", None)
        return own(batches) if callable(own) else nll_per_token(run, batches)


def initialize_lazy_parameters(model, objective: MethodObjective, batch) -> None:
    """A family that builds its parameters on first use (a BAM prior network made without
    ``key_dim``) gets them now, by one run of the model (no gradient, the RNG state restored),
    so that the optimizer sees them."""
    lazy = [m for m in model.modules() if getattr(m, "prior_kind", None) == "contextual"
            and getattr(m, "prior_net", 1) is None]
    if not lazy:
        return
    kw = objective.step_kwargs(model, 0)
    with torch.random.fork_rng(), torch.no_grad(), poutine.block():
        model.model(batch, enumerate_z=False, kl_scale=1.0, **kw)


def fit(model, train: list, method: str, steps: int | None = None, seed: int = 0, *,
        src_vocab=None, tgt_vocab=None, valid: list | None = None, lr: float | None = None,
        clip: float | None = None, valid_every: int | None = None, resume: Run | None = None,
        progress: bool = True, out=None, config: dict | None = None,
        lr_schedule: str | None = None, checkpoint_every: int | None = None,
        distributed=None, kl_weight: float | None = None, anneal_rho: float | None = None,
        weight_decay: float | None = None, model_spec: str | None = None,
        method_options: dict | None = None) -> Run:
    """Train ``model`` (any model meeting the contract) by ``method`` for ``steps`` steps, one
    batch a step, and return a :class:`Run`.

    Options left None take the model's ``training_defaults``, else
    :data:`TRAINING_DEFAULTS`. The batch for step i is fixed by (seed, i), so a run resumed
    from its directory continues with the identical next loss. Validation score (the model's
    ``validation_loss``, else NLL/token — exact where the model has the capability, IWAE-10
    otherwise) every ``valid_every`` steps; the best weights are kept in
    ``run.extra["best_model"]``.

    ``lr_schedule``: ``"constant"`` or ``"cosine"`` (lr·½(1 + cos(π·step/steps))); a function of
    the step alone, so resuming keeps it. ``kl_weight`` η and ``anneal_rho`` ρ: the KL weight
    η·sigmoid(t·ρ − 6) on the alignment sites of methods that anneal (BAM; ρ defaults to the
    method's), η otherwise. ``clip``: global gradient-norm clipping (0: none);
    ``weight_decay``: Adam's L2 term. ``checkpoint_every``: also save ``out`` every N steps,
    marked PARTIAL, so a run killed midway resumes from its last checkpoint.
    ``method_options``: the method's own (``temperature``, ``noise``, ``imle_lambda`` of a
    relaxation, ``max_active`` of SparseMAP, ``alpha`` of entmax:
    :data:`~ppl_attention.core.method_specs.METHOD_OPTIONS`), recorded in the run; those that
    set the family's parameters must be the family the model was built with (build it with
    ``get_method(method, method_options).family()``).

    ``distributed``: a :class:`~ppl_attention.pyro.inference.distributed.Distributed` (a
    ``torchrun`` launch): each rank differentiates its shard of every batch inside
    ``DistributedDataParallel`` — the same parameters, step by step, as one process on the
    whole batch; rank 0 alone validates, shows progress and writes ``out``.

    Divergence (:mod:`ppl_attention.core.divergence`): every step's loss and gradient norm are
    checked before the update, every validation NLL when it is computed; a non-finite or
    impossible one — or attention scores that stop being finite after training began — stops
    the run with :class:`~ppl_attention.core.divergence.Diverged`. The weights are those before
    the failing step; with ``out`` the run directory is written marked DIVERGED first.
    """
    opts = training_options(type(model), steps=steps, lr=lr, lr_schedule=lr_schedule,
                            valid_every=valid_every, kl_weight=kl_weight, anneal_rho=anneal_rho,
                            weight_decay=weight_decay, clip=clip)
    steps, lr, lr_schedule, clip = opts["steps"], opts["lr"], opts["lr_schedule"], opts["clip"]
    if lr_schedule not in LR_SCHEDULES:
        raise UserError(f"unknown lr_schedule {lr_schedule!r}; valid: {', '.join(LR_SCHEDULES)}")
    if not train:
        raise UserError("no training batches")
    if resume is not None and method_options is None:
        method_options = resume.config.get("method_options")
    family = getattr(model, "family", None)
    check_method(type(model), get_method(method), family)
    if family is not None and getattr(family, "spec", None) is not None:
        method_options = method_spec(method).options_of_family(method_options, family._config())
    m = get_method(method, method_options)
    if anneal_rho is not None and m.anneal_rho is None:
        raise UserError(f"--anneal-rho sets the KL annealing of methods that anneal it "
                        f"(bam-weibull, bam-lognormal), not of {method}")
    check_resume_steps(resume, steps, lr_schedule)
    pyro.clear_param_store()
    run = resume or Run(model, method, src_vocab, tgt_vocab, dict(config or {}),
                        model_spec=model_spec)
    run.config.update(dict(config or {}), lr=lr, clip=clip, seed=seed, steps=steps,
                      valid_every=opts["valid_every"], lr_schedule=lr_schedule,
                      kl_weight=opts["kl_weight"], weight_decay=opts["weight_decay"],
                      method_options=dict(m.options),
                      **({"anneal_rho": opts["anneal_rho"] or m.anneal_rho}
                         if m.anneal_rho is not None else {}))
    start = run.step
    device = model_device(model)
    if device.type != "cpu":  # batches follow the model (once, not every step)
        train = [b.to(device) for b in train]
    objective = MethodObjective(m, model, opts["kl_weight"], opts["anneal_rho"])
    if resume is None:
        pyro.set_rng_seed(seed)
        initialize_lazy_parameters(model, objective, train[0])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=opts["weight_decay"])
    if resume is not None:
        if resume.optimizer_state:
            optimizer.load_state_dict(resume.optimizer_state)
        torch.set_rng_state(resume.rng_state["torch"])
        if device.type == "cuda" and resume.rng_state.get("cuda") is not None:
            torch.cuda.set_rng_state_all(resume.rng_state["cuda"])
        random.setstate(_python_rng(resume.rng_state["python"]))
    best = run.extra.get("best_valid", float("inf"))
    step_fn = None
    if distributed is not None:
        if not distributed.main:  # rank 0 keeps the one-process random stream
            pyro.set_rng_seed((seed * 1_000_003 + distributed.rank * 7_919 + start) % 2**31)
        ddp = distributed.wrap(model, objective)

        def step_fn(batch, step):
            shard = distributed.shard(batch)
            surrogate, loss = ddp(shard, step)
            (surrogate * distributed.world).backward()  # DDP averages: W·(1/W)Σ_r = Σ_r
            total, n_tokens = distributed.all_sum(float(loss), shard.n_tokens)
            return total / n_tokens

        run.config["processes"] = distributed.world
        progress = progress and distributed.main
        valid = valid if distributed.main else None
        out = out if distributed.main else None
    model.train()
    bar = progress_bar(range(start, steps), disable=not progress, desc=method, leave=False)
    t0, tokens = time.perf_counter(), 0
    trained_before = run.extra.get("train_seconds", 0.0)  # earlier segments of a resumed run
    valid_every = opts["valid_every"]

    def snapshot(step: int) -> None:
        run.step = step
        run.extra.update(best_valid=best, train_seconds=trained_before + time.perf_counter() - t0)
        run.optimizer_state = optimizer.state_dict()
        run.rng_state = {"torch": torch.get_rng_state(), "python": list(random.getstate())}
        if device.type == "cuda":  # draws on a GPU come from its own generator
            run.rng_state["cuda"] = torch.cuda.get_rng_state_all()

    discrete = data_kind(declared(model, "data")).discrete_observations
    advice = hint(m.spec, lr)
    own_validation = callable(getattr(model, "validation_loss", None))

    def train_step(step: int, batch) -> float:
        for group in optimizer.param_groups:
            group["lr"] = lr * LR_SCHEDULES[lr_schedule](step, steps)
        optimizer.zero_grad()
        try:
            if step_fn is None:
                loss = objective.loss_and_grads(model, batch, step) / batch.n_tokens
            else:
                loss = step_fn(batch, step)
        except NonFiniteScores as e:  # weights training made: divergence, not bad input
            if step == start:
                raise
            raise Diverged(step + 1, method, "attention scores", "nan", hint=advice) from e
        except ValueError as e:  # torch's validation of a distribution's non-finite parameter
            if step == start or "invalid values" not in str(e):
                raise
            raise Diverged(step + 1, method, "a distribution's parameters", "nan",
                           hint=advice) from e
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip or float("inf"))
        check_step(step + 1, method, loss, float(norm), discrete=discrete, advice=advice,
                   first_loss=run.extra.get("first_loss"))
        run.extra.setdefault("first_loss", float(loss))
        optimizer.step()
        return loss

    for step in bar:
        epoch, pos = divmod(step, len(train))
        batch = train[batch_order(len(train), seed, epoch)[pos]]
        try:
            loss = train_step(step, batch)
        except Diverged as stop:
            _stop(run, stop, step, snapshot, out, model)
            raise
        tokens += batch.n_tokens
        record = {"step": step + 1, "train_loss": loss}
        kl = objective.kl(step)
        if kl != 1.0:
            record["kl_weight"] = kl
        if valid and ((step + 1) % valid_every == 0 or step + 1 == steps):
            model.eval()
            with torch.random.fork_rng():  # validation draws must not shift the training RNG
                record["valid_nll"] = v = objective.validate(run, valid)
            model.train()
            try:
                check_figure(step + 1, method, "validation loss" if own_validation
                             else "validation NLL per token", v,
                             discrete=discrete and not own_validation, advice=advice)
            except Diverged as stop:
                run.history.append(record)
                _stop(run, stop, step + 1, snapshot, out, model)
                raise
            if v < best:
                best = v
                run.extra["best_model"] = copy.deepcopy(model.state_dict())
                run.extra["best_step"] = step + 1
        run.history.append(record)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens / (time.perf_counter() - t0):.0f}")
        if out is not None and checkpoint_every and (step + 1) % checkpoint_every == 0 \
                and step + 1 < steps:
            snapshot(step + 1)
            run.save(out, complete=False)
    snapshot(steps)
    run.extra["ms_per_step"] = 1000 * (time.perf_counter() - t0) / max(1, steps - start)
    model.eval()
    if out is not None:
        run.save(out)
    return run


def _stop(run: Run, stop: Diverged, step: int, snapshot, out, model) -> None:
    """A diverged run: its state at ``step`` (the weights before the failing update) kept in
    ``run`` and, with ``out``, written marked DIVERGED."""
    snapshot(step)
    stop.kept, stop.run = step, run
    run.extra["diverged"] = stop.record()
    model.eval()
    if out is not None:
        run.save(out, diverged=stop)


def _python_rng(state):
    """random.getstate() as saved (lists, for plain-data checkpoints) back to its tuples."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
