"""Twins: a Pyro model and a NumPyro model of the same maths. Weights move between them by
matching parameter names and shapes — no hand-written conversion — and :func:`check_twin`
compares their losses and gradients on the same weights and draws, for every method both run.

Names. A NumPyro parameter is a leaf of the param map, named by its path joined with dots
(``"embed"``, ``"seq2seq.encoder.weight_ih_l0"``, ``"net$params.Dense_0.kernel"``); a torch
parameter by its ``state_dict`` name. A NumPyro leaf matches the torch parameter of the same
name, or of its name without the first component (one pytree-valued site holding torch-named
weights, as the built-in twin does). Where names or layouts differ, the NumPyro class declares
``twin_parameters = {"numpyro.name": "torch.name"}`` or ``{"numpyro.name": ("torch.name",
"transpose")}`` (a ``[in, out]`` kernel against torch's ``[out, in]`` weight). Every leaf and
every torch parameter must be matched, with equal shapes; otherwise the error names them.
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np

from ...contract import declared
from ...errors import UserError
from ..models.base import init_params

__all__ = ["twin_class", "parameter_pairs", "params_from_torch", "state_dict_from_params",
           "twin_of", "leaf_names"]

TRANSFORMS = {None: lambda a: a, "transpose": lambda a: a.T}


def twin_class(model_class):
    """The NumPyro twin a Pyro model class declares (``numpyro_twin = "module:Class"``)."""
    target = declared(model_class, "numpyro_twin")
    if not target:
        raise UserError(f"{model_class.__name__} has no NumPyro twin (declare numpyro_twin = "
                        f"'module:Class' of one; docs/architecture.md): use --backend pyro")
    module, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise UserError(f"{model_class.__name__}.numpyro_twin = {target!r}: cannot import it "
                        f"({e})") from None


def leaf_names(params: dict) -> dict[str, tuple]:
    """Dotted name → path of every leaf of a param map."""
    out = {}

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, (*path, k))
        else:
            out[".".join(path)] = path

    walk(params, ())
    return out


def _get(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def _set(tree, path, value):
    """A copy of ``tree`` with the leaf at ``path`` replaced."""
    if not path:
        return value
    out = dict(tree)
    out[path[0]] = _set(tree[path[0]], path[1:], value)
    return out


def parameter_pairs(twin, params: dict, torch_model) -> list[tuple[tuple, str, str | None]]:
    """(NumPyro leaf path, torch name, transform) for every NumPyro leaf; refuses unmatched
    leaves, two leaves taking one torch parameter and shape mismatches, naming them."""
    torch_shapes = {k: tuple(v.shape) for k, v in torch_model.state_dict().items()}
    declared_map = dict(declared(twin, "twin_parameters") or {})
    pairs, unmatched, bad_shape = [], [], []
    for name, path in leaf_names(params).items():
        target, transform = declared_map.pop(name, (None, None)), None
        if isinstance(target, tuple):
            target, transform = target
        if transform not in TRANSFORMS:
            raise UserError(f"{type(twin).__name__}.twin_parameters[{name!r}]: unknown layout "
                            f"{transform!r} (valid: 'transpose')")
        if target is None:
            stripped = name.partition(".")[2]
            target = name if name in torch_shapes else stripped if stripped in torch_shapes \
                else None
        if target is None or target not in torch_shapes:
            unmatched.append(name)
            continue
        shape = tuple(np.shape(TRANSFORMS[transform](np.zeros(np.shape(_get(params, path))))))
        if shape != torch_shapes[target]:
            bad_shape.append(f"{name} {list(np.shape(_get(params, path)))} vs {target} "
                             f"{list(torch_shapes[target])}")
            continue
        pairs.append((path, target, transform))
    taken: dict[str, list[str]] = {}
    for path, target, _ in pairs:
        taken.setdefault(target, []).append(".".join(path))
    shared = {t: ns for t, ns in taken.items() if len(ns) > 1}
    problems = []
    if shared:
        problems.append("several NumPyro parameters take one torch parameter: " + "; ".join(
            f"{', '.join(ns)} → {t}" for t, ns in shared.items()))
    if declared_map:
        problems.append(f"twin_parameters names NumPyro parameters that do not exist: "
                        f"{', '.join(sorted(declared_map))}")
    if unmatched:
        problems.append(f"NumPyro parameters without a torch parameter of that name: "
                        f"{', '.join(unmatched)} (torch has: {', '.join(sorted(torch_shapes))})")
    if bad_shape:
        problems.append("shapes differ: " + "; ".join(bad_shape))
    if problems:
        raise UserError(f"{type(torch_model).__name__} ↔ {type(twin).__name__}: the weights do "
                        f"not transfer by name ({'; '.join(problems)}); declare "
                        f"twin_parameters on the NumPyro class (docs/architecture.md)")
    return pairs


def params_from_torch(twin, params: dict, torch_model, pairs=None) -> dict:
    """The param map ``params`` with every leaf replaced by its torch twin's weight."""
    pairs = pairs or parameter_pairs(twin, params, torch_model)
    state = torch_model.state_dict()
    out = params
    for path, name, transform in pairs:
        value = state[name].detach().cpu().numpy()
        dtype = np.asarray(_get(params, path)).dtype
        out = _set(out, path, jnp.asarray(TRANSFORMS[transform](value), dtype=dtype))
    return out


