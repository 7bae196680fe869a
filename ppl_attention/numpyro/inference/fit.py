"""Training under NumPyro: the loop of :func:`ppl_attention.pyro.inference.fit` — the same batch
order, the model's training defaults, the lr schedules and KL annealing of
:mod:`ppl_attention.core.schedules`, validation with the best weights kept, periodic
checkpoints and ``--resume`` with the identical next loss — with the whole SVI step under
``jax.jit`` and the optimizer from ``optax`` (global-norm clipping, Adam's L2 weight decay,
Adam; the learning rate of the step multiplies Adam's update, as torch's Adam applies it).

It trains a NumPyro model (:mod:`ppl_attention.numpyro.models.base`: parameters found from its
programs) or the NumPyro twin of a Pyro model (weights moved by name,
:mod:`.twins`), and returns a :class:`~ppl_attention.common.runs.Run`: for a NumPyro model its
param map (``run.params``), for a twin the Pyro model holding the trained weights — so a twin's
run is evaluated by either backend.

XLA compiles the step once per padded batch shape (:mod:`ppl_attention.numpyro.jax_batches`);
JAX's persistent compilation cache (:func:`enable_compilation_cache`) keeps the compiled steps
between runs, so another seed, a resume or the next job of a sweep loads them instead.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import jax
import numpy as np
import optax
from numpyro import handlers

from ...common.contract import check_method, declared
from ...common.runs import Run
from ...core import jsonio
from ...core.divergence import Diverged, check_figure, check_step, hint
from ...core.errors import UserError
from ...core.method_specs import method_spec
from ...core.progress import progress_bar
from ...core.schedules import LR_SCHEDULES, batch_order
from ...core.training import check_resume_steps, training_options
from ...data.kinds import data_kind
from ..jax_batches import Shapes, choose_shapes, to_jax
from ..models.base import (
    constrain,
    exact_token_log_likelihood,
    init_params,
    is_numpyro_model,
    soft_token_log_likelihood,
    unconstrain,
)
from .cache import CACHE_ENV, PersistentStep, enable_compilation_cache
from .evaluate import nll_per_token
from .methods import (
    enumerated_guide_loss,
    get_method,
    latent_enumerated_loss,
    score_function_kl_loss,
    score_function_loss,
)
from .twins import parameter_pairs, state_dict_from_params, twin_of

__all__ = ["fit", "make_loss", "make_step", "optimizer", "data_parallel",
           "enable_compilation_cache", "CACHE_ENV"]

def optimizer(clip: float = 0.0, weight_decay: float = 0.0) -> optax.GradientTransformation:
    """The direction of torch's Adam, as optax composes it: global-norm clipping at ``clip``
    (0: none), Adam's L2 term ``weight_decay``·θ added to the gradient, Adam's scaling; the
    step's learning rate multiplies the result (:func:`make_step`)."""
    parts = []
    if clip:
        parts.append(optax.clip_by_global_norm(clip))
    if weight_decay:
        parts.append(optax.add_decayed_weights(weight_decay))
    parts.append(optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-8))
    return optax.chain(*parts)


