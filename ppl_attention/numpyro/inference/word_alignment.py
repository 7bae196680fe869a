"""Inference for the word aligners at corpus scale (:mod:`ppl_attention.numpyro.aligners`):

- ``gibbs`` — blocked Gibbs sampling, as a NumPyro :class:`~numpyro.infer.mcmc.MCMCKernel`
  (:class:`ConjugateGibbs`), so :class:`numpyro.infer.MCMC` runs it — chains, warm-up (burn-in),
  thinning, its progress bar. One transition: every alignment of the corpus drawn at once given
  the tables (a categorical per target word for IBM1/2, forward filtering–backward sampling
  for the HMM), then the tables drawn from their Dirichlet posteriors given the drawn counts
  (the translation rows sparse). After warm-up each transition adds the alignment posterior
  *given its tables* to the link marginals (Rao–Blackwellized: the exact conditional instead of
  the one draw), so the estimate is the posterior mean of p(a_j = i | f, e, tables).
  The sample field records, per draw, the corpus log-likelihood given the tables, the bucket
  weights and the drawn alignments of ``track`` fixed target words (R-hat and ESS across chains).
- ``vb`` — mean-field variational Bayes, q(tables) q(alignments), in closed-form coordinate
  ascent (Riley & Gildea 2012; fast_align's ``-v``): q(θ_e) = Dirichlet(α + expected counts),
  the alignments' posterior under exp E_q[log tables] (forward–backward for the HMM); the ELBO
  log Ẑ − KL(q ‖ p) of each sweep never decreases. ``svb``: its stochastic form (Hoffman, Blei,
  Wang & Paisley 2013) over minibatches of the corpus, step ρ_t = (τ + t)^−κ.

A sweep visits every shape class of the corpus by one ``lax.scan`` over its stacked batches:
one compiled program per aligner and corpus layout.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections import namedtuple
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC
from numpyro.infer.mcmc import MCMCKernel

from ...core.allocator import collect_young, return_free_memory
from ...core.errors import UserError
from ...core.progress import progress_bar
from .. import aligners as al
from .cache import enable_compilation_cache

__all__ = ["ConjugateGibbs", "GibbsState", "MAX_HMM_KEPT", "compile_ahead", "donated_chains",
           "gibbs_chains", "chain_key", "ibm1_start", "posterior_mean_log_translation",
           "run_gibbs", "vb_sweeps", "fertility_vb", "run_vb", "run_svb", "device_corpus",
           "links_from_marginals", "BestLinks", "link_rhat", "chain_diagnostics"]

#: the most kept sweeps of an HMM chain (its link counts are int16)
MAX_HMM_KEPT = 32767

#: the PRNG of the Gibbs chains' keys: JAX's ``rbg`` — random bits from XLA's
#: RngBitGenerator, keys split by threefry as the default's are. A sweep at 100,000 pairs
#: draws a few million Gammas and uniforms; on a CPU a fertility sweep takes 13 % less time
#: than under threefry, a run's chains 19 % (docs/results.md). Its bits may differ between
#: backends and JAX versions: a seed repeats a run on one machine, not across them.
KEY_IMPL = "rbg"


def chain_key(seed: int):
    """The typed PRNG key (:data:`KEY_IMPL`) of the Gibbs chains for ``seed``."""
    return jax.random.key(seed, impl=KEY_IMPL)

#: ``align`` (per class ``[n, B, T]``): the last sweep's alignments — the fertility aligner's
#: current state, kept for the others with ``keep_align`` (else None: they draw every alignment
#: afresh); ``log_psi`` ``[n_src, F + 1]``: the fertility aligner's fertility table (else None)
GibbsState = namedtuple("GibbsState", ["i", "key", "log_theta", "log_dist", "marg", "z",
                                       "align", "log_psi"], defaults=(None, None))

FIELDS = ("src", "src_mask", "tgt", "tgt_mask", "cell")
#: the ``[C]`` counts a sweep's batches scatter into its running totals (``batch_step(into=)``)
CELL_COUNTS = ("drawn_cells", "expected_cells")


def device_corpus(corpus, prior=None) -> tuple[dict, dict]:
    """The corpus as (sizes, device arrays): ``n_src``, ``n_tgt``, ``n_cells`` (static), and
    its classes' stacked batches with the cell rows — passed to the compiled sweeps as
    arguments, not folded into them as constants; ``prior`` (a
    :class:`~ppl_attention.numpyro.aligners.TablePrior` over this corpus's cells, from
    :func:`~ppl_attention.data.aligner_tables.prior_for_corpus`) goes with them."""
    arrays = {"classes": [{k: jnp.asarray(getattr(c, k)) for k in FIELDS}
                          for c in corpus.classes],
              "cell_src": jnp.asarray(corpus.cell_src)}
    if prior is not None:
        arrays["prior"] = al.TablePrior(*(jnp.asarray(x, jnp.float32) for x in prior))
    return {"n_src": corpus.n_src, "n_tgt": corpus.n_tgt, "n_cells": corpus.n_cells}, arrays


def _translation(fn, spec, counts, sizes, arrays):
    return fn(spec, counts, arrays["cell_src"], sizes["n_src"], sizes["n_tgt"],
              prior=arrays.get("prior"))


def _cell_counts(data, marginals, n_cells: int):
    """The expected link count of every cell ``[C]`` from link marginals (per class ``[n, B,
    S1, T]``, on the device): Σ over the corpus's (i, j) of the cell's marginal."""
    total = jnp.zeros(n_cells, jnp.float32)
    for cls, m in zip(data["classes"], marginals):
        real = cls["src_mask"][..., :, None] & cls["tgt_mask"][..., None, :]
        total = total + jax.ops.segment_sum(jnp.where(real, m, 0.0).ravel(),
                                            cls["cell"].ravel(), num_segments=n_cells)
    return total


def _sweep(spec, key, log_theta, log_dist, sizes, data, mode: str, track=None, marg=None,
           keep=None, prev_align=None, log_psi=None, return_aligns=False):
    """Every batch of every class under the tables (``mode`` as
    :func:`~ppl_attention.numpyro.aligners.batch_step`): the summed counts, log-likelihood,
    each class's link posteriors ``[n, B, S1, T]`` and, with ``track`` (per class: flat
    indices into ``[n·B·T]``), the drawn alignments of those target words. With ``marg`` (per
    class ``[n, B, S1, T]``), the posteriors are not returned but added, times ``keep``, to it
    inside the scan — the accumulator updated in place, batch by batch, so a corpus's
    marginals are in memory once. The fertility aligner draws from ``prev_align`` (per class
    ``[n, B, T]``) under ``log_psi`` and adds ``drawn_fert [n_src, F + 1]``;
    ``return_aligns``: the drawn alignments per class as a fourth value."""
    C, K, dt = sizes["n_cells"], spec.n_buckets, log_theta.dtype
    zero = {"drawn_cells": jnp.zeros(C, dt), "expected_cells": jnp.zeros(C, dt),
            "drawn_buckets": jnp.zeros(K, dt), "expected_buckets": jnp.zeros(K, dt),
            "loglik": jnp.zeros((), dt)}
    if spec.kind.fertility:
        zero["drawn_fert"] = jnp.zeros((sizes["n_src"], spec.n_fertility), dt)
    total, probs, tracked, aligns = dict(zero), [], [], []
    for ci, cls in enumerate(data["classes"]):
        n = cls["src"].shape[0]
        keys = jax.random.split(jax.random.fold_in(key, ci), n)
        prev = prev_align[ci] if prev_align is not None else jnp.zeros((n, 0), jnp.int32)

        def body(carry, xs):
            acc, m = carry
            b, k, i, before = xs
            out = al.batch_step(spec, k, log_theta, log_dist, b, C, mode,
                                **({"prev": before, "log_psi": log_psi}
                                   if spec.kind.fertility else {}),
                                into={name: acc[name] for name in CELL_COUNTS})
            if "drawn_fert" in out:
                out["drawn_fert"] = al.fertility_counts(spec, out["drawn_fert"],
                                                        sizes["n_src"], dt,
                                                        into=acc["drawn_fert"])
            acc = {name: (out[name] if name in CELL_COUNTS + ("drawn_fert",)
                          else acc[name] + out[name]) if name in out else acc[name]
                   for name in acc}
            a = out.get("align", jnp.zeros(b["tgt"].shape, jnp.int32))
            if m is None:
                return (acc, m), (out["probs"], a)
            add = (keep * out["probs"]).astype(m.dtype)
            m = jax.lax.dynamic_update_index_in_dim(
                m, jax.lax.dynamic_index_in_dim(m, i, keepdims=False) + add, i, 0)
            return (acc, m), (None, a)

        m0 = None if marg is None else marg[ci]
        (total, m), (p, a) = jax.lax.scan(body, (total, m0),  # the totals carried on
                                          (cls, keys, jnp.arange(n), prev))
        probs.append(p if marg is None else m)
        aligns.append(a)
        if track is not None:
            tracked.append(a.reshape(-1)[track[ci]])
    out = total, probs, (jnp.concatenate(tracked) if tracked else None)
    return out + (aligns,) if return_aligns else out


class ConjugateGibbs(MCMCKernel):
    """Blocked Gibbs for an aligner (module docstring). ``sizes``: the corpus's sizes
    (:func:`device_corpus`); its arrays and the ``track`` indices (per class, flat indices of
    the target words whose draws are recorded) are the model arguments of ``MCMC.run(key,
    arrays, track[, start])`` — ``start``: ``{"log_theta": [C]}``, the translation table the
    chains start from (else every row uniform over its cells). The fertility aligner's chains
    need ``start`` with ``log_dist`` and ``align`` (per class ``[n, B, T]``) too — an HMM's
    state (:func:`hmm_start`) — and its fertility table starts uniform. ``keep_align``: the
    state keeps the last sweep's drawn alignments (``align``) for the other aligners too —
    with the tables drawn given them, a joint state of the chain (an HMM's, to start the
    fertility aligner from). A sweep adds its conditionals to the link accumulators once past
    the warm-up: ``MCMC``'s ``num_warmup``, or the model keyword ``num_warmup`` (``MCMC.run(...,
    num_warmup=jnp.int32(w))``), which traces it, so that one compiled sweep serves every number
    of sweeps."""

    sample_field = "z"

    def __init__(self, spec: al.AlignerSpec, sizes: dict, record_tables: bool = False,
                 keep_align: bool = False):
        self.spec, self.sizes, self.record_tables = spec, sizes, record_tables
        self.keep_align = keep_align or spec.kind.fertility
        self._num_warmup = 0

    @property
    def marginal_dtype(self):
        """The link accumulators' dtype: the HMM's are counts of drawn links (int16, exact to
        :data:`MAX_HMM_KEPT` kept sweeps, half a float32's memory); the Rao–Blackwellized
        aligners' (IBM1/2, fertility) sums of conditionals (float32)."""
        return jnp.float32 if self.spec.kind.rao_blackwellized else jnp.int16

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        data, track = model_args[:2]
        self._num_warmup = num_warmup
        log_theta, log_dist = al.uniform_tables(self.spec, {**self.sizes, **data})
        if data.get("prior") is not None:  # the tables trained elsewhere: their means
            zero = jnp.zeros(self.sizes["n_cells"], jnp.float32)
            log_theta = _translation(al.posterior_mean_log_translation, self.spec, zero,
                                     self.sizes, data)
            log_dist = al.posterior_mean_log_buckets(
                self.spec, jnp.zeros(self.spec.n_buckets, jnp.float32), data["prior"])
        start = model_args[2] if len(model_args) > 2 else None
        if start is not None:  # tables to start from (another aligner's posterior mean)
            log_theta = start["log_theta"].astype(log_theta.dtype)
            if "log_dist" in start:
                log_dist = start["log_dist"].astype(log_dist.dtype)
        align = log_psi = None
        if self.spec.kind.fertility:
            if start is None or "align" not in start:
                raise UserError("the fertility aligner's chains start from an HMM's state "
                                "(hmm_start): give start with log_theta, log_dist and align")
            align = tuple(start["align"])
            log_psi = al.posterior_mean_log_fertility(  # the prior's means
                self.spec, jnp.zeros((self.sizes["n_src"], self.spec.n_fertility),
                                     log_theta.dtype), data.get("prior"))
        elif self.keep_align:
            align = tuple(jnp.full(c["tgt"].shape, -1, jnp.int32) for c in data["classes"])
        marg = tuple(jnp.zeros(c["cell"].shape, self.marginal_dtype) for c in data["classes"])
        z = {"loglik": jnp.zeros((), log_theta.dtype), "log_dist": log_dist,
             "bucket_counts": jnp.zeros((self.spec.n_buckets,), log_theta.dtype),
             "track": jnp.zeros((sum(int(t.shape[0]) for t in track),), jnp.int32)}
        if self.spec.kind.fertility:
            z["fert_counts"] = jnp.zeros((self.sizes["n_src"], self.spec.n_fertility),
                                         log_theta.dtype)
        if self.record_tables:
            z["log_theta"] = log_theta
        return GibbsState(jnp.zeros((), jnp.int32), rng_key, log_theta, log_dist, marg, z,
                          align, log_psi)

    def sample(self, state, model_args, model_kwargs):
        data, track = model_args[:2]
        spec, sizes = self.spec, self.sizes
        key, k_sweep, k_theta, k_dist = jax.random.split(state.key, 4)
        # the warm-up's length as an argument where the caller gives one (model_kwargs
        # "num_warmup", traced): one compiled sweep then serves every number of sweeps
        num_warmup = (model_kwargs or {}).get("num_warmup", self._num_warmup)
        keep = (state.i >= num_warmup).astype(jnp.float32)
        total, marg, tracked, aligns = _sweep(
            spec, k_sweep, state.log_theta, state.log_dist, sizes, data, "draw", track,
            marg=state.marg, keep=keep, prev_align=state.align, log_psi=state.log_psi,
            return_aligns=True)
        marg = tuple(marg)
        align = tuple(aligns) if self.keep_align else None
        log_psi = None
        if spec.kind.fertility:
            log_psi = al.sample_fertility(jax.random.fold_in(k_dist, 1), spec,
                                          total["drawn_fert"], data.get("prior"))
        prior = data.get("prior")
        log_theta = al.sample_translation(k_theta, spec, total["drawn_cells"], data["cell_src"],
                                          sizes["n_src"], sizes["n_tgt"], prior)
        log_dist = al.sample_buckets(k_dist, spec, total["drawn_buckets"], prior)
        z = {"loglik": total["loglik"], "log_dist": state.log_dist,
             "bucket_counts": total["drawn_buckets"], "track": tracked}
        if spec.kind.fertility:
            z["fert_counts"] = total["drawn_fert"]
        if self.record_tables:  # the tables this sweep's alignments were drawn under
            z["log_theta"] = state.log_theta
        return GibbsState(state.i + 1, key, log_theta, log_dist, marg, z, align, log_psi)


def _track_indices(corpus, n_track: int, seed: int):
    """Per class, flat indices ``[n·B·T]`` of ``n_track`` real target words drawn at random."""
    real = [np.flatnonzero(c.tgt_mask.reshape(-1)) for c in corpus.classes]
    sizes = np.array([len(r) for r in real])
    n_track = min(n_track, int(sizes.sum()))
    pick = np.sort(np.random.default_rng(seed).choice(sizes.sum(), n_track, replace=False))
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return [jnp.asarray(r[pick[(pick >= s) & (pick < e)] - s], jnp.int32)
            for r, s, e in zip(real, starts[:-1], starts[1:])]


def _check_method(spec: al.AlignerSpec, method: str) -> None:
    if method not in spec.kind.methods:
        raise UserError(f"the {spec.model} aligner runs by {' or '.join(spec.kind.methods)}, "
                        f"not {method}")


def _check_counts(**values) -> None:
    for name, (v, lo) in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise UserError(f"--{name.replace('_', '-')} must be an int ≥ {lo}, got {v!r}")


def gibbs_chains(spec: al.AlignerSpec, sizes: dict, data: dict, track: list, *, chains: int,
                 warmup: int, samples: int, thinning: int = 1, seed: int = 0,
                 progress: bool = True, record_tables: bool = False,
                 start: dict | None = None, keep_align: bool = False, key=None) -> MCMC:
    """NumPyro's ``MCMC`` of :class:`ConjugateGibbs` on a corpus given as (``sizes``,
    ``data``) (:func:`device_corpus`), ``chains`` chains one after another; returns the run
    ``MCMC`` (its samples: the fields of the kernel's ``z``, ``log_theta`` too with
    ``record_tables``; its ``last_state.marg``: the summed conditionals; with ``keep_align``
    its ``last_state.align``: the last sweep's alignments); ``key``: the PRNG key (else
    ``chain_key(seed)``). ``samples`` is NumPyro's ``num_samples``: the sweeps after the
    warm-up, every ``thinning``-th kept (:func:`donated_chains` counts kept draws instead).
    Call :func:`release` once its states are read."""
    _check_counts(chains=(chains, 1), warmup=(warmup, 0), samples=(samples, 1),
                  thinning=(thinning, 1))
    if not spec.kind.rao_blackwellized and samples * thinning > MAX_HMM_KEPT:
        raise UserError(f"--samples × --thin: at most {MAX_HMM_KEPT} kept sweeps per HMM "
                        f"chain, got {samples * thinning}")
    mcmc = MCMC(ConjugateGibbs(spec, sizes, record_tables, keep_align), num_warmup=warmup,
                num_samples=samples, num_chains=chains, chain_method="sequential",
                thinning=thinning, progress_bar=progress, jit_model_args=True)
    mcmc.run(chain_key(seed) if key is None else key, data, track,
             *([start] if start is not None else []), num_warmup=jnp.asarray(warmup, jnp.int32))
    return mcmc


def release(mcmc: MCMC) -> None:
    """Drop a finished ``MCMC``'s states. NumPyro keeps the post-processing functions of its
    last runs in a module-level cache (``numpyro.util.cached_by``, eight entries), each holding
    its ``MCMC`` — and so the run's states and model arguments, here a corpus's link
    accumulators and its arrays — past our last reference to it."""
    for name in ("_states", "_states_flat", "_last_state", "_warmup_state", "_args",
                 "_kwargs"):
        if hasattr(mcmc, name):
            setattr(mcmc, name, None)
    for name in ("_init_state_cache", "_cache"):
        getattr(mcmc, name, {}).clear()


def _chain_shapes(kernel: ConjugateGibbs, key, warmup: int, model_args: tuple):
    """The shapes of a chain's (accumulators, state without them), from its ``init`` traced
    abstractly (nothing allocated)."""
    state = jax.eval_shape(lambda k: kernel.init(k, warmup, None, model_args, {}), key)
    return state.marg, state._replace(marg=None)


def compile_ahead(fn, shapes: tuple, *args):
    """``fn`` (a ``jax.jit``) compiled for arguments of ``shapes`` (abstract, then ``args`` as
    they are) before any of them is allocated: XLA's compilation (or its load from the
    persistent cache) then never holds memory beside a chain's buffers. Returns the compiled
    program, called as ``fn``. The tracing's garbage (jaxprs, the lowered module: reference
    cycles) is collected here too, for a caller that runs with Python's collector off."""
    compiled = fn.lower(*shapes, *args).compile()
    collect_young()
    return_free_memory()  # the compiler's freed pages, before the buffers come
    return compiled


def donated_chains(kernel: ConjugateGibbs, keys, model_args: tuple, warmup: int,
                   samples: int, thinning: int = 1, progress: bool = True,
                   parallel: int = 2):
    """Chains of ``kernel``, one per key, each as NumPyro's ``MCMC`` runs it — ``init``, then
    ``warmup + samples · thinning`` calls of ``sample``, every ``thinning``-th state after the
    warm-up kept — but with the link accumulators *donated* to each compiled sweep, so that a
    chain's accumulators are in memory once, not twice (the sweep's input and its output: 0.2
    GB at 100k pairs); the sweep is compiled once for all chains, before any chain starts
    (:func:`compile_ahead`). ``parallel``: how many chains run at once, one thread each (JAX
    releases the interpreter while a sweep runs, so two chains use two cores where one
    sweep's operations leave the second idle; the running chains' accumulators in memory at
    once); 1: one after another. The draws are the same either way: each chain has
    its own key. Yields, in the keys' order, per chain the kept draws of the state's ``z``
    (``{field: [1, samples, ...]}``, NumPyro's ``get_samples(group_by_chain=True)`` of one
    chain) and its final accumulators (per class ``[n, B, S1, T]``)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    _check_counts(warmup=(warmup, 0), samples=(samples, 1), thinning=(thinning, 1))

    def sweep(marg, state, args, num_warmup):
        new = kernel.sample(state._replace(marg=marg), args, {"num_warmup": num_warmup})
        return new.marg, new._replace(marg=None)

    if isinstance(parallel, bool) or int(parallel) < 1:
        raise UserError(f"parallel chains must be a positive integer, got {parallel!r}")
    num_warmup = jnp.asarray(warmup, jnp.int32)
    # the warm-up's length traced: one program for any sweep count, compiled (or loaded from
    # the persistent cache) before any chain's accumulators exist — XLA's compilation of a
    # corpus's sweep needs memory of its own
    step = compile_ahead(jax.jit(sweep, donate_argnums=0), _chain_shapes(kernel, keys[0],
                         warmup, model_args), model_args, num_warmup)
    total = warmup + samples * thinning
    side_by_side = min(int(parallel), len(keys)) > 1
    stop = threading.Event()
    bar = progress_bar(total=total * len(keys), leave=False, disable=not progress,
                       desc=f"{len(keys)} chains" if side_by_side else "chain 1")

    def chain(c, key):
        try:
            state = kernel.init(key, warmup, None, model_args, {})
            marg, state = state.marg, state._replace(marg=None)
            draws = []
            for i in range(total):
                if stop.is_set():  # another chain failed, or the caller stopped reading
                    return None
                marg, state = step(marg, state, model_args, num_warmup)
                if i >= warmup and (i - warmup + 1) % thinning == 0:
                    draws.append(state.z)
                bar.update()
        except BaseException:
            stop.set()
            raise
        del state
        return ({name: np.stack([np.asarray(d[name]) for d in draws])[None]
                 for name in draws[0]}, marg)

    try:
        if side_by_side:
            with ThreadPoolExecutor(min(int(parallel), len(keys)),
                                    thread_name_prefix="chain") as pool:
                futures = [pool.submit(chain, c, key) for c, key in enumerate(keys)]
                try:
                    for future in futures:
                        yield future.result()
                finally:
                    stop.set()
        else:
            for c, key in enumerate(keys):
                bar.set_description(f"chain {c + 1}/{len(keys)}")
                yield chain(c, key)
    finally:
        bar.close()


def posterior_mean_log_translation(spec: al.AlignerSpec, sizes: dict, data: dict, counts):
    """log E[θ_c] = log (α + p_c + n_c) − log (V_f·α + p_e + n_e) of the rows' Dirichlet
    posteriors given the cells' (expected) counts ``[C]`` (p: the corpus's prior
    pseudo-counts, if it has any)."""
    return _translation(al.posterior_mean_log_translation, spec, counts, sizes, data)


def ibm1_start(spec: al.AlignerSpec, sizes: dict, data: dict, sweeps: int = 5,
               progress: bool = True) -> dict:
    """A start for IBM2 / HMM chains, as eflomal and GIZA++ train IBM1 first: ``sweeps`` of
    IBM1's VB, the posterior mean of the translation table (``{"log_theta": [C]}``)."""
    ibm1 = al.aligner("ibm1", alpha=spec.alpha)
    res = vb_sweeps(ibm1, sizes, data, iterations=sweeps, tol=0.0, progress=progress,
                    marginals=False)
    counts = jnp.asarray(res["counts"][0])
    return {"log_theta": posterior_mean_log_translation(spec, sizes, data, counts)}


