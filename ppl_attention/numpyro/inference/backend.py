"""The NumPyro backend's side of the tools (see :mod:`ppl_attention.common.backends`): a NumPyro
model
(:mod:`ppl_attention.numpyro.models.base`) runs here as it is; a Pyro model through the NumPyro
twin its class declares (``numpyro_twin``)."""

from __future__ import annotations

from ...common.contract import declared, global_latents
from ...common.importance_weights import check_importance
from ...core.errors import UserError
from ..models.base import is_numpyro_model
from .bayes import check_options as check_global_options
from .bayes import fit_global, global_report
from .calibration import calibration_arrays, calibration_probs, distortion
from .decode import stepper
from .evaluate import (
    alignment_links,
    elbo_per_token,
    map_trees_by_index,
    mean_support,
    nll_per_token,
)
from .fit import data_parallel, fit
from .importance import importance_arrays
from .methods import get_method
from .posterior import alignment_arrays, diagnostic_arrays
from .twins import twin_class

__all__ = ["check", "check_run", "fit", "nll_per_token", "elbo_per_token", "alignment_links",
           "mean_support", "fit_global", "global_report", "check_global_options", "method_family",
           "preflight", "map_trees_by_index", "importance_arrays", "check_importance",
           "stepper", "prepare", "calibration_arrays", "calibration_probs", "distortion",
           "alignment_arrays", "diagnostic_arrays", "extra_report"]

NAME = "numpyro"


def prepare(run) -> None:
    """Before evaluating: nothing to reset (a NumPyro run's parameters are its own arrays and
    its programs are pure; the Pyro side clears its param store here)."""


def extra_report(run, seed: int = 0):
    """The run's model's ``extra_report`` (None when it has none). A NumPyro model's runs with
    the run's parameters substituted — each ``numpyro.param`` site inside it reads its trained
    value (the best weights while a report is made) — under ``handlers.seed(seed)``; a Pyro
    model's (trained through its twin) is called as it is."""
    fn = getattr(run.model, "extra_report", None)
    if not callable(fn):
        return None
    if not is_numpyro_model(run.model):
        return fn
    import jax

    from ..models.base import call

    def with_params(*args, **kwargs):
        return call(fn, run.params, *args, rng_key=jax.random.PRNGKey(seed), **kwargs)
    return with_params


def check(model_class, method: str) -> None:
    """Refuse, before any work, a Pyro model without a NumPyro twin, a method NumPyro lacks, a
    method for global latents on a model without them (or the other way round)."""
    from ...core.method_specs import global_method, global_methods_for, is_global_method

    if declared(model_class, "backend") != "numpyro":
        twin_class(model_class)
    latents = global_latents(model_class)
    if is_global_method(method):
        if declared(model_class, "backend") != "numpyro" or not latents:
            raise UserError(f"method {method!r} infers global latent variables: it takes a "
                            f"NumPyro model that declares them (`latents`); "
                            f"{model_class.__name__} declares none")
        needs = global_method(method).requires
        if needs and not declared(model_class, needs):
            raise UserError(f"method {method!r} draws the globals by conjugacy: it takes a "
                            f"model that declares `{needs}` (the word aligners word-ibm1, "
                            f"word-ibm2, word-hmm); {model_class.__name__} does not — train it "
                            f"by {', '.join(global_methods_for(model_class))}")
        return
    if latents and declared(model_class, "backend") == "numpyro":
        raise UserError(f"{model_class.__name__} declares global latents "
                        f"({', '.join(latents)}): train it by "
                        f"{', '.join(global_methods_for(model_class))}, not {method!r}")
    get_method(method)


def check_devices(devices: int, rows: int) -> None:
    """Refuse more devices than present, or batches that do not split over them."""
    data_parallel(devices, rows)


def check_run(run) -> None:
    if not is_numpyro_model(run.model):
        twin_class(type(run.model))


def method_family(method: str, model_class=None, options: dict | None = None):
    """A fresh NumPyro family of ``method`` (what a NumPyro model is built with) with the
    method's ``options`` (those that are family parameters); for a method of global latents,
    the first family the model declares (its alignment is summed out)."""
    from ...core.method_specs import is_global_method
    from ..families import make_family

    if is_global_method(method):
        families = declared(model_class, "families") if model_class is not None else None
        return make_family(families[0] if families else "categorical")
    return get_method(method, options).family()


def preflight(model_class, methods, exp) -> None:
    """Before any work, a NumPyro model is built for each method on a small batch of its data,
    its parameters found, and every capability member it defines run once: a program that
    fails or a member of the wrong shape is refused now, naming it, rather than after
    training."""
    if declared(model_class, "backend") != "numpyro":
        return
    import jax

    from ...data.kinds import data_kind
    from ..jax_batches import to_jax
    from ..models import base

    kind = data_kind(declared(model_class, "data"))
    data = kind.load(exp.source())
    batch = to_jax(kind.batches(data.train, data.vocabs, 2, model=model_class)[0])
    for method in methods:
        try:
            model = model_class(**data.dims, **exp.model_options, family=method_family(method))
        except TypeError as e:
            raise UserError(f"--model {exp.model}: {e}") from None
        try:
            params, _ = base.init_params(model, batch, jax.random.PRNGKey(0))
            caps = base.capabilities(model)
            for member, cap in (("exact_token_log_likelihood", "exact-likelihood"),
                                ("exact_posterior", "exact-posterior"), ("prior_probs", "prior"),
                                ("soft_token_log_likelihood", "soft-likelihood")):
                if callable(getattr(model, member, None)) and cap in caps:
                    getattr(base, member)(model, params, batch)
        except UserError as e:
            raise type(e)(f"--model {exp.model} ({method}): {e}") from None