def make_loss(model, method: str, site: str | None = None, draws=None,
              options: dict | None = None, perturbation: dict | None = None):
    """(params, key, batch, kl_scale, step_kwargs) → (loss to differentiate, −ELBO), summed
    over the batch; ``params`` the model's param map — or, with ``site``, the value of that one
    (pytree-valued) parameter, for differentiating with respect to it alone. ``draws``: the
    alignment site's value in the guide, fixed (the loss and gradient at those draws);
    ``options``: the method's options (a relaxation's temperature …); ``perturbation``: a
    relaxed method's noise ``{site: ε}``, given."""
    if site is not None:
        whole = make_loss(model, method, draws=draws, options=options,
                          perturbation=perturbation)
        return lambda value, *args: whole({site: value}, *args)
    m = get_method(method, options)
    site = declared(model, "site")
    annealed = m.anneal_rho is not None
    # latents beside the alignment (a global z the guide draws: the sequence VAE's)
    latents = bool(declared(model, "latents"))
    if latents and m.loss_kind in ("score-function", "score-function-kl"):
        raise UserError(f"{type(model).__name__} has latents beside the alignment "
                        f"({', '.join(declared(model, 'latents'))}); NumPyro's {method} loss "
                        f"takes the alignment as the only latent")

    def programs(kl, kw, key=None):
        mdl = functools.partial(model.model, enumerate_z=m.enumerate_model, kl_scale=kl,
                                **(kw or {}))
        guide = model.guide if draws is None else \
            handlers.substitute(model.guide, data={site: draws})
        if draws is None:
            guide = m.guide_program(guide, None if key is None else jax.random.fold_in(key, 1),
                                    perturbation)
        gd = functools.partial(guide, posterior=m.posterior, enumerate_z=m.enumerate_guide,
                               kl_scale=kl, **(kw or {}))
        return mdl, gd

    if m.loss_kind == "score-function":
        def loss(params, key, batch, kl=1.0, kw=None):
            base = 0.0
            if m.baseline == "soft":
                base = jax.lax.stop_gradient(soft_token_log_likelihood(model, params, batch))
            return score_function_loss(key, params, *programs(1.0, kw), batch, base, site)
    elif m.loss_kind == "score-function-kl":
        def loss(params, key, batch, kl=1.0, kw=None):
            base = 0.0
            if m.baseline == "soft":
                base = jax.lax.stop_gradient(soft_token_log_likelihood(model, params, batch))
            return score_function_kl_loss(key, params,
                                          *programs(kl if annealed else 1.0, kw, key), batch,
                                          base, site)
    elif m.loss_kind == "exact-marginal" and latents:
        def loss(params, key, batch, kl=1.0, kw=None):
            v = latent_enumerated_loss(key, params, *programs(1.0, kw), batch, site,
                                       declared(model, "max_plate_nesting"))
            return v, v
    elif m.loss_kind == "exact-marginal":
        def loss(params, key, batch, kl=1.0, kw=None):
            v = -exact_token_log_likelihood(model, params, batch).sum()
            return v, v
    elif m.loss_kind == "enumerated-guide":
        def loss(params, key, batch, kl=1.0, kw=None):
            v = enumerated_guide_loss(key, params, *programs(1.0, kw), batch, site)
            return v, v
    else:
        elbo = m.elbo()

        def loss(params, key, batch, kl=1.0, kw=None):
            v = elbo.loss(key, params, *programs(kl if annealed else 1.0, kw), batch)
            return v, v
    return loss


def make_step(model, method: str, clip: float = 0.0, weight_decay: float = 0.0,
              cons: dict | None = None, options: dict | None = None):
    """The jitted step ``(raw, opt, key, batch, n_tokens, lr, kl, kw) → (raw, opt, [−ELBO per
    token, the gradients' global norm])`` on the optimizer's coordinates ``raw`` (the param
    map, constrained parameters mapped to the real line by ``cons``); ``step.init(raw)`` makes
    the optimizer state; ``options``: the method's."""
    loss = make_loss(model, method, options=options)
    tx = optimizer(clip, weight_decay)
    cons = cons or {}

    @jax.jit
    def step(raw, opt, key, batch, n_tokens, lr, kl, kw=None):
        def per_token(r):
            return tuple(x / n_tokens for x in loss(constrain(r, cons), key, batch, kl, kw))

        (_, neg_elbo), grads = jax.value_and_grad(per_token, has_aux=True)(raw)
        norm = optax.tree.norm(grads)
        updates, opt = tx.update(grads, opt, raw)
        raw = optax.apply_updates(raw, jax.tree.map(lambda u: -lr * u, updates))
        return raw, opt, jax.numpy.stack([neg_elbo, norm.astype(neg_elbo.dtype)])

    step.init = tx.init
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


def _restore_optimizer(opt, saved, where: str):
    """The optimizer state ``opt`` (a fresh one, for its structure) with the leaves of a
    saved state."""
    leaves, treedef = jax.tree.flatten(opt)
    saved = list(saved or [])
    shapes = [np.shape(x) for x in leaves]
    if len(saved) != len(leaves) or [np.shape(x) for x in saved] != shapes:
        raise UserError(f"{where}: its optimizer state does not fit this model and method "
                        f"({len(saved)} arrays saved, {len(leaves)} expected); train anew "
                        f"without --resume")
    return jax.tree.unflatten(treedef, [jax.numpy.asarray(x, dtype=np.asarray(leaf).dtype)
                                        for x, leaf in zip(saved, leaves)])


def _numpy(tree):
    return jax.tree.map(lambda x: np.asarray(x), tree)