def hmm_start(spec: al.AlignerSpec, sizes: dict, data: dict, track: list, sweeps: int,
              start: dict | None, seed: int, progress: bool = True) -> dict:
    """The fertility aligner's start, as eflomal's model 3 starts from its HMM: ``sweeps``
    sweeps of one HMM chain (from ``start``, IBM1's table), its last state — the last sweep's
    alignments and the tables drawn given them (``{"log_theta", "log_dist", "align"}``, per
    class ``[n, B, T]``). The chain is NumPyro's ``MCMC`` of one chain step for step (the same
    key, the same transitions), run here so that its sweep is one compiled program whatever
    ``sweeps`` is (``MCMC`` without a progress bar — NumPyro's default under ``CI`` — compiles
    the whole loop, its length a constant)."""
    _check_counts(sweeps=(sweeps, 1))
    hmm = al.aligner("hmm", alpha=spec.alpha, gamma=spec.gamma, max_jump=spec.max_jump,
                     null_prior=spec.null_prior)
    kernel = ConjugateGibbs(hmm, sizes, keep_align=True)
    model_args = (data, track) + ((start,) if start is not None else ())
    key = chain_key(seed + 7919)
    num_warmup = jnp.asarray(sweeps - 1, jnp.int32)
    shape = jax.eval_shape(lambda k: kernel.init(k, sweeps - 1, None, model_args, {}), key)
    step = compile_ahead(jax.jit(lambda st, args, w: kernel.sample(st, args, {"num_warmup": w})),
                         (shape,), model_args, num_warmup)
    state = kernel.init(key, sweeps - 1, None, model_args, {})
    for _ in progress_bar(range(sweeps), leave=False, desc="HMM start", disable=not progress):
        state = step(state, model_args, num_warmup)
    align = list(state.align)
    return {"log_theta": state.log_theta, "log_dist": state.log_dist, "align": align}


