"""Posterior draws of alignments under NumPyro, for ``analyze`` (ArviZ) and ``diagnose``: the
arrays :func:`ppl_attention.analysis.inference_data.to_inference_data` and
:func:`ppl_attention.analysis.diagnostics.guide_diagnostics` read, computed through the NumPyro
contract alone (a NumPyro model's run, or a Pyro model's through its twin). Every function
takes a torch batch, pads it to a bucket shape (one compilation per shape) and returns numpy
arrays cropped back to the batch: ``[K, B, T, S]`` and so on.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers

from ...common.contract import capabilities, declared
from ...core.errors import UserError
from ...core.method_specs import guide_posterior as _guide_posterior
from ...core.method_specs import method_spec
from ...core.records import recording
from ..distributions import safe_log
from ..models.base import (
    exact_posterior,
    exact_token_log_likelihood,
    posterior_samples,
    prior_probs,
    substitute_params,
)
from ..traces import replay, site_log_prob
from .evaluate import jitted, log_importance_weights, model_and_params, run_batch

__all__ = ["alignment_arrays", "diagnostic_arrays", "observed_log_likelihood"]


def _observed(trace, skip: str):
    """Σ of the observed sites' log-densities (the targets) ``[..., B, T]``."""
    total = 0.0
    for name, site in trace.items():
        if site["type"] == "sample" and site["is_observed"] and name != skip:
            total = total + site_log_prob(site, scaled=False)
    return total


def observed_log_likelihood(model, params, batch, z):
    """log p(y_t | x, y<t, z_t) at alignment draws ``z [K, B, T]`` → ``[K, B, T]``: the
    model's program run once with the alignment site conditioned on all K draws (they
    broadcast on the left, as enumerated values do)."""
    site = declared(model, "site")
    conditioned = handlers.condition(substitute_params(model.model, params), data={site: z})
    trace = handlers.trace(handlers.seed(conditioned, 0)).get_trace(batch)
    return jnp.broadcast_to(_observed(trace, site), z.shape)


def _site_call(calls, site: str):
    for c in calls:
        if c.name == site:
            return c
    raise UserError(f"no pa.numpyro.attend call wrote the site {site!r} (declare the model's "
                    f"`site`)")


def _guide_q(model, params, batch, posterior):
    """q(z_t = j | x, y) ``[B, T, S]`` of an enumerable guide, on its support."""
    site = declared(model, "site")
    guide = functools.partial(model.guide, posterior=posterior)
    trace = handlers.trace(handlers.seed(substitute_params(guide, params), 0)).get_trace(batch)
    fn = trace[site]["fn"]
    support = fn.enumerate_support(expand=False)
    q = jnp.exp(fn.log_prob(support))
    B, T = batch.tgt_out.shape
    return jnp.transpose(jnp.broadcast_to(q, (support.shape[0], B, T)), (1, 2, 0))


def _one_hot_draws(key, probs, K):
    B, T, S = probs.shape
    idx = jax.random.categorical(key, safe_log(probs), axis=-1,
                                 shape=(K, B, T))
    return jax.nn.one_hot(idx, S)


def _arrays_fn(model, K: int, post: str, kind: str, with_q: bool):
    site = declared(model, "site")

    def build():
        def fn(params, b, key):
            k1, k2, k3 = jax.random.split(key, 3)
            B, T = b.tgt_out.shape
            S = b.src.shape[1]
            out = {}
            if kind == "deterministic":
                with recording() as calls:
                    trace = handlers.trace(handlers.seed(substitute_params(model.model, params),
                                                         0)).get_trace(b)
                w = _site_call(calls, site).weights
                out["prior"] = w
                out["posterior"] = out["prior_draws"] = jnp.broadcast_to(w, (K, B, T, S))
                out["log_lik"] = jnp.broadcast_to(_observed(trace, site), (K, B, T))
                return out
            if kind == "exact":
                prior = prior_probs(model, params, b)
                idx = posterior_samples(model, params, b, K, k1)
                out.update(prior=prior, exact=exact_posterior(model, params, b),
                           posterior=jax.nn.one_hot(idx, S),
                           log_lik=observed_log_likelihood(model, params, b, idx),
                           prior_draws=_one_hot_draws(k2, prior, K))
                if with_q:
                    out["q"] = _one_hot_draws(k3, _guide_q(model, params, b, "inference"), K)
                return out
            guide = functools.partial(model.guide, posterior=post)

            def one(k):
                ka, kb = jax.random.split(k)
                with recording() as calls:
                    g = handlers.trace(handlers.seed(substitute_params(guide, params), ka)
                                       ).get_trace(b)
                w_q = _site_call(calls, site).weights
                replayed = handlers.trace(handlers.seed(replay(
                    substitute_params(model.model, params), g), ka)).get_trace(b)
                ll = jnp.broadcast_to(_observed(replayed, site), (B, T))
                with recording() as calls:
                    handlers.seed(substitute_params(model.model, params), kb)(b)
                return w_q, ll, _site_call(calls, site).weights

            w, ll, prior_w = jax.vmap(one)(jax.random.split(k1, K))
            out.update(posterior=w, log_lik=ll, prior_draws=prior_w)
            return out
        return fn
    return jitted(model, f"arrays-{K}-{post}-{kind}-{with_q}", build)


