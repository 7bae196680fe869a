"""Training: Adam on the ELBO of a registered method (or a sequence VAE's objective), gradient
clipping, validation, best checkpoint, resume — one loop for every model."""

from __future__ import annotations

import copy
import math
import random
import time

import pyro
import torch
from tqdm.auto import tqdm

from ..data.batching import Batch
from ..data.vocab import Vocab
from ..models.seq2seq import Seq2SeqAlignment
from .methods import differentiable_loss, get_method, loss_and_grads
from .run import Run


def _order(n: int, seed: int, epoch: int) -> list[int]:
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


SCHEDULES = {
    "constant": lambda step, steps: 1.0,
    "cosine": lambda step, steps: 0.5 * (1.0 + math.cos(math.pi * step / max(1, steps))),
}


class MethodObjective:
    """A registered inference method on a :class:`Seq2SeqAlignment`: its ELBO estimate, and the
    exact (or IWAE) NLL/token for validation."""

    def __init__(self, method: str):
        self.method = get_method(method)
        self.elbo = self.method.elbo()

    def loss_and_grads(self, model, batch: Batch, step: int, avg: float | None) -> float:
        return loss_and_grads(self.method, self.elbo, model, batch, step, avg)

    def differentiable_loss(self, model, batch: Batch, step: int, avg: float | None):
        return differentiable_loss(self.method, self.elbo, model, batch, step, avg)

    def validate(self, run: Run, batches: list[Batch]) -> float:
        from .evaluate import nll_per_token  # local: evaluate imports fit's siblings

        return nll_per_token(run, batches)


class SeqVAEObjective:
    """:class:`~ppl_attention.models.seq_vae.AttentionSeqVAE`'s annealed, free-bits ELBO
    (``anneal`` ∈ ANNEALING over ``anneal_steps``); validation: −ELBO/token at β = 1 without free
    bits (one draw of z)."""

    def __init__(self, model, anneal: str = "none", anneal_steps: int = 1):
        from ..models.seq_vae import ANNEALING

        if anneal not in ANNEALING:
            raise ValueError(f"unknown KL annealing {anneal!r}; valid: {', '.join(ANNEALING)}")
        self.beta = lambda step: ANNEALING[anneal](step, anneal_steps)
        self.elbo = model.make_elbo()

    def loss_and_grads(self, model, batch: Batch, step: int, avg: float | None) -> float:
        return model.loss_and_grads(self.elbo, batch, self.beta(step))

    def validate(self, run: Run, batches: list[Batch]) -> float:
        from ..analysis.latent import elbo_per_token

        return -elbo_per_token(run.model, batches)


def make_objective(model, method: str, config: dict | None = None):
    """The training objective of ``method`` for ``model``: ``"seq-vae"`` for a sequence VAE
    (options ``kl_anneal``, ``anneal_steps`` from ``config``), else a registered method."""
    if method == "seq-vae":
        config = config or {}
        return SeqVAEObjective(model, config.get("kl_anneal", "none"),
                               config.get("anneal_steps", 1))
    return MethodObjective(method)