def run_gibbs(spec: al.AlignerSpec, corpus, chains: int = 4, warmup: int = 50,
              samples: int = 100, thinning: int = 1, seed: int = 0, track: int = 1000,
              progress: bool = True, init_sweeps: int = 0, release_host: bool = False,
              prior=None, release_compiled: bool = False, parallel_chains: int = 2) -> dict:
    """``chains`` chains of :class:`ConjugateGibbs` on ``corpus`` (an
    :class:`~ppl_attention.data.indexed.IndexedCorpus`), ``parallel_chains`` at once in
    threads (1: one after another, one chain's accumulators in memory at a time; the same
    draws either way) by :func:`donated_chains`, started (``init_sweeps`` > 0, IBM2
    / HMM) from :func:`ibm1_start`; ``release_host``: the corpus's host batch arrays are
    dropped once on the device (:meth:`~ppl_attention.data.indexed.IndexedCorpus.release_batches`);
    ``release_compiled``: JAX's in-memory compiled programs are cleared after each stage
    (IBM1, the HMM start, the chains: a fertility sweep holds about 0.3 GB at 100k pairs;
    the persistent cache brings them back in a second or two) — for a program that owns the
    process, as ``wordalign`` does, not for a session with compiled functions of its own;
    ``prior``: pseudo-counts from tables trained elsewhere (:func:`device_corpus`), the chains
    started from their posterior means. The fertility aligner's chains start from
    :func:`hmm_start` (HMM sweeps: a quarter of the fertility sweeps, at least 2, as eflomal's
    model 3). Returns ``marginals`` (per class ``[n, B, S1, T]``, averaged over chains and
    draws); ``counts``: the posterior mean counts (cells ``[C]`` from the marginals, buckets
    ``[K]`` and fertilities ``[n_src, F + 1]`` (or None) the drawn counts' means) — the
    tables to save;
    ``traces``: ``loglik [chains, draws]``, ``track [chains, draws, n_track]`` (the tracked
    words' drawn positions), ``log_dist [chains, draws, K]``, ``bucket_counts``; ``agreement``
    (two chains or more; else None): over *every* target word of the corpus, the largest total
    variation between two chains' link marginals — its mean, max and the share above
    ``TV_LIMIT`` (Rao–Blackwellized for IBM1/2 and the fertility aligner, each chain's average
    conditional; for the HMM each chain's drawn-link frequencies); ``seconds``."""
    _check_counts(chains=(chains, 1), warmup=(warmup, 0), samples=(samples, 1),
                  thinning=(thinning, 1), init_sweeps=(init_sweeps, 0))
    enable_compilation_cache()
    sizes, data = device_corpus(corpus, prior)
    idx = _track_indices(corpus, track, seed)
    if release_host:
        corpus.release_batches()
    t0 = time.perf_counter()

    def stage_done():
        if release_compiled:
            jax.clear_caches()
        collect_young()
        return_free_memory()

    start = ibm1_start(spec, sizes, data, init_sweeps, progress) \
        if init_sweeps and spec.kind.buckets != "none" else None
    stage_done()
    if spec.kind.fertility:  # as eflomal: IBM1, then the HMM, then the fertility model
        start = hmm_start(spec, sizes, data, idx, max(2, round((warmup + samples * thinning)
                                                               / 4)),
                          start, seed, progress)
        stage_done()
    kept = samples * thinning  # transitions after warm-up, each adding its conditional
    kernel = ConjugateGibbs(spec, sizes)
    model_args = (data, idx) + ((start,) if start is not None else ())
    z, per_chain, scales = [], [], []
    for c, (draws, marg) in enumerate(donated_chains(
            kernel, jax.random.split(chain_key(seed), chains), model_args, warmup,
            samples, thinning, progress, parallel_chains)):
        z.append(draws)
        marg = list(marg)
        scale = 1.0 / kept
        if c < chains - 1 and marg[0].dtype == jnp.float32:  # held while the others are read
            for ci in range(len(marg)):  # class by class, the float32 sums freed as we go
                marg[ci] = _half_mean(marg[ci], scale)
            scale = 1.0
        per_chain.append(tuple(marg))
        scales.append(scale)
        del marg
        return_free_memory()
    stage_done()
    z = {name: np.concatenate([c[name] for c in z]) for name in z[0]}
    marg, cells = [], jnp.zeros(sizes["n_cells"], jnp.float32)
    tv = []
    for ci, cls in enumerate(data["classes"]):  # one class at a time
        m, class_cells, worst = _class_summary(tuple(c[ci] for c in per_chain), tuple(scales),
                                               cls, sizes["n_cells"])
        per_chain = [c[:ci] + (None,) + c[ci + 1:] for c in per_chain]  # this class freed
        if chains > 1:
            tv.append(np.asarray(worst)[np.asarray(cls["tgt_mask"])])
        cells = cells + class_cells
        marg.append(np.asarray(m))
    del per_chain
    drawn = z["bucket_counts"]  # [chains, draws, K]
    counts = (np.asarray(cells), drawn.mean((0, 1)) if drawn.size else
              np.zeros(spec.n_buckets, np.float32),
              z.pop("fert_counts").mean((0, 1)) if spec.kind.fertility else None)
    agreement = None
    if tv:
        tv = np.concatenate(tv)
        agreement = {"words": int(tv.size), "marginal_tv_mean": float(tv.mean()),
                     "marginal_tv_max": float(tv.max()),
                     "share_marginal_tv_over": float((tv > TV_LIMIT).mean()),
                     "rao_blackwellized": spec.kind.rao_blackwellized}
    return {"marginals": marg, "counts": counts, "traces": z, "agreement": agreement,
            "seconds": time.perf_counter() - t0,
            "track_indices": [np.asarray(i) for i in idx]}


