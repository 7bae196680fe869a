"""The importance-corrected posterior under NumPyro: the arrays of
:func:`ppl_attention.pyro.inference.importance.importance_arrays` (the same maths), K draws of the
guide by one jitted, vmapped function."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers

from ...common.contract import declared
from ...core.errors import UserError
from ...core.method_specs import guide_posterior
from ...core.records import recording
from ..traces import replay, site_log_prob
from .evaluate import _per_pair, model_and_params, run_batch

__all__ = ["importance_arrays", "padded_arrays", "crop"]


def _values(fam, call, value, S):
    if fam.latent_context:
        return value
    if getattr(fam, "tree", False):
        heads = value.reshape(value.shape[0], -1, S)[:, 0]
        return jnp.swapaxes(jax.nn.one_hot(heads, S), -1, -2)
    if fam.enumerable:
        return jax.nn.one_hot(value, S)
    return call.weights


def importance_arrays(run, batch, k: int, seed: int = 0, draws=None, wrap_guide=None) -> dict:
    """``log_w [K, B]``, ``log_q [K, B]``, ``values [K, B, …]``, ``token_ll [K, B, T]``
    (numpy) of K draws of the run's guide on ``batch``; ``draws`` fixes the guide site's values
    ``[K, …]`` (padded to the jitted batch shape here)."""
    jb = run_batch(run, batch)
    model, params = model_and_params(run, jb)
    z = None if draws is None else _pad_draws(np.asarray(draws), jb, model.family, batch)
    raw = padded_arrays(model, params, jb, guide_posterior(run.method, run.model), k, seed, z,
                        wrap_guide)
    return crop(raw, model.family, batch.size, batch.tgt_out.shape[1], batch.src.shape[1])


def crop(raw: dict, fam, B: int, T: int, S: int) -> dict:
    """The arrays of :func:`padded_arrays` cut to the unpadded batch (numpy)."""
    values = np.asarray(raw["values"], np.float32)
    values = values[:, :B, :S, :S] if getattr(fam, "tree", False) else \
        values[:, :B, :T] if fam.latent_context else values[:, :B, :T, :S]
    return {"log_w": np.asarray(raw["log_w"], np.float64)[:, :B],
            "log_q": np.asarray(raw["log_q"], np.float64)[:, :B], "values": values,
            "token_ll": np.asarray(raw["token_ll"], np.float32)[:, :B, :T]}


def padded_arrays(model, params, jb, post: str, k: int, seed: int, z=None,
                  wrap_guide=None) -> dict:
    """The K draws on a jitted (padded) batch ``jb``: ``log_w``, ``log_q``, ``values``,
    ``token_ll`` as JAX arrays of the padded shapes; ``z`` the guide site's values, padded."""
    site = declared(model, "site")
    fam = model.family

    def build():
        def one(params, b, key, z):  # shapes read from b: one compiled function, every shape
            Bp, Sp = b.src.shape
            guide = functools.partial(model.guide if wrap_guide is None else
                                      wrap_guide(model.guide), posterior=post)
            if z is not None:
                guide = handlers.substitute(guide, data={site: z})
            with recording() as calls:
                g = handlers.trace(handlers.seed(handlers.substitute(guide, data=params), key)
                                   ).get_trace(b)
            mt = handlers.trace(handlers.seed(replay(
                handlers.substitute(model.model, data=params), g), key)).get_trace(b)
            lq = _per_pair(g, Bp)
            call = next((c for c in calls if c.name == site and c.guide), None)
            if call is None:
                raise UserError(f"the guide wrote no site {site!r} (declare the model's `site`)")
            Tp = b.tgt_out.shape[1]
            obs = sum(site_log_prob(s_, scaled=False) for n, s_ in mt.items()
                      if s_["type"] == "sample" and s_.get("is_observed") and n != site)
            return (_per_pair(mt, Bp) - lq, lq, _values(fam, call, g[site]["value"], Sp),
                    jnp.broadcast_to(obs, (Bp, Tp)))

        def fn(params, b, keys, zs):
            return jax.vmap(lambda kk, z: one(params, b, kk, z))(keys, zs)

        def fn_free(params, b, keys):
            return jax.vmap(lambda kk: one(params, b, kk, None))(keys)
        return fn, fn_free

    store = model.__dict__.setdefault("_jitted", {})  # kept per model, as jitted() keeps
    name = f"importance-{post}"
    if wrap_guide is not None:  # a planted distortion: compiled for this call only
        fixed, free = (jax.jit(f) for f in build())
    else:
        if name not in store:
            store[name] = tuple(jax.jit(f) for f in build())
        fixed, free = store[name]
    keys = jax.random.split(jax.random.PRNGKey(seed), k)
    lw, lq, values, tll = free(params, jb, keys) if z is None else fixed(params, jb, keys, z)
    return {"log_w": lw, "log_q": lq, "values": values, "token_ll": tll}


def _pad_draws(z: np.ndarray, jb, fam, batch) -> jnp.ndarray:
    """The guide site's values of the unpadded batch, placed in the jitted batch's shape (a
    padded position keeps a valid value: position 0, a one-hot at 0, its own index)."""
    K = z.shape[0]
    Bp, Tp = jb.tgt_out.shape
    Sp = jb.src.shape[1]
    B, T, S = batch.size, batch.tgt_out.shape[1], batch.src.shape[1]
    if getattr(fam, "tree", False):
        out = np.broadcast_to(np.arange(Sp), (K, Bp, 1, Sp)).copy()
        out[:, :B, :, :S] = z.reshape(K, B, 1, S)
    elif z.ndim == 3:  # an index per target
        out = np.zeros((K, Bp, Tp), z.dtype)
        out[:, :B, :T] = z
    elif z.shape[-1] == S:  # a point over the positions
        out = np.zeros((K, Bp, Tp, Sp), z.dtype)
        out[..., 0] = 1.0
        out[:, :B, :T, :S] = z
    else:  # a context vector
        out = np.zeros((K, Bp, Tp, z.shape[-1]), z.dtype)
        out[:, :B, :T] = z
    return jnp.asarray(out)
