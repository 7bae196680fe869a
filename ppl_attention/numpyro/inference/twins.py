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

from ...common.contract import declared
from ...core.errors import UserError
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
    """The torch model's ``state_dict`` with every matched weight taken from ``params`` (each
    made by its torch tensor's own ``new_tensor``: no torch import here)."""
    pairs = pairs or parameter_pairs(twin, params, torch_model)
    state = dict(torch_model.state_dict())
    for path, name, transform in pairs:
        value = np.array(TRANSFORMS[transform](np.asarray(_get(params, path))))
        state[name] = state[name].new_tensor(value)
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