def fit(model, train, method: str, steps: int | None = None, seed: int = 0, *, src_vocab=None,
        tgt_vocab=None, valid=None, lr: float | None = None, clip: float | None = None,
        valid_every: int | None = None, resume: Run | None = None, progress: bool = True,
        out=None, config: dict | None = None, lr_schedule: str | None = None,
        checkpoint_every: int | None = None, devices: int = 1, kl_weight: float | None = None,
        anneal_rho: float | None = None, weight_decay: float | None = None,
        model_spec: str | None = None, method_options: dict | None = None) -> Run:
    """As :func:`ppl_attention.pyro.inference.fit`, under NumPyro. ``model``: a NumPyro model (its
    parameters initialised from the key of ``seed`` by running its programs) or a Pyro model
    whose class declares a NumPyro twin (the twin trains from the Pyro model's weights).
    ``resume``: a run loaded with ``which="last"`` — its weights, optimizer state and step;
    batches and draws are functions of (seed, step), so the next loss is the one the
    uninterrupted run would have had. ``checkpoint_every``: save ``out`` every N steps, marked
    PARTIAL. ``devices > 1``: data-parallel SVI, each batch sharded over that many JAX devices
    (:func:`data_parallel`); the same global batch gives the same loss and gradients.
    ``method_options``: the method's own, as on the Pyro side (recorded in the run)."""
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
    opts = training_options(type(model), steps=steps, lr=lr, lr_schedule=lr_schedule,
                            valid_every=valid_every, kl_weight=kl_weight, anneal_rho=anneal_rho,
                            weight_decay=weight_decay, clip=clip)
    steps, lr, lr_schedule, clip = opts["steps"], opts["lr"], opts["lr_schedule"], opts["clip"]
    valid_every, kl_weight, anneal_rho = opts["valid_every"], opts["kl_weight"], opts["anneal_rho"]
    if lr_schedule not in LR_SCHEDULES:
        raise UserError(f"unknown lr_schedule {lr_schedule!r}; valid: {', '.join(LR_SCHEDULES)}")
    if not train:
        raise UserError("no training batches")
    check_resume_steps(resume, steps, lr_schedule)
    enable_compilation_cache()
    native = is_numpyro_model(model)
    shapes = Shapes.from_record((resume.extra if resume is not None else {}).get("shapes")) \
        or choose_shapes(list(train) + list(valid or []))
    rows = shapes.rows
    shard = data_parallel(devices, rows) if devices != 1 else None
    jtrain = [to_jax(b, rows, shapes) for b in train]
    step_args = getattr(model, "step_arguments", None)
    kw0 = dict(step_args(0)) if callable(step_args) else None
    if native:
        jm = model
        params, cons = init_params(jm, jtrain[0], jax.random.PRNGKey(seed), kw0)
        if resume is not None:
            params = jax.tree.map(jax.numpy.asarray, resume.params)
    else:
        jm, params = twin_of(model, jtrain[0], training=True)
        cons = {}
    pairs = None if native else parameter_pairs(jm, params, model)
    step_fn = make_step(jm, method, clip, opts["weight_decay"], cons, dict(m.options))
    cache_dir = enable_compilation_cache()
    if cache_dir is not None and shard is None:  # the traced step kept between runs too
        identity = (f"{type(jm).__module__}.{type(jm).__qualname__} "
                    f"{jsonio.dumps(jm.config, sort_keys=True, default=str)} {jm.family!r} "
                    f"{method} {sorted(m.options.items())!r} {clip} {opts['weight_decay']} "
                    f"{sorted(cons.items())!r}")
        step_fn = PersistentStep(step_fn, identity, Path(cache_dir))
    raw = unconstrain(params, cons)
    opt = step_fn.init(raw)
    if resume is not None:
        opt = _restore_optimizer(opt, (resume.optimizer_state or {}).get("numpyro_leaves"),
                                 "--resume")
    if shard is not None:
        jtrain = [jax.device_put(b, shard[0]) for b in jtrain]
        raw, opt = jax.device_put(raw, shard[1]), jax.device_put(opt, shard[1])
    run = resume or Run(model, method, src_vocab, tgt_vocab, dict(config or {}),
                        model_spec=model_spec)
    run.config.update(dict(config or {}), lr=lr, clip=clip, seed=seed, steps=steps,
                      valid_every=valid_every,
                      lr_schedule=lr_schedule, backend="numpyro", devices=devices,
                      kl_weight=kl_weight, weight_decay=opts["weight_decay"],
                      method_options=dict(m.options),
                      **({"anneal_rho": anneal_rho or m.anneal_rho}
                         if m.anneal_rho is not None else {}))
    run.extra["shapes"] = shapes.record()  # validation and the tools pad to the same shapes
    start = run.step if resume is not None else 0
    base_key = jax.random.PRNGKey(seed)
    best = run.extra.get("best_valid", float("inf"))
    trained_before = run.extra.get("train_seconds", 0.0)
    compile_before = run.extra.get("compile_seconds", 0.0)

    def current():
        return constrain(raw, cons)

    def keep(params_now):
        """The weights to keep as the run's: the param map, or the Pyro model's state."""
        if native:
            return _numpy(params_now)
        return state_dict_from_params(jm, params_now, model, pairs)

    def snapshot(step: int) -> None:
        run.step = step
        run.extra.update(best_valid=best, train_seconds=trained_before + time.perf_counter() - t0,
                         compile_seconds=compile_before + compile_s,
                         compilations=int(step_fn._cache_size()))
        run.optimizer_state = {"numpyro_leaves": [np.asarray(x) for x in jax.tree.leaves(opt)]}
        if native:
            run.params = keep(current())
        else:
            model.load_state_dict(keep(current()))

    bar = progress_bar(range(start, steps), disable=not progress, desc=f"{method} [numpyro]",
                       leave=False)
    discrete = data_kind(declared(model, "data")).discrete_observations
    advice = hint(m.spec, lr)

    def stop(diverged: Diverged, at: int):
        """Keep the state at step ``at`` (the weights before the failing update), write the run
        marked DIVERGED when there is an ``out``, and re-raise."""
        snapshot(at)
        diverged.kept, diverged.run = at, run
        run.extra["diverged"] = diverged.record()
        if not native:
            model.eval()
        if out is not None:
            run.save(out, diverged=diverged)
        raise diverged

    t0, tokens, compile_s = time.perf_counter(), 0, 0.0
    for step in bar:
        epoch, pos = divmod(step, len(train))
        i = batch_order(len(train), seed, epoch)[pos]
        n_tok = train[i].n_tokens
        compiled_before = step_fn._cache_size()
        t_step = time.perf_counter()
        kw = dict(step_args(step)) if callable(step_args) else None
        new_raw, new_opt, stats = step_fn(raw, opt, jax.random.fold_in(base_key, step),
                                          jtrain[i], float(n_tok),
                                          lr * LR_SCHEDULES[lr_schedule](step, steps),
                                          m.kl_scale(step, kl_weight, anneal_rho), kw)
        loss, norm = (float(x) for x in np.asarray(stats))
        try:
            check_step(step + 1, method, loss, norm, discrete=discrete, advice=advice,
                       first_loss=run.extra.get("first_loss"))
            run.extra.setdefault("first_loss", loss)
        except Diverged as d:  # the update is not taken: raw and opt stay the last finite ones
            stop(d, step)
        raw, opt = new_raw, new_opt
        if step_fn._cache_size() > compiled_before:  # this step compiled a new batch shape
            compile_s += time.perf_counter() - t_step
        tokens += n_tok
        record = {"step": step + 1, "train_loss": loss}
        kl = m.kl_scale(step, kl_weight, anneal_rho)
        if kl != 1.0:
            record["kl_weight"] = kl
        if valid and ((step + 1) % valid_every == 0 or step + 1 == steps):
            now = current()
            record["valid_nll"] = v = nll_per_token(run, valid, params=now)
            try:
                check_figure(step + 1, method, "validation NLL per token", v,
                             discrete=discrete, advice=advice)
            except Diverged as d:
                run.history.append(record)
                stop(d, step + 1)
            if v < best:
                best = v
                run.extra["best_model"] = keep(now)
                run.extra["best_step"] = step + 1
        run.history.append(record)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens / (time.perf_counter() - t0):.0f}")
        if out is not None and checkpoint_every and (step + 1) % checkpoint_every == 0 \
                and step + 1 < steps:
            snapshot(step + 1)
            run.save(out, complete=False)
    snapshot(steps)
    elapsed = time.perf_counter() - t0
    run.extra.update(ms_per_step=1000 * elapsed / max(1, steps - start),
                     ms_per_step_compiled=1000 * (elapsed - compile_s) / max(1, steps - start),
                     n_shapes=len({(b.src.shape, b.tgt_out.shape) for b in jtrain}),
                     jax_devices=sorted({f"{d.platform}:{d.id}" for leaf in jax.tree.leaves(raw)
                                         for d in leaf.devices()}))
    if not native:
        model.eval()
    if out is not None:
        run.save(out)
    return run