def state_dict_from_params(twin, params: dict, torch_model, pairs=None) -> dict:
    """The torch model's ``state_dict`` with every matched weight taken from ``params``."""
    import torch

    pairs = pairs or parameter_pairs(twin, params, torch_model)
    state = dict(torch_model.state_dict())
    for path, name, transform in pairs:
        value = np.array(TRANSFORMS[transform](np.asarray(_get(params, path))))
        state[name] = torch.from_numpy(value).to(dtype=state[name].dtype,
                                                 device=state[name].device)
    return state


def twin_of(torch_model, batch=None, training: bool = False):
    """(twin, param map) of a Pyro model that declares a NumPyro twin, with its weights. A twin
    class with its own ``from_torch(torch_model, training)`` builds itself (the built-in one
    drops the dropout it does not have when evaluating); otherwise the twin is built from the
    torch model's ``config`` and the same family, its parameters found by running its programs
    on ``batch`` and filled in by name."""
    from ..families import from_torch_family

    cls = twin_class(type(torch_model))
    own = getattr(cls, "from_torch", None)
    if callable(own):
        twin, flat = (own(torch_model, training=True) if training else own(torch_model))
        return twin, {twin.param_name: flat}
    if batch is None:
        raise UserError(f"{cls.__name__}: finding the twin's parameters needs a batch")
    try:
        twin = cls(**torch_model.config, family=from_torch_family(torch_model.family))
    except TypeError as e:
        raise UserError(f"{cls.__name__}: the Pyro model's options do not fit its NumPyro "
                        f"twin ({e})") from None
    params, _ = init_params(twin, batch, jax.random.PRNGKey(0))
    return twin, params_from_torch(twin, params, torch_model)


# --- the parity check -------------------------------------------------------------------------

def _relative(a: np.ndarray, b: np.ndarray) -> float:
    """max |a − b| / max(|a|, |b|): the difference relative to the larger magnitude."""
    scale = max(float(np.abs(a).max(initial=0.0)), float(np.abs(b).max(initial=0.0)), 1e-30)
    return float(np.abs(a - b).max(initial=0.0)) / scale


def twin_methods(pyro_class, numpyro_class) -> list[str]:
    """The methods both models train: each class's contract accepts it and NumPyro has it."""
    from ...contract import check_method
    from ...core.methods import METHOD_SPECS
    from ...inference.methods import get_method as pyro_method
    from .methods import METHODS

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
                seed: int = 0) -> dict:
    """Loss and gradients of one step of ``method`` under both models on the same weights (the
    Pyro model's, moved by name) and — for a method that samples its alignment — the same draws
    (the Pyro guide's values, substituted in the NumPyro guide): ``{"loss_pyro", "loss_numpyro",
    "loss_rel", "grad_rel", "worst"}``, relative differences as :func:`_relative` measures
    them, ``worst`` the parameter where the gradients differ most."""
    import pyro
    import torch
    from pyro import poutine

    from ...contract import declared as decl
    from ...inference.methods import differentiable_loss
    from ...inference.methods import get_method as pyro_method
    from ..batching import to_jax
    from .fit import make_loss
    from .methods import get_method as numpyro_method

    m = pyro_method(method)
    torch.manual_seed(seed)
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    tm = pyro_class(**dims, **options, family=m.family())
    jm = numpyro_class(**dims, **options, family=numpyro_method(method).family())
    jb = to_jax(batch)
    _materialize(tm, m, batch)
    params, _ = init_params(jm, jb, jax.random.PRNGKey(seed))
    pairs = parameter_pairs(jm, params, tm)
    params = params_from_torch(jm, params, tm, pairs)
    site = decl(tm, "site")
    draws = target = None
    if m.spec.samples_alignment:
        kw = dict(posterior=m.posterior, enumerate_z=False, kl_scale=1.0)
        if m.baseline == "soft":
            with torch.no_grad():
                kw["baseline"] = tm.soft_token_log_likelihood(batch)
        trace = poutine.trace(tm.guide).get_trace(batch, **kw)
        trace.nodes[site]["value"] = trace.nodes[site]["value"].detach()
        draws = jnp.asarray(trace.nodes[site]["value"].cpu().numpy())
        target = _Replayed(tm, trace)
    tm.zero_grad()
    loss_t, surrogate = differentiable_loss(m, m.elbo(decl(tm, "max_plate_nesting")),
                                            target or tm, batch, 0, 1.0)
    surrogate.backward()
    grads_t = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).cpu().numpy()
               for n, p in tm.named_parameters()}
    loss_fn = make_loss(jm, method, draws=draws)
    (_, loss_j), grads_j = jax.value_and_grad(
        lambda p: loss_fn(p, jax.random.PRNGKey(seed), jb, 1.0), has_aux=True)(params)
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
            "sampled": bool(m.spec.samples_alignment)}


def _materialize(model, method, batch) -> None:
    """A family that builds its parameters on first use (a BAM prior network) gets them now."""
    from ...inference.fit import MethodObjective, initialize_lazy_parameters

    initialize_lazy_parameters(model, MethodObjective(method, model), batch)


class _Replayed:
    """A Pyro model whose guide replays ``trace`` (the same draws)."""

    def __init__(self, model, trace):
        self.m, self.trace = model, trace

    def model(self, b, **kw):
        return self.m.model(b, **kw)

    def guide(self, b, **kw):
        from pyro import poutine

        return poutine.replay(self.m.guide, trace=self.trace)(b, **kw)

    def soft_token_log_likelihood(self, b):
        return self.m.soft_token_log_likelihood(b)
