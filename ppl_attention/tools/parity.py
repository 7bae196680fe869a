"""Twins checked: a Pyro model and its NumPyro twin give the same loss and gradients on the same
weights (moved by name, :mod:`ppl_attention.numpyro.inference.twins`) and the same draws, for
every method both train — what ``ppl-attention check-twin`` reports. It needs both backends, so
it sits above both: neither ``ppl_attention.pyro.inference`` nor ``ppl_attention.numpyro`` imports
the other."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pyro
import torch
from numpyro import handlers
from pyro import poutine

from ..common.contract import check_method
from ..common.contract import declared as decl
from ..core.errors import UserError
from ..core.method_specs import METHOD_SPECS
from ..numpyro.inference.fit import make_loss
from ..numpyro.inference.methods import METHODS
from ..numpyro.inference.methods import get_method as numpyro_method
from ..numpyro.inference.twins import parameter_pairs, params_from_torch, state_dict_from_params
from ..numpyro.jax_batches import to_jax
from ..numpyro.models.base import init_params
from ..pyro.inference.fit import MethodObjective, initialize_lazy_parameters
from ..pyro.inference.methods import differentiable_loss
from ..pyro.inference.methods import get_method as pyro_method

__all__ = ["twin_methods", "twin_parity"]


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    """max |a − b| / max(|a|, |b|): the difference relative to the larger magnitude."""
    scale = max(float(np.abs(a).max(initial=0.0)), float(np.abs(b).max(initial=0.0)), 1e-30)
    return float(np.abs(a - b).max(initial=0.0)) / scale


def twin_methods(pyro_class, numpyro_class) -> list[str]:
    """The methods both models train: each class's contract accepts it and NumPyro has it."""
    out = []
    for name in METHOD_SPECS:
        if name not in METHODS:
            continue
        try:
            check_method(pyro_class, pyro_method(name))
            check_method(numpyro_class, pyro_method(name))
        except UserError:
            continue
        out.append(name)
    return out


def twin_parity(pyro_class, numpyro_class, dims: dict, options: dict, batch, method: str,
                seed: int = 0, device=None) -> dict:
    """Loss and gradients of one step of ``method`` under both models on the same weights (the
    Pyro model's, moved by name) and — for a method that samples its alignment — the same draws
    (the Pyro guide's values, substituted in the NumPyro guide): ``{"loss_pyro", "loss_numpyro",
    "loss_rel", "grad_rel", "worst", "sampled"}``, relative differences as :func:`_relative`
    measures them, ``worst`` the parameter where the gradients differ most. The model's other
    latents (``latents``: the sequence VAE's z) are drawn once by the Pyro guide for every
    method and replayed there, and the NumPyro guide draws a Normal one from the same standard
    noise (loc + scale·ε, so the reparameterized gradient is compared too); both run with the
    model's ``step_arguments(0)``. ``device``: where the Pyro model runs (the NumPyro one where
    JAX's default device is)."""

    m = pyro_method(method)
    torch.manual_seed(seed)
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    tm = pyro_class(**dims, **options, family=m.family())
    jm = numpyro_class(**dims, **options, family=numpyro_method(method).family())
    jb = to_jax(batch)
    if device is not None:
        tm.to(device)
        batch = batch.to(device)
    _materialize(tm, m, batch)
    params, _ = init_params(jm, jb, jax.random.PRNGKey(seed))
    pairs = parameter_pairs(jm, params, tm)
    params = params_from_torch(jm, params, tm, pairs)
    site = decl(tm, "site")
    latents = tuple(decl(tm, "latents"))
    step_args = getattr(tm, "step_arguments", None)
    step_kw = dict(step_args(0)) if callable(step_args) else None
    draws = target = None
    noise = {}
    if m.spec.samples_alignment or latents:
        kw = dict(posterior=m.posterior, enumerate_z=False, kl_scale=1.0, **(step_kw or {}))
        if m.baseline == "soft":
            with torch.no_grad():
                kw["baseline"] = tm.soft_token_log_likelihood(batch)
        trace = poutine.trace(tm.guide).get_trace(batch, **kw)
        keep = set(latents) | ({site} if m.spec.samples_alignment else set())
        for name in [n for n, s in trace.nodes.items() if s["type"] == "sample"
                     and not s["is_observed"] and n not in keep]:
            trace.remove_node(name)  # an enumerated guide site is enumerated again, not replayed
        if m.spec.samples_alignment:
            trace.nodes[site]["value"] = trace.nodes[site]["value"].detach()
            draws = jnp.asarray(trace.nodes[site]["value"].cpu().numpy())
        # a latent keeps its reparameterized path: the Pyro guide replays its (undetached)
        # draw, the NumPyro guide draws it from the same standard noise
        noise = {n: _standard_noise(trace.nodes[n]) for n in latents if n in trace.nodes}
        target = _Replayed(tm, trace)
    tm.zero_grad()
    loss_t, surrogate = differentiable_loss(m, m.elbo(decl(tm, "max_plate_nesting")),
                                            target or tm, batch, 0, 1.0, step_kw)
    surrogate.backward()
    grads_t = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).cpu().numpy()
               for n, p in tm.named_parameters()}
    loss_fn = make_loss(_NoiseDrawn(jm, noise) if noise else jm, method, draws=draws)
    (_, loss_j), grads_j = jax.value_and_grad(
        lambda p: loss_fn(p, jax.random.PRNGKey(seed), jb, 1.0, step_kw), has_aux=True)(params)
    state_j = state_dict_from_params(jm, grads_j, tm, pairs)
    matched = {name for _, name, _ in pairs}
    # a torch parameter the NumPyro programs do not read must get no gradient either
    grads_j = {n: state_j[n].cpu().numpy() if n in matched else np.zeros_like(g)
               for n, g in grads_t.items()}
    names = list(grads_t)
    flat_t = np.concatenate([grads_t[n].ravel() for n in names])
    flat_j = np.concatenate([grads_j[n].ravel() for n in names])
    worst = max(names, key=lambda n: float(np.abs(grads_t[n] - grads_j[n]).max(initial=0.0)))
    return {"method": method, "loss_pyro": float(loss_t), "loss_numpyro": float(loss_j),
            "loss_rel": _relative(np.array([loss_t]), np.array([float(loss_j)])),
            "grad_rel": _relative(flat_t, flat_j), "worst": worst,
            "sampled": bool(m.spec.samples_alignment or noise)}