@jax.jit
def _half_mean(m, scale):
    """A finished chain's link marginals ``m · scale`` (its sum over the kept sweeps times
    1 / kept) in float16, held while the next chain runs: half a float32 sum's memory, each
    marginal in [0, 1] to 2⁻¹¹ of itself — below a thousandth of a link's posterior."""
    return (m * scale).astype(jnp.float16)


@functools.partial(jax.jit, static_argnames="n_cells")
def _class_summary(chains_m, scales, cls, n_cells: int):
    """One class's chains summed up in one compiled program: the link marginals averaged over
    chains ``[n, B, S1, T]``, their cell counts ``[C]`` and the chains' largest disagreement
    per target word ``[n, B, T]`` (:func:`_chains_tv`; zeros for one chain), from
    ``chains_m`` (per chain ``[n, B, S1, T]``; times its ``scales`` entry, that chain's link
    marginals: a sum over kept sweeps times 1 / kept, or :func:`_half_mean`'s marginals
    times 1). Each chain's marginals of a real target word are renormalized over NULL and the
    source positions first (a no-op but for a held chain's float16 rounding, which would
    otherwise put a total variation above 1). No chains' stack is made: each chain is read
    once, the whole summary one fused pass (a third of the stacked version's time)."""
    ms = []
    for x, s in zip(chains_m, scales):
        x = x.astype(jnp.float32) * s
        total = x.sum(-2, keepdims=True)  # 1 for a real target word, up to float16's rounding
        ms.append(jnp.where(total > 0, x / jnp.where(total > 0, total, 1.0), 0.0))
    worst = _chains_tv(ms)
    mean = sum(ms[1:], ms[0]) / len(ms)
    return mean, _cell_counts({"classes": [cls]}, [mean], n_cells), worst