def alignment_arrays(run, batch, num_samples: int, seed: int) -> dict:
    """As :func:`ppl_attention.pyro.inference.posterior.alignment_arrays`, under NumPyro:
    ``prior`` [B, T, S] or None, ``exact`` or None, ``posterior`` draws [K, B, T, S], ``q`` or
    None, ``log_lik`` [K, B, T], ``prior_draws`` [K, B, T, S] (numpy)."""
    jb = run_batch(run, batch)
    model, params = model_and_params(run, jb)
    caps = capabilities(model)
    fam = model.family
    if getattr(fam, "tree", False):
        return _tree_arrays(run, model, params, batch, jb, num_samples, seed)
    kind = "deterministic" if fam.deterministic else \
        "exact" if "posterior-samples" in caps else "guide"
    with_q = kind == "exact" and method_spec(run.method).posterior == "inference"
    fn = _arrays_fn(model, num_samples, _guide_posterior(run.method, run.model), kind, with_q)
    raw = fn(params, jb, jax.random.PRNGKey(seed))
    B, T = batch.tgt_out.shape
    S = batch.src.shape[1]
    out = {"prior": None, "exact": None, "q": None}
    for k, v in raw.items():
        a = np.asarray(v, dtype=np.float32)
        lead = a.ndim - (2 if k == "log_lik" else 3)  # a leading draw dim, or none
        idx = (slice(None),) * lead + (slice(0, B), slice(0, T)) + \
            ((slice(0, S),) if k != "log_lik" else ())
        out[k] = a[idx]
    return out


def _tree_arrays(run, model, params, batch, jb, K: int, seed: int) -> dict:
    """:func:`alignment_arrays` for a tree family, as the Pyro side's ``_tree_arrays``: the
    word attention, ``heads`` [K, B, S] from q (the prior tree for ``tree-marginals``),
    ``prior_heads``, ``arc_marginals`` [B, S, S], ``log_lik`` at each drawn tree."""
    from ..trees import DependencyTree

    site = declared(model, "site")
    fam = model.family
    key = jax.random.PRNGKey(seed)
    k1, k2 = jax.random.split(key)
    with recording() as calls:
        trace = handlers.trace(handlers.seed(substitute_params(model.model, params), 0)
                               ).get_trace(jb)
    call = _site_call(calls, site)
    Bp, T, S = call.weights.shape
    w = call.weights
    arcs = call.scores.reshape(Bp, -1, S, S).sum(1)
    prior = DependencyTree(arcs, jb.src_mask.sum(-1), projective=fam.projective,
                           single_root=fam.single_root)
    out = {"prior": w, "posterior": jnp.broadcast_to(w, (K, Bp, T, S)),
           "prior_draws": jnp.broadcast_to(w, (K, Bp, T, S)),
           "prior_heads": prior.sample(k1, (K,))}
    if fam.deterministic:
        out["heads"], out["arc_marginals"] = out["prior_heads"], prior.marginals
        out["log_lik"] = jnp.broadcast_to(_observed(trace, site), (K, Bp, T))
    else:
        guide = functools.partial(model.guide, posterior=_guide_posterior(run.method, run.model))

        def one(k):
            g = handlers.trace(handlers.seed(substitute_params(guide, params), k)).get_trace(jb)
            replayed = handlers.trace(handlers.seed(replay(
                substitute_params(model.model, params), g), k)).get_trace(jb)
            v = g[site]["value"]
            return v.reshape(Bp, -1, S)[:, 0], jnp.broadcast_to(_observed(replayed, site),
                                                              (Bp, T))
        out["heads"], out["log_lik"] = jax.vmap(one)(jax.random.split(k2, K))
        g = handlers.trace(handlers.seed(substitute_params(guide, params), 0)).get_trace(jb)
        out["arc_marginals"] = g[site]["fn"].marginals.reshape(Bp, -1, S, S)[:, 0]
    B, Tb, Sb = batch.tgt_out.shape[0], batch.tgt_out.shape[1], batch.src.shape[1]
    crop = {"prior": (slice(0, B), slice(0, Tb), slice(0, Sb)),
            "posterior": (slice(None), slice(0, B), slice(0, Tb), slice(0, Sb)),
            "prior_draws": (slice(None), slice(0, B), slice(0, Tb), slice(0, Sb)),
            "log_lik": (slice(None), slice(0, B), slice(0, Tb)),
            "heads": (slice(None), slice(0, B), slice(0, Sb)),
            "prior_heads": (slice(None), slice(0, B), slice(0, Sb)),
            "arc_marginals": (slice(0, B), slice(0, Sb), slice(0, Sb))}
    res = {k: np.asarray(v, dtype=np.float32)[crop[k]] for k, v in out.items()}
    return {"exact": None, "q": None, **res}


