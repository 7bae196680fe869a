"""The Pyro backend's side of the tools (see :mod:`ppl_attention.common.backends`): every model that
meets the contract runs here."""

from __future__ import annotations

from ...common.backends import check_pyro_model
from ...common.importance_weights import check_importance
from ...core.errors import UserError
from .calibration import calibration_arrays, calibration_probs, distortion
from .decode import stepper
from .evaluate import (
    alignment_links,
    elbo_per_token,
    map_trees_by_index,
    mean_support,
    nll_per_token,
)
from .fit import fit
from .importance import importance_arrays
from .posterior import alignment_arrays, diagnostic_arrays

__all__ = ["check", "check_run", "fit", "nll_per_token", "elbo_per_token", "alignment_links",
           "mean_support",
           "map_trees_by_index", "importance_arrays", "check_importance", "stepper", "prepare",
           "calibration_arrays", "calibration_probs", "distortion", "alignment_arrays",
           "diagnostic_arrays", "extra_report"]

NAME = "pyro"


def prepare(run) -> None:
    """Before evaluating: a clear param store and the model in eval mode (no dropout)."""
    import pyro

    pyro.clear_param_store()
    run.model.eval()


def extra_report(run, seed: int = 0):
    """The run's model's ``extra_report`` (None when it has none), run with Pyro's random
    streams seeded by ``seed`` (the same figures on every call)."""
    fn = getattr(run.model, "extra_report", None)
    if not callable(fn):
        return None
    from .evaluate import seeded

    def seeded_report(*args, **kwargs):
        with seeded(seed):
            return fn(*args, **kwargs)
    return seeded_report


def check(model_class, method) -> None:
    """Every Pyro model and every method of the registry run under Pyro; a NumPyro model is
    refused (it has no Pyro program), and so are the methods for global latents (NumPyro's
    MCMC and autoguides run them)."""
    from ...core.method_specs import is_global_method

    _pyro_model(model_class)
    if is_global_method(method):
        raise UserError(f"method {method!r} infers global latents with NumPyro's MCMC or "
                        f"autoguides: it takes a NumPyro model that declares them")


def check_run(run) -> None:
    """Every run of a Pyro model evaluates under Pyro, whichever backend trained it."""
    _pyro_model(type(run.model))


def _pyro_model(cls) -> None:
    check_pyro_model(cls)


def method_family(method: str, model_class=None, options: dict | None = None):
    """A fresh torch family of ``method`` with the method's ``options`` (those that are family
    parameters; ``model_class``: as the NumPyro side's signature)."""
    from .methods import get_method

    return get_method(method, options).family()