def fit(model: Seq2SeqAlignment, train: list[Batch], method: str, steps: int, seed: int = 0, *,
        src_vocab: Vocab, tgt_vocab: Vocab, valid: list[Batch] | None = None, lr: float = 3e-3,
        clip: float = 5.0, valid_every: int = 100, resume: Run | None = None,
        progress: bool = True, out=None, config: dict | None = None,
        lr_schedule: str = "cosine", checkpoint_every: int | None = None,
        distributed=None) -> Run:
    """Train ``model`` by ``method`` for ``steps`` steps (one batch a step) and return a Run.

    The batch for step i is fixed by (seed, i), so a run resumed from its directory continues
    with the identical next loss. Validation NLL/token (exact where the family allows) every
    ``valid_every`` steps; the best model is kept in ``run.extra["best_model"]``.

    ``lr_schedule``: ``"constant"``, or ``"cosine"`` — lr·½(1 + cos(π·step/steps)), which lets
    the last steps settle instead of rattling at the full rate. The rate is a function of the
    step alone, so resuming keeps it.

    ``checkpoint_every``: also save ``out`` every N steps, marked PARTIAL, so a long run killed
    midway resumes from its last checkpoint with the identical next loss.

    ``distributed``: a :class:`~ppl_attention.inference.distributed.Distributed` (a
    ``torchrun`` launch): each rank differentiates its shard of every batch inside
    ``DistributedDataParallel`` — the same parameters, step by step, as one process on the
    whole batch (module docstring there); rank 0 alone validates, shows progress and writes
    ``out``; the other ranks draw their own random numbers.
    """
    if lr_schedule not in SCHEDULES:
        raise ValueError(f"unknown lr_schedule {lr_schedule!r}; valid: {', '.join(SCHEDULES)}")
    if not train:
        raise ValueError("no training batches")
    pyro.clear_param_store()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    run = resume or Run(model, method, src_vocab, tgt_vocab, dict(config or {}))
    run.config.update(dict(config or {}), lr=lr, clip=clip, seed=seed, valid_every=valid_every,
                      lr_schedule=lr_schedule)
    start = run.step
    if resume is not None:
        if resume.optimizer_state:
            optimizer.load_state_dict(resume.optimizer_state)
        torch.set_rng_state(resume.rng_state["torch"])
        random.setstate(resume.rng_state["python"])
    else:
        pyro.set_rng_seed(seed)
    avg = run.extra.get("avg_baseline")
    best = run.extra.get("best_valid", float("inf"))
    objective = make_objective(model, method, run.config)
    step_fn = None
    if distributed is not None:
        if not hasattr(objective, "differentiable_loss"):
            raise ValueError(f"{method}: data-parallel training (torchrun) is for the "
                             f"registered inference methods")
        if not distributed.main:  # rank 0 keeps the one-process random stream
            pyro.set_rng_seed((seed * 1_000_003 + distributed.rank * 7_919 + start) % 2**31)
        ddp = distributed.wrap(model, objective)

        def step_fn(batch, step, avg):
            shard = distributed.shard(batch)
            surrogate, loss = ddp(shard, step, avg)
            (surrogate * distributed.world).backward()  # DDP averages: W·(1/W)Σ_r = Σ_r
            total, n_tokens = distributed.all_sum(float(loss), shard.n_tokens)
            return total / n_tokens

        run.config["processes"] = distributed.world
        progress = progress and distributed.main
        valid = valid if distributed.main else None
        out = out if distributed.main else None
    model.train()
    bar = tqdm(range(start, steps), disable=not progress, desc=method, leave=False)
    t0, tokens = time.perf_counter(), 0
    trained_before = run.extra.get("train_seconds", 0.0)  # earlier segments of a resumed run
    for step in bar:
        epoch, pos = divmod(step, len(train))
        batch = train[_order(len(train), seed, epoch)[pos]]
        for group in optimizer.param_groups:
            group["lr"] = lr * SCHEDULES[lr_schedule](step, steps)
        optimizer.zero_grad()
        if step_fn is None:
            loss = objective.loss_and_grads(model, batch, step, avg) / batch.n_tokens
        else:
            loss = step_fn(batch, step, avg)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        avg = -loss if avg is None else 0.95 * avg - 0.05 * loss
        tokens += batch.n_tokens
        record = {"step": step + 1, "train_loss": loss}
        if valid and ((step + 1) % valid_every == 0 or step + 1 == steps):
            model.eval()
            with torch.random.fork_rng():  # validation draws must not shift the training RNG
                record["valid_nll"] = v = objective.validate(run, valid)
            model.train()
            if v < best:
                best = v
                run.extra["best_model"] = copy.deepcopy(model.state_dict())
                run.extra["best_step"] = step + 1
        run.history.append(record)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens / (time.perf_counter() - t0):.0f}")
        if out is not None and checkpoint_every and (step + 1) % checkpoint_every == 0 \
                and step + 1 < steps:
            run.step = step + 1
            run.extra.update(avg_baseline=avg, best_valid=best,
                             train_seconds=trained_before + time.perf_counter() - t0)
            run.optimizer_state = optimizer.state_dict()
            run.rng_state = {"torch": torch.get_rng_state(), "python": random.getstate()}
            run.save(out, complete=False)
    run.step = steps
    run.extra.update(avg_baseline=avg, best_valid=best,
                     train_seconds=trained_before + time.perf_counter() - t0,
                     ms_per_step=1000 * (time.perf_counter() - t0) / max(1, steps - start))
    run.optimizer_state = optimizer.state_dict()
    run.rng_state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    model.eval()
    if out is not None:
        run.save(out)
    return run