def _chains_tv(ms):
    """Per target word ``[n, B, T]``, the largest total variation between two chains' link
    marginals (``ms``: per chain ``[n, B, S1, T]``, each normalized over S1), in [0, 1] (zeros
    for one chain)."""
    worst = jnp.zeros(ms[0].shape[:2] + ms[0].shape[3:], ms[0].dtype)
    for a in range(len(ms)):
        for b in range(a + 1, len(ms)):
            worst = jnp.maximum(worst, 0.5 * jnp.abs(ms[a] - ms[b]).sum(-2))
    return jnp.minimum(worst, 1.0)  # float32 rounding of two disjoint distributions


def link_rhat(track: np.ndarray) -> dict:
    """R-hat and bulk ESS of the link indicators of the tracked target words: ``track
    [chains, draws, n]`` (each draw's source position); per word the indicator of its most
    frequent position (ArviZ's rank-normalized split R-hat; words whose every draw agrees are
    left out — their R-hat is undefined, and they have converged to one link; a word constant
    within each chain but not across them has R-hat ∞). ``share_rhat_ok``: the tracked words
    whose link has R-hat ≤ 1.01 (the constant ones included)."""
    from ...common import arviz_api

    C, D, n = track.shape
    rows = []
    for w in range(n):
        vals, counts = np.unique(track[:, :, w], return_counts=True)
        ind = (track[:, :, w] == vals[counts.argmax()]).astype(np.float64)
        if ind.min() == ind.max():
            continue
        rows.append(ind)
    if not rows:
        return {"rhat_max": 1.0, "ess_bulk_min": float(C * D), "n_varying": 0, "n": n,
                "share_rhat_ok": 1.0}
    ind = np.stack(rows, -1)  # [C, D, n_varying]
    idata = arviz_api.from_dict(posterior={"link": ind})
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        s = arviz_api.summary(idata, kind="diagnostics")
    rhat = np.asarray(s["r_hat"], float)
    rhat = np.where(np.isnan(rhat), np.inf, rhat)  # undefined: a word constant in each chain
    ess = np.nan_to_num(np.asarray(s["ess_bulk"], float), nan=0.0)
    return {"rhat_max": _json_number(rhat.max()), "rhat_median": _json_number(np.median(rhat)),
            "ess_bulk_min": _json_number(ess.min()),
            "ess_bulk_median": _json_number(np.median(ess)),
            "share_rhat_ok": (n - len(rows) + int((rhat <= 1.01).sum())) / n,
            "n_varying": len(rows), "n": n}


