"""Training under NumPyro: the loop of :func:`ppl_attention.inference.fit` (same batch order,
Adam with torch's update rule, global-norm clipping at ``clip``, the same lr schedules,
validation, best weights kept) with the whole SVI step under ``jax.jit``. It takes and returns
the same objects (a torch model holding the configuration and initial weights; a
:class:`~ppl_attention.inference.run.Run`), so a run trained here is saved, loaded and evaluated
by either backend.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from ...core.schedules import LR_SCHEDULES, batch_order
from ...errors import UserError
from ...inference.fit import training_options
from ...inference.run import Run
from ..batching import to_jax
from ..nn import to_torch
from .evaluate import MULTIPLE, nll_per_token, twin_of
from .methods import enumerated_guide_loss, get_method, score_function_loss


def adam_init(params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    return {"m": zeros, "v": zeros, "t": jnp.zeros((), jnp.int32)}


def adam_update(params, grads, state, lr, b1=0.9, b2=0.999, eps=1e-8):
    """torch.optim.Adam's update (bias corrections folded as torch does)."""
    t = state["t"] + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
    bc1, bc2 = 1 - b1**t, 1 - b2**t
    new = jax.tree.map(lambda p, m, v: p - (lr / bc1) * m / (jnp.sqrt(v) / jnp.sqrt(bc2) + eps),
                       params, m, v)
    return new, {"m": m, "v": v, "t": t}


def clip_grad_norm(grads, max_norm):
    """torch.nn.utils.clip_grad_norm_: scale by max_norm / (‖g‖₂ + 1e-6) when that is < 1."""
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    coef = jnp.minimum(max_norm / (norm + 1e-6), 1.0)
    return jax.tree.map(lambda g: g * coef, grads)


def make_loss(model, method: str):
    """(params, key, batch, kl_scale) → (loss to differentiate, −ELBO), summed over the batch."""
    m = get_method(method)
    model_fn = functools.partial(model.model, enumerate_z=m.enumerate_model)
    annealed = m.anneal_rho is not None

    def guide_fn(kl):
        return functools.partial(model.guide, posterior=m.posterior,
                                 enumerate_z=m.enumerate_guide, kl_scale=kl)

    def mdl(kl):
        return functools.partial(model_fn, kl_scale=kl)

    if m.loss_kind == "score-function":
        def loss(params, key, batch, kl):
            base = 0.0
            if m.baseline == "soft":
                base = jax.lax.stop_gradient(model.soft_token_log_likelihood(params, batch))
            return score_function_loss(key, params, mdl(1.0), guide_fn(1.0), batch, base,
                                       model.param_name)
    elif m.loss_kind == "exact-marginal":
        def loss(params, key, batch, kl):
            v = -model.exact_token_log_likelihood(params, batch).sum()
            return v, v
    elif m.loss_kind == "enumerated-guide":
        def loss(params, key, batch, kl):
            v = enumerated_guide_loss(key, params, mdl(1.0), guide_fn(1.0), batch,
                                      model.param_name)
            return v, v
    else:
        elbo = m.elbo()

        def loss(params, key, batch, kl):
            kl = kl if annealed else 1.0
            v = elbo.loss(key, {model.param_name: params}, mdl(kl), guide_fn(kl), batch)
            return v, v
    return loss


def make_step(model, method: str, clip: float):
    loss = make_loss(model, method)

    @jax.jit
    def step(params, opt, key, batch, n_tokens, lr, kl):
        (_, neg_elbo), grads = jax.value_and_grad(
            lambda p: tuple(x / n_tokens for x in loss(p, key, batch, kl)), has_aux=True)(params)
        if clip:
            grads = clip_grad_norm(grads, clip)
        params, opt = adam_update(params, grads, opt, lr)
        return params, opt, neg_elbo

    return step