def _materialize(model, method, batch) -> None:
    """A family that builds its parameters on first use (a BAM prior network) gets them now."""

    initialize_lazy_parameters(model, MethodObjective(method, model), batch)


def _location_scale(fn):
    """The Normal under a (masked, independent) distribution of either backend, or None."""
    while type(fn).__name__ in ("Independent", "MaskedDistribution"):
        fn = fn.base_dist
    return fn if type(fn).__name__ == "Normal" else None


def _standard_noise(node):
    """A Pyro guide site's draw as (value − loc) / scale of its Normal, or, for any other
    distribution, ``("value", draw)`` (substituted as it is: no reparameterized path)."""
    value = node["value"].detach()
    normal = _location_scale(node["fn"])
    if normal is None:
        return ("value", jnp.asarray(value.cpu().numpy()))
    eps = (value - normal.loc.detach()) / normal.scale.detach()
    return ("noise", jnp.asarray(eps.cpu().numpy()))


class _NoiseDrawn:
    """A NumPyro model whose guide draws the sites in ``noise`` from the given standard noise
    (loc + scale·ε of the site's own Normal, so the gradient flows through the draw as a
    reparameterized sample's does), or takes the given value; everything else is the model's."""

    def __init__(self, model, noise: dict):
        self._model, self._noise = model, noise

    def __getattr__(self, item):
        return getattr(self._model, item)

    def _value(self, msg):
        if msg["type"] != "sample" or msg["name"] not in self._noise:
            return None
        kind, x = self._noise[msg["name"]]
        normal = _location_scale(msg["fn"]) if kind == "noise" else None
        if kind == "noise" and normal is None:
            raise UserError(f"site {msg['name']!r} is a Normal in the Pyro guide but "
                            f"{type(msg['fn']).__name__} in the NumPyro one")
        return x if normal is None else normal.loc + normal.scale * x

    def guide(self, batch, **kw):
        return handlers.substitute(self._model.guide, substitute_fn=self._value)(batch, **kw)


class _Replayed:
    """A Pyro model whose guide replays ``trace`` (the same draws)."""

    def __init__(self, model, trace):
        self.m, self.trace = model, trace

    def model(self, b, **kw):
        return self.m.model(b, **kw)

    def guide(self, b, **kw):

        return poutine.replay(self.m.guide, trace=self.trace)(b, **kw)

    def soft_token_log_likelihood(self, b):
        return self.m.soft_token_log_likelihood(b)
