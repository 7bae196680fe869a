"""The NumPyro side of :mod:`ppl_attention.analysis.sbc`: a NumPyro model's simulations
(:func:`ppl_attention.numpyro.models.base.simulate`) and its guide's draws for one batch, as the
same numpy arrays the Pyro side gives."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers

from ...common.contract import capabilities, declared
from ...core.method_specs import guide_posterior as _guide_posterior
from ...core.method_specs import method_spec
from ...core.records import recording
from ..models.base import exact_posterior, simulate, substitute_params
from .evaluate import jitted, model_and_params, run_batch

__all__ = ["calibration_arrays", "calibration_probs", "distortion"]


def distortion(kind: str, factor: float):
    """A planted miscalibration of a guide site's NumPyro distribution (the NumPyro side of
    :func:`ppl_attention.analysis.sbc.planted`): ``"logits"`` multiplies a categorical
    q's logits by ``factor``, ``"concentration"`` a Dirichlet q's concentration."""
    from numpyro.distributions import MaskedDistribution

    from ...core.errors import UserError
    from ..distributions import MaskedDirichlet
    from ..trees import DependencyTree

    def distort(fn):
        mask = None
        if isinstance(fn, MaskedDistribution):
            fn, mask = fn.base_dist, fn._mask
        if kind == "logits" and isinstance(fn, DependencyTree):  # a tree: its arc scores
            new = fn._same_kind(fn.theta * factor)
        elif kind == "logits" and getattr(fn.support, "is_discrete", False) \
                and hasattr(fn, "logits"):
            new = type(fn)(logits=fn.logits * factor)
        elif kind == "concentration" and isinstance(fn, MaskedDirichlet):
            new = MaskedDirichlet(fn.concentration * factor, fn.source_mask)
        else:
            raise UserError(f"cannot plant {kind!r} in a {type(fn).__name__} guide site")
        return new if mask is None else new.mask(mask)

    return distort


def _guide_site(model, params, batch, posterior, key, distort=None):
    site = declared(model, "site")
    guide = functools.partial(model.guide, posterior=posterior)
    guide = substitute_params(guide, params)
    if distort is not None:
        guide = _distorted(guide, site, distort)
    with recording() as calls:
        trace = handlers.trace(handlers.seed(guide, key)).get_trace(batch)
    return trace[site], next(c for c in calls if c.name == site)


def _distorted(fn, site, distort):
    def process(msg):
        if msg["type"] == "sample" and msg["name"] == site:
            msg["fn"] = distort(msg["fn"])

    class Distort(handlers.Messenger):
        def process_message(self, msg):
            process(msg)

    return Distort(fn)


def _q_probs(node, batch):
    fn = node["fn"]
    support = fn.enumerate_support(expand=False)
    B, T = batch.tgt_out.shape
    q = jnp.broadcast_to(jnp.exp(fn.log_prob(support)), (support.shape[0], B, T))
    return jnp.transpose(q, (1, 2, 0))


def _per_pair(node, value, mask):
    lp = node["fn"].log_prob(value)
    return jnp.where(mask, lp, 0.0).sum(-1)


def _exact(model):
    return jitted(model, "exact_posterior", lambda: functools.partial(exact_posterior, model))


def calibration_arrays(run, batch, draws: int, seed: int, distort=None,
                       importance: dict | None = None) -> dict:
    """As :func:`ppl_attention.pyro.inference.calibration.calibration_arrays`, under NumPyro."""
    out = _arrays(run, batch, draws, seed, distort)
    if importance is not None:  # the guide's K draws on the simulated targets, to be weighed
        from .importance import crop, padded_arrays

        jb, model, params, sim, value = out.pop("_sim")
        site = declared(model, "site")
        wrap = None if distort is None else (lambda g: _distorted(g, site, distort))
        raw = padded_arrays(model, params, sim, _guide_posterior(run.method, run.model),
                            importance["samples"], seed + 7, None, wrap)
        B, T = batch.tgt_out.shape
        out["imp"] = crop(raw, model.family, B, T, batch.src.shape[1])
        if "logq_truth" not in out:  # a categorical guide: log q(z*) = Σ_t log q(z*_t)
            m = method_spec(run.method)
            node, _ = _guide_site(model, params, sim, m.posterior, jax.random.PRNGKey(seed),
                                  distort)
            out["logq_truth"] = np.asarray(_per_pair(node, value, sim.tgt_mask))[:B]
    else:
        out.pop("_sim")
    return out


def _arrays(run, batch, draws: int, seed: int, distort=None) -> dict:
    jb = run_batch(run, batch)
    model, params = model_and_params(run, jb)
    fam = model.family
    m = method_spec(run.method)
    key = jax.random.PRNGKey(seed)
    sim, value, weights = simulate(model, params, jb, key)
    B, T = batch.tgt_out.shape
    S = batch.src.shape[1]
    if getattr(fam, "tree", False):
        out = _tree_arrays(model, params, m, sim, value, draws, key, distort, B, S)
        out["_sim"] = (jb, model, params, sim, value)
        return out
    crop = (slice(0, B), slice(0, T))
    out = {"mask": np.asarray(sim.tgt_mask)[crop], "_sim": (jb, model, params, sim, value)}
    if "exact-posterior" in capabilities(model):
        out["exact_probs"] = np.asarray(_exact(model)(params, sim))[crop][..., :S]
    truth = value if fam.enumerable or fam.latent_context else weights
    truth = np.asarray(truth)[crop]
    out["truth"] = truth if fam.enumerable or fam.latent_context else truth[..., :S]
    if m.posterior == "none":
        return out
    if fam.enumerable:
        def q_fn(p, b, k):
            return _q_probs(_guide_site(model, p, b, m.posterior, k, distort)[0], b)

        q = jitted(model, f"calibration-q-{m.posterior}", lambda: q_fn)(params, sim, key) \
            if distort is None else jax.jit(q_fn)(params, sim, key)
        out["q_probs"] = np.asarray(q)[crop][..., :S]
        return out

    def build():
        def one(p, b, k, v):
            node, call = _guide_site(model, p, b, m.posterior, k, distort)
            kept = node["value"] if fam.latent_context else call.weights
            parts = call.family.part_marginals(call.scores, call.mask) if fam.selects \
                else jnp.zeros(())
            return (kept, _per_pair(node, node["value"], b.tgt_mask),
                    _per_pair(node, v, b.tgt_mask), parts)

        return lambda p, b, keys, v: jax.vmap(lambda k: one(p, b, k, v))(keys)

    fn = jitted(model, f"calibration-draws-{m.posterior}-{distort is None}", build) \
        if distort is None else jax.jit(build())
    kept, logq, logq_truth, parts = fn(params, sim,
                                       jax.random.split(jax.random.fold_in(key, 1), draws), value)
    kept = np.asarray(kept)[:, :B, :T]
    if fam.selects:  # each part (token t; a position, or a span): q's exact p(part selected)
        part = (slice(0, B), slice(0, T)) + (slice(0, S),) * fam.part_dims
        out["q_part_probs"] = np.asarray(parts)[0][part]
        out["part_truth"] = np.asarray(fam.parts(value, weights.dtype))[part]
        src = np.asarray(fam.part_mask(sim.src_mask))[(slice(0, B),) + part[2:]]
        out["part_mask"] = (np.asarray(sim.tgt_mask)[:B, :T].reshape((B, T) + (1,) * fam.part_dims)
                            & src[:, None])
    out["q_values"] = kept if fam.latent_context else kept[..., :S]
    out["logq_draws"] = np.asarray(logq)[:, :B]
    out["logq_truth"] = np.asarray(logq_truth)[0, :B]
    return out


def _tree_arrays(model, params, m, sim, value, draws, key, distort, B, S) -> dict:
    """The Pyro side's ``_tree_arrays`` under NumPyro: per word, q's arc marginals and the
    exact log q of L of its trees and of the simulated one; the same of the exact posterior
    (``exact_``, the tree of θ + φ) where the model has arc emissions — distorted by
    ``distort`` when the method has no guide (``tree-exact``)."""
    from ..trees import DependencyTree
    from .evaluate import tree_scores

    Bp, Sp = sim.src.shape
    heads = value.reshape(Bp, Sp)
    out = {"mask": np.asarray(sim.src_mask)[:B, :S], "truth": np.asarray(heads)[:B, :S]}
    posteriors = {}
    if m.posterior != "none":
        posteriors[""] = _guide_site(model, params, sim, m.posterior, key, distort)[0]["fn"]
    if "arc-emissions" in capabilities(model):
        fam = model.family
        scores, lengths = tree_scores(model, params, sim, posterior=True)
        exact = DependencyTree(scores, lengths, projective=fam.projective,
                               single_root=fam.single_root)
        posteriors["exact_"] = exact if distort is None or m.posterior != "none" else \
            distort(exact)
    for prefix, fn in posteriors.items():
        mu = fn.marginals.reshape(Bp, Sp, Sp)
        out["q_probs" if prefix == "" else "exact_probs"] = \
            np.asarray(jnp.swapaxes(mu, -1, -2))[:B, :S, :S]
        draws_ = fn.sample(jax.random.fold_in(key, 2), (draws,))
        out[f"{prefix}logq_draws"] = np.asarray(fn.log_prob(draws_).reshape(draws, Bp))[:, :B]
        out[f"{prefix}logq_truth"] = np.asarray(
            fn.log_prob(heads.reshape(fn.batch_shape + (Sp,))).reshape(Bp))[:B]
    return out


def calibration_probs(run, batch) -> dict:
    """As :func:`ppl_attention.pyro.inference.calibration.calibration_probs`, under NumPyro."""
    jb = run_batch(run, batch)
    model, params = model_and_params(run, jb)
    m = method_spec(run.method)
    B, T = batch.tgt_out.shape
    S = batch.src.shape[1]
    out = {}
    if "exact-posterior" in capabilities(model):
        out["exact_probs"] = np.asarray(_exact(model)(params, jb))[:B, :T, :S]
    if m.posterior != "none" and not model.family.latent_context:
        key = jax.random.PRNGKey(0)
        if model.family.enumerable:
            node, _ = _guide_site(model, params, jb, m.posterior, key)
            out["q_probs"] = np.asarray(_q_probs(node, jb))[:B, :T, :S]
        else:
            ws = [np.asarray(_guide_site(model, params, jb, m.posterior, k)[1].weights)
                  for k in jax.random.split(key, 20)]
            out["q_probs"] = np.mean(ws, 0)[:B, :T, :S]
    return out