def diagnostic_arrays(run, batch, num_samples: int, seed: int) -> dict:
    """What :func:`ppl_attention.analysis.diagnostics.guide_diagnostics` reads of one batch,
    under NumPyro: ``lw`` log importance weights [K, B]; where the model has an exact
    posterior ``exact_ll`` [B, T], ``log_q`` [B, T, S] and ``p_exact`` [B, T, S]; ``draws``
    [K, B, T] (q's draws, as source positions: a continuous family's largest weight)."""
    jb = run_batch(run, batch)
    model, params = model_and_params(run, jb)
    caps = capabilities(model)
    post = _guide_posterior(run.method, run.model)
    exact = "exact-posterior" in caps and "exact-likelihood" in caps
    site = declared(model, "site")
    K = num_samples

    def build():
        lw_one = log_importance_weights(model, post)

        def fn(params, b, key):
            k1, k2 = jax.random.split(key)
            out = {"lw": jax.vmap(lambda k: lw_one(params, b, k))(jax.random.split(k1, K))}
            if exact:
                q = _guide_q(model, params, b, post)
                B, T, S = q.shape
                out.update(exact_ll=exact_token_log_likelihood(model, params, b),
                           log_q=safe_log(q),
                           p_exact=exact_posterior(model, params, b),
                           draws=jax.random.categorical(k2, safe_log(q),
                                                        axis=-1, shape=(K, B, T)))
            elif getattr(model.family, "tree", False):  # word attention; q's source trees
                with recording() as calls:
                    handlers.seed(substitute_params(model.model, params), 0)(b)
                w = jnp.argmax(_site_call(calls, site).weights, -1)
                out["draws"] = jnp.broadcast_to(w, (K,) + w.shape)
                guide = functools.partial(model.guide, posterior=post)

                def tree(k):
                    g = handlers.trace(handlers.seed(substitute_params(guide, params), k)
                                       ).get_trace(b)
                    v = g[site]["value"]
                    return v.reshape(v.shape[0], -1, v.shape[-1])[:, 0]
                out["trees"] = jax.vmap(tree)(jax.random.split(k2, K))
            else:
                guide = functools.partial(model.guide, posterior=post)

                def one(k):
                    with recording() as calls:
                        handlers.seed(substitute_params(guide, params), k)(b)
                    w = _site_call(calls, site).weights
                    return model.family.read_positions(w) if model.family.selects \
                        else jnp.argmax(w, -1)
                out["draws"] = jax.vmap(one)(jax.random.split(k2, K))
            return out
        return fn

    fn = jitted(model, f"diagnostics-{K}-{post}-{exact}", build)
    raw = fn(params, jb, jax.random.PRNGKey(seed))
    B, T = batch.tgt_out.shape
    S = batch.src.shape[1]
    crop = {"lw": (slice(None), slice(0, B)), "exact_ll": (slice(0, B), slice(0, T)),
            "log_q": (slice(0, B), slice(0, T), slice(0, S)),
            "p_exact": (slice(0, B), slice(0, T), slice(0, S)),
            "draws": (slice(None), slice(0, B), slice(0, T)),
            "trees": (slice(None), slice(0, B), slice(0, S))}
    return {k: np.asarray(v, dtype=np.float64 if k == "lw" else None)[crop[k]]
            for k, v in raw.items()}