#: what makes a Gibbs run "not mixed" (:func:`chain_diagnostics`): a share of stuck tracked
#: words above this, a varying word's R-hat above this, or two chains' link frequencies of a
#: word further apart (total variation) than this
STUCK_SHARE, RHAT_LIMIT, TV_LIMIT = 0.01, 1.05, 0.3


def chain_diagnostics(track: np.ndarray, agreement: dict | None = None) -> dict:
    """Mixing of the discrete chains, for a run that stops on them: ``track [chains, draws,
    n]`` (each draw's source position of n tracked target words). Each word is

    - *settled*: every draw of every chain the same position;
    - *stuck*: each chain constant, but the chains on different positions — the chains disagree
      and never move, where indicator R-hat is undefined (∞): reported as a share, not as an
      R-hat;
    - *moving*: some chain visits two positions — its link indicator's R-hat is defined.

    Beside R-hat, the chains' agreement: per word the total variation between two chains' link
    frequencies (the largest over chain pairs), its mean and largest over the words. ``mixed``
    is False when the stuck share exceeds ``STUCK_SHARE``, a moving word's R-hat ``RHAT_LIMIT``
    or the largest disagreement ``TV_LIMIT``; ``advice`` then says what to change. With
    ``agreement`` (:func:`run_gibbs`'s, over every target word of the corpus) its figures join
    the report, and — where the marginals are Rao–Blackwellized (IBM1/2: the exact conditionals
    given the tables; fertility: each word's single-site conditional given the rest, smooth
    enough that chains over 0.3 apart on a word disagree about it) — more than ``STUCK_SHARE``
    of the corpus's words whose chains' marginals are over ``TV_LIMIT`` apart is not mixed
    either (the HMM's drawn-link frequencies over a few kept sweeps differ that much by chance:
    reported, not held to the limit). One chain: nothing to compare (``mixed`` None)."""
    C, D, n = track.shape
    if C < 2 or n == 0:
        return {"mixed": None, "n": n, "advice": "one chain: run --chains 2 or more to check "
                "mixing" if C < 2 else ""}
    constant_in_chain = (track == track[:, :1]).all(1)  # [C, n]
    within = constant_in_chain.all(0)
    agree = (track[:, 0] == track[:1, 0]).all(0)
    settled, stuck = within & agree, within & ~agree
    tv = np.zeros(n)
    for w in range(n):
        vals = np.unique(track[:, :, w])
        freq = (track[:, :, w][..., None] == vals).mean(1)  # [C, values]
        tv[w] = max(0.5 * np.abs(freq[a] - freq[b]).sum()
                    for a in range(C) for b in range(a + 1, C))
    moving = ~within
    rh = link_rhat(track[:, :, moving]) if moving.any() else {"rhat_max": 1.0}
    rhat_max = rh["rhat_max"]
    rhat_value = float("inf") if isinstance(rhat_max, str) else float(rhat_max)
    out = {"n": n, "share_settled": float(settled.mean()), "share_stuck": float(stuck.mean()),
           "share_moving": float(moving.mean()), "rhat_max_moving": rhat_max,
           "disagreement_mean": float(tv.mean()), "disagreement_max": float(tv.max())}
    problems = []
    if out["share_stuck"] > STUCK_SHARE:
        problems.append(f"{100 * out['share_stuck']:.1f} % of the tracked words are stuck "
                        f"(each chain constant, the chains apart)")
    if rhat_value > RHAT_LIMIT:
        problems.append(f"R-hat of a moving link {rhat_value:.2f}")
    if out["disagreement_max"] > TV_LIMIT:
        problems.append(f"two chains' link frequencies of a word {out['disagreement_max']:.2f} "
                        f"apart (total variation)")
    if agreement:
        out.update(agreement)
        # drawn-link frequencies of a few kept sweeps differ by chance: only Rao–Blackwellized
        # marginals are held to the limit
        if agreement["rao_blackwellized"] and \
                agreement["share_marginal_tv_over"] > STUCK_SHARE:
            problems.append(f"{100 * agreement['share_marginal_tv_over']:.1f} % of the corpus's "
                            f"target words have chains' link marginals more than {TV_LIMIT} "
                            f"apart")
    out["mixed"] = not problems
    out["advice"] = "" if not problems else (
        "; ".join(problems) + ": not mixed — run more sweeps (--warmup, --samples), more "
        "chains (--chains), or a larger --alpha (rare words' chains move more freely)")
    return out


def _json_number(x):
    """A float for a JSON report; ``"inf"`` where it is not finite (strict JSON has no inf)."""
    x = float(x)
    return x if np.isfinite(x) else ("inf" if x > 0 else "-inf" if x < 0 else "nan")


def vb_sweeps(spec: al.AlignerSpec, sizes: dict, data: dict, iterations: int = 50,
              tol: float = 1e-6, progress: bool = True, marginals: bool = True) -> dict:
    """Mean-field VB on a corpus given as (``sizes``, ``data``) (:func:`device_corpus`) to
    convergence (relative ELBO change below ``tol``) or ``iterations`` sweeps: ``marginals``
    (per class, under the last q; None with ``marginals=False``, which leaves them uncomputed
    — IBM1's start needs only the counts), ``elbo`` per sweep, ``counts`` — the expected counts
    (cells ``[C]``, buckets ``[K]``) that make q(θ_e) = Dirichlet(α + counts of e's cells) and
    q(δ) = Dirichlet(γ + bucket counts)."""
    _check_counts(iterations=(iterations, 1))
    _check_method(spec, "vb")
    if spec.kind.fertility:
        return fertility_vb(spec, sizes, data, iterations, tol, progress, marginals)
    counts_c = jnp.zeros(sizes["n_cells"], jnp.float32)
    counts_b = jnp.zeros(spec.n_buckets, jnp.float32)

    @jax.jit
    def e_step(counts_c, counts_b, data):
        lt = _translation(al.expected_log_translation, spec, counts_c, sizes, data)
        ld = al.expected_log_buckets(spec, counts_b, data.get("prior"))
        total, probs, _ = _sweep(spec, jax.random.PRNGKey(0), lt, ld, sizes, data, "expect")
        kl = _translation(al.translation_kl, spec, counts_c, sizes, data) + \
            al.bucket_kl(spec, counts_b, data.get("prior"))
        return total, probs if marginals else None, total["loglik"] - kl

    elbo, probs = [], None
    bar = progress_bar(range(iterations), desc=f"vb {spec.model}", unit="sweep",
                       disable=not progress)
    for _ in bar:
        total, probs, value = e_step(counts_c, counts_b, data)
        elbo.append(float(value))
        bar.set_postfix(elbo=f"{elbo[-1]:.1f}")
        counts_c, counts_b = total["expected_cells"], total["expected_buckets"]
        if len(elbo) > 1 and abs(elbo[-1] - elbo[-2]) <= tol * abs(elbo[-2]):
            break
    bar.close()
    return {"marginals": [np.asarray(p) for p in probs] if marginals else None, "elbo": elbo,
            "counts": (np.asarray(counts_c), np.asarray(counts_b))}