def data_parallel(devices: int, rows: int):
    """Shardings for data-parallel SVI over the first ``devices`` JAX devices: batches split on
    their row axis (``P("data")``), parameters and optimizer state replicated (``P()``); XLA
    inserts the gradient all-reduce. Refuses, before any work, more devices than are present or
    a batch whose ``rows`` do not divide evenly."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    present = jax.devices()
    if not isinstance(devices, int) or devices < 1:
        raise UserError(f"--devices must be a positive int, got {devices!r}")
    if devices > len(present):
        raise UserError(f"--devices {devices}: only {len(present)} JAX device(s) present "
                         f"({present[0].platform}); on CPU start with XLA_FLAGS="
                         f"--xla_force_host_platform_device_count={devices}")
    if rows % devices:
        raise UserError(f"batch of {rows} rows does not split over --devices {devices}; choose "
                         f"a --batch-size divisible by {devices}")
    mesh = Mesh(np.array(present[:devices]), ("data",))
    return NamedSharding(mesh, P("data")), NamedSharding(mesh, P())


def fit(model, train, method: str, steps: int | None = None, seed: int = 0, *, src_vocab=None,
        tgt_vocab=None, valid=None, lr: float | None = None, clip: float | None = None,
        valid_every: int | None = None, resume: Run | None = None, progress: bool = True,
        out=None, config: dict | None = None, lr_schedule: str | None = None,
        checkpoint_every: int | None = None, devices: int = 1, kl_weight: float | None = None,
        anneal_rho: float | None = None, weight_decay: float | None = None,
        model_spec: str | None = None) -> Run:
    """As :func:`ppl_attention.inference.fit`, under NumPyro. ``model`` is the torch model whose
    configuration and initial weights the run starts from; its class declares the NumPyro twin
    that trains (``numpyro_twin``). ``devices > 1``: data-parallel SVI, each batch sharded over
    that many JAX devices (:func:`data_parallel`); the same global batch gives the same loss
    and gradients."""
    if resume is not None or checkpoint_every:
        raise UserError("--resume and --checkpoint-every are supported by the pyro backend only")
    m = get_method(method)
    if anneal_rho is not None and m.anneal_rho is None:
        raise UserError(f"--anneal-rho sets the KL annealing of methods that anneal it "
                        f"(bam-weibull, bam-lognormal), not of {method}")
    opts = training_options(type(model), steps=steps, lr=lr, lr_schedule=lr_schedule,
                            valid_every=valid_every, kl_weight=kl_weight, anneal_rho=anneal_rho,
                            weight_decay=weight_decay, clip=clip)
    steps, lr, lr_schedule, clip = opts["steps"], opts["lr"], opts["lr_schedule"], opts["clip"]
    valid_every, kl_weight, anneal_rho = opts["valid_every"], opts["kl_weight"], opts["anneal_rho"]
    weight_decay = opts["weight_decay"]
    if weight_decay:
        raise UserError("--weight-decay: the NumPyro loop's Adam has no weight decay; use the "
                        "pyro backend")
    if lr_schedule not in LR_SCHEDULES:
        raise UserError(f"unknown lr_schedule {lr_schedule!r}; valid: {', '.join(LR_SCHEDULES)}")
    if not train:
        raise UserError("no training batches")
    jm, params = twin_of(model, training=True)
    rows = max(b.size for b in train)
    shard = data_parallel(devices, rows) if devices != 1 else None
    jtrain = [to_jax(b, rows, MULTIPLE) for b in train]
    step_fn = make_step(jm, method, clip)
    opt = adam_init(params)
    if shard is not None:
        jtrain = [jax.device_put(b, shard[0]) for b in jtrain]
        params, opt = jax.device_put(params, shard[1]), jax.device_put(opt, shard[1])
    run = Run(model, method, src_vocab, tgt_vocab, dict(config or {}), model_spec=model_spec)
    run.config.update(dict(config or {}), lr=lr, clip=clip, seed=seed, valid_every=valid_every,
                      lr_schedule=lr_schedule, backend="numpyro", devices=devices,
                      kl_weight=kl_weight,
                      **({"anneal_rho": anneal_rho or m.anneal_rho}
                         if m.anneal_rho is not None else {}))
    base_key = jax.random.PRNGKey(seed)
    best, best_params = float("inf"), None
    bar = tqdm(range(steps), disable=not progress, desc=f"{method} [numpyro]", leave=False)
    t0, tokens, compile_s = time.perf_counter(), 0, 0.0
    for step in bar:
        epoch, pos = divmod(step, len(train))
        i = batch_order(len(train), seed, epoch)[pos]
        n_tok = train[i].n_tokens
        compiled_before = step_fn._cache_size()
        t_step = time.perf_counter()
        params, opt, neg_elbo = step_fn(params, opt, jax.random.fold_in(base_key, step),
                                        jtrain[i], float(n_tok),
                                        lr * LR_SCHEDULES[lr_schedule](step, steps),
                                        m.kl_scale(step, kl_weight, anneal_rho))
        loss = float(neg_elbo)
        if step_fn._cache_size() > compiled_before:  # this step compiled a new batch shape
            compile_s += time.perf_counter() - t_step
        tokens += n_tok
        record = {"step": step + 1, "train_loss": loss}
        if valid and ((step + 1) % valid_every == 0 or step + 1 == steps):
            record["valid_nll"] = v = nll_per_token(run, valid, params=params)
            if v < best:
                best, best_params = v, params
                run.extra["best_step"] = step + 1
        run.history.append(record)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens / (time.perf_counter() - t0):.0f}")
    run.step = steps
    run.extra.update(best_valid=best, ms_per_step=1000 * (time.perf_counter() - t0) / max(1, steps),
                     compilations=int(step_fn._cache_size()), compile_seconds=compile_s,
                     shapes=len({(b.src.shape, b.tgt_out.shape) for b in jtrain}))
    if best_params is not None:
        run.extra["best_model"] = to_torch(best_params)
    model.load_state_dict(to_torch(params))
    model.eval()
    if out is not None:
        run.save(out)
    return run