def _fertility_vb_sweep(spec, sizes, data, counts, q):
    """One mean-field sweep of the fertility aligner over the corpus
    (:func:`~ppl_attention.numpyro.aligners._fertility_mean_field` batch by batch) under the
    expectations of the tables' q given ``counts`` (cells, buckets, fertilities): the new q
    per class ``[n, B, S1, T]``, the new expected counts and the ELBO of the q it started
    from's tables and the new local q."""
    counts_c, counts_b, counts_f = counts
    prior = data.get("prior")
    lt = _translation(al.expected_log_translation, spec, counts_c, sizes, data)
    ld = al.expected_log_buckets(spec, counts_b, prior)
    lpsi = al.expected_log_fertility(spec, counts_f, prior)
    C, dt = sizes["n_cells"], lt.dtype
    acc = {"expected_cells": jnp.zeros(C, dt), "expected_buckets": jnp.zeros(spec.n_buckets, dt),
           "expected_fert": jnp.zeros((sizes["n_src"], spec.n_fertility), dt),
           "loglik": jnp.zeros((), dt)}
    new_q = []
    for cls, q_cls in zip(data["classes"], q):
        def body(acc, xs):
            b, q_b = xs
            out = al._fertility_mean_field(spec, lt, ld, lpsi, b, q_b, C,
                                           {"expected_cells": acc["expected_cells"]})
            src, dist, real = out["expected_fert"]
            fert = acc["expected_fert"].at[src.ravel()].add(
                jnp.where(real[..., None], dist, 0.0).reshape(-1, spec.n_fertility))
            return {"expected_cells": out["expected_cells"], "expected_fert": fert,
                    "expected_buckets": acc["expected_buckets"] + out["expected_buckets"],
                    "loglik": acc["loglik"] + out["loglik"]}, out["probs"]

        acc, q_new = jax.lax.scan(body, acc, (cls, q_cls))
        new_q.append(q_new)
    elbo = acc["loglik"] - _translation(al.translation_kl, spec, counts_c, sizes, data) - \
        al.bucket_kl(spec, counts_b, prior) - al.fertility_kl(spec, counts_f, prior)
    return new_q, (acc["expected_cells"], acc["expected_buckets"], acc["expected_fert"]), elbo


def fertility_vb(spec: al.AlignerSpec, sizes: dict, data: dict, iterations: int = 50,
                 tol: float = 1e-6, progress: bool = True, marginals: bool = True) -> dict:
    """Mean-field VB for the fertility aligner: q(θ) q(φ) q(ψ) Π_j q(a_j), started — as
    eflomal starts its model 3 from its HMM — from ``max(2, iterations // 4)`` sweeps of the
    HMM's VB (its link marginals the first q(a_j), its expected counts the tables' first q),
    then coordinate ascent (:func:`_fertility_vb_sweep`) to convergence (relative ELBO change
    below ``tol``) or ``iterations`` sweeps. Each step maximizes the ELBO of the relaxed
    model (fertilities past F weighted e^LOG_PAST_F, not 0) in one factor, so the ELBO never
    falls. Returns as :func:`vb_sweeps`, ``counts`` with the expected fertility counts
    ``[n_src, F + 1]`` third and ``elbo`` the fertility sweeps' (the HMM start's in
    ``start_elbo``)."""
    hmm = al.aligner("hmm", alpha=spec.alpha, gamma=spec.gamma, max_jump=spec.max_jump,
                     null_prior=spec.null_prior)
    start = vb_sweeps(hmm, sizes, data, max(2, iterations // 4), tol=0.0, progress=progress)
    q = [jnp.asarray(m) for m in start["marginals"]]
    del start["marginals"]
    counts = (jnp.asarray(start["counts"][0]), jnp.asarray(start["counts"][1]),
              jnp.zeros((sizes["n_src"], spec.n_fertility), jnp.float32))
    sweep = jax.jit(lambda counts, q, data: _fertility_vb_sweep(spec, sizes, data, counts, q),
                    donate_argnums=1)
    elbo = []
    bar = progress_bar(range(iterations), desc="vb fertility", unit="sweep",
                       disable=not progress)
    for _ in bar:
        q, counts, value = sweep(counts, q, data)
        elbo.append(float(value))
        if not np.isfinite(elbo[-1]):
            raise FloatingPointError(f"vb fertility: the ELBO is {elbo[-1]} at sweep "
                                     f"{len(elbo)}")
        bar.set_postfix(elbo=f"{elbo[-1]:.1f}")
        if len(elbo) > 1 and abs(elbo[-1] - elbo[-2]) <= tol * abs(elbo[-2]):
            break
    bar.close()
    return {"marginals": [np.asarray(m) for m in q] if marginals else None, "elbo": elbo,
            "start_elbo": start["elbo"], "counts": tuple(np.asarray(c) for c in counts)}


def run_vb(spec: al.AlignerSpec, corpus, iterations: int = 50, tol: float = 1e-6,
           progress: bool = True, release_host: bool = False, prior=None) -> dict:
    """:func:`vb_sweeps` on an :class:`~ppl_attention.data.indexed.IndexedCorpus`, timed
    (``seconds``); ``release_host`` and ``prior`` as :func:`run_gibbs`."""
    _check_counts(iterations=(iterations, 1))
    enable_compilation_cache()
    sizes, data = device_corpus(corpus, prior)
    if release_host:
        corpus.release_batches()
    t0 = time.perf_counter()
    out = vb_sweeps(spec, sizes, data, iterations, tol, progress)
    return {**out, "seconds": time.perf_counter() - t0}


def run_svb(spec: al.AlignerSpec, corpus, epochs: int = 5, tau: float = 1.0,
            kappa: float = 0.7, seed: int = 0, progress: bool = True, prior=None) -> dict:
    """Stochastic VB: each step one batch of the corpus (its expected counts scaled to the
    corpus), the natural parameters moved by ρ_t = (τ + t)^−κ; then one full E-step for the
    marginals. ``elbo``: the full ELBO after each epoch."""
    _check_method(spec, "svb")
    if not 0.5 < kappa <= 1:
        raise UserError(f"--kappa must be in (0.5, 1] (Robbins–Monro), got {kappa}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise UserError(f"--epochs must be an int ≥ 1, got {epochs!r}")
    sizes, data = device_corpus(corpus, prior)
    words = float(sum(int(c.tgt_mask.sum()) for c in corpus.classes))
    lam_c = jnp.zeros(sizes["n_cells"], jnp.float32)
    lam_b = jnp.zeros(spec.n_buckets, jnp.float32)

    def step(b, arrays, lam_c, lam_b, rho):
        lt = _translation(al.expected_log_translation, spec, lam_c, sizes, arrays)
        out = al.batch_step(spec, jax.random.PRNGKey(0), lt,
                            al.expected_log_buckets(spec, lam_b, arrays.get("prior")), b,
                            sizes["n_cells"], "expect")
        scale = words / jnp.maximum(b["tgt_mask"].sum(), 1)
        return ((1 - rho) * lam_c + rho * scale * out["expected_cells"],
                (1 - rho) * lam_b + rho * scale * out.get("expected_buckets", lam_b * 0))

    step = jax.jit(step)
    elbo_fn = jax.jit(lambda c, b, d: _elbo(spec, sizes, d, c, b))
    rng = np.random.default_rng(seed)
    order = [(ci, n) for ci, c in enumerate(corpus.classes) for n in range(c.shape[0])]
    t, elbo = 0, []
    t0 = time.perf_counter()
    for _ in progress_bar(range(epochs), desc=f"svb {spec.model}", unit="epoch",
                          disable=not progress):
        for ci, n in (order[k] for k in rng.permutation(len(order))):
            b = {k: v[n] for k, v in data["classes"][ci].items()}
            lam_c, lam_b = step(b, {k: v for k, v in data.items() if k != "classes"}, lam_c,
                                lam_b, (tau + t) ** -kappa)
            t += 1
        elbo.append(float(elbo_fn(lam_c, lam_b, data)))
    lt = _translation(al.expected_log_translation, spec, lam_c, sizes, data)
    total, probs, _ = jax.jit(lambda a, b, d: _sweep(spec, jax.random.PRNGKey(0), a, b, sizes,
                                                     d, "expect"))(
        lt, al.expected_log_buckets(spec, lam_b, data.get("prior")), data)
    return {"marginals": [np.asarray(p) for p in probs], "elbo": elbo,
            "counts": (np.asarray(total["expected_cells"]),
                       np.asarray(total["expected_buckets"])),
            "seconds": time.perf_counter() - t0}


def _elbo(spec, sizes, data, counts_c, counts_b):
    lt = _translation(al.expected_log_translation, spec, counts_c, sizes, data)
    ld = al.expected_log_buckets(spec, counts_b, data.get("prior"))
    total, _, _ = _sweep(spec, jax.random.PRNGKey(0), lt, ld, sizes, data, "expect")
    return total["loglik"] - _translation(al.translation_kl, spec, counts_c, sizes, data) - \
        al.bucket_kl(spec, counts_b, data.get("prior"))


@dataclass
class BestLinks:
    """Each target word's most probable position, per shape class (``best [rows, T]``: 0 for
    NULL, i + 1 for source word i; ``index [rows]`` the corpus position of each row, −1 for a
    filler row), and each pair's ``tgt_len``: a direction's links held in a few MiB until they
    are needed as sets (:meth:`sets`), where a set per pair holds a hundred times as much."""

    best: list
    index: list
    tgt_len: np.ndarray

    @classmethod
    def of(cls, corpus, marginals) -> BestLinks:
        dtype = np.int16 if max(m.shape[2] for m in marginals) < 2 ** 15 else np.int32
        best, index = [], []
        for c, m in zip(corpus.classes, marginals):
            n, B, S1, T = m.shape
            best.append(np.asarray(m).reshape(n * B, S1, T).argmax(1).astype(dtype))
            index.append(c.index.reshape(-1))
        return cls(best, index, np.asarray(corpus.tgt_len))

    def _links(self):
        """Per shape class: each real row's corpus position ``[rows]``, and its links as arrays
        in row-major order (by row, then target j; one link per j) — their rows ``r``, source
        positions ``i``, targets ``j`` — with each row's end in them."""
        for best, index in zip(self.best, self.index):
            rows = np.flatnonzero(index >= 0)
            b = best[rows].astype(np.int64)
            keep = (b > 0) & (np.arange(b.shape[1])[None] < self.tgt_len[index[rows]][:, None])
            r, j = np.nonzero(keep)
            ends = np.cumsum(np.bincount(r, minlength=len(rows))).tolist()
            yield index[rows].tolist(), r, b[r, j] - 1, j, ends

    def sets(self) -> list[set]:
        """Each pair's links {(source i, target j)}, in corpus order (none for NULL)."""
        out: list[set] = [set() for _ in range(len(self.tgt_len))]
        for where, _, i, j, ends in self._links():
            links = list(zip(i.tolist(), j.tolist()))
            start = 0
            for k, end in zip(where, ends):
                out[k] = set(links[start:end])
                start = end
        return out

    def lines(self, transpose: bool = False) -> list[str]:
        """Each pair's Pharaoh line, in corpus order — what ``format_pharaoh`` writes of
        :meth:`sets`, made from the arrays (each distinct ``i-j`` formatted once, no set per
        pair); ``transpose``: each link (i, j) written ``j-i`` (a reverse direction's links in
        the forward orientation), in Pharaoh's order of the written pairs (by target, then
        source)."""
        out = [""] * len(self.tgt_len)
        for where, r, i, j, ends in self._links():
            src, tgt = (j, i) if transpose else (i, j)
            if transpose:  # Pharaoh order of the written pairs: by row, target, source
                order = np.lexsort((src, tgt, r))
                src, tgt = src[order], tgt[order]
            width = int(max(src.max(initial=0), tgt.max(initial=0))) + 1
            codes, inverse = np.unique(src * width + tgt, return_inverse=True)
            texts = [f"{c // width}-{c % width}" for c in codes.tolist()]
            items = [texts[x] for x in inverse.tolist()]
            start = 0
            for k, end in zip(where, ends):
                out[k] = " ".join(items[start:end])
                start = end
        return out


def links_from_marginals(corpus, marginals, threshold: float | None = None,
                         with_scores: bool = False):
    """Each pair's links (source i, target j), in corpus order: each target word to its most
    probable position, none when that is NULL (``threshold``: instead every position whose
    marginal reaches it). ``with_scores``: also each pair's link posteriors ``{(i, j): p}`` —
    every link with its marginal, and each target word left unlinked with its NULL marginal
    as ``(-1, j)`` — returned as ``(links, scores)``."""
    if threshold is None and not with_scores:
        return BestLinks.of(corpus, marginals).sets()
    out: list[set] = [set() for _ in range(corpus.n_pairs)]
    scores: list[dict] = [{} for _ in range(corpus.n_pairs)] if with_scores else []
    for cls, m in zip(corpus.classes, marginals):
        n, B, S1, T = m.shape
        m = m.reshape(n * B, S1, T)
        index = cls.index.reshape(-1)
        best = m.argmax(1).tolist()  # [rows, T], Python ints
        for r in np.flatnonzero(index >= 0).tolist():
            k = int(index[r])
            Tk, Sk = int(corpus.tgt_len[k]), int(corpus.src_len[k])
            if threshold is None:
                out[k] = {(b - 1, j) for j, b in enumerate(best[r][:Tk]) if b > 0}
            else:
                i, j = np.nonzero(m[r, 1:1 + Sk, :Tk] >= threshold)
                out[k] = set(zip(i.tolist(), j.tolist()))
            if with_scores:
                sc = {(i, j): float(m[r, i + 1, j]) for i, j in out[k]}
                linked = {j for _, j in out[k]}
                sc.update({(-1, j): float(m[r, 0, j]) for j in range(Tk) if j not in linked})
                scores[k] = sc
    return (out, scores) if with_scores else out
