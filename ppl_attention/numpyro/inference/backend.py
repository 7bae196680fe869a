"""The NumPyro backend's side of the tools (see :mod:`ppl_attention.backends`): a NumPyro model
(:mod:`ppl_attention.numpyro.models.base`) runs here as it is; a Pyro model through the NumPyro
twin its class declares (``numpyro_twin``)."""

from __future__ import annotations

from ...contract import declared
from ..models.base import is_numpyro_model
from .evaluate import alignment_links, elbo_per_token, nll_per_token
from .fit import data_parallel, fit
from .methods import get_method
from .twins import twin_class

__all__ = ["check", "check_run", "fit", "nll_per_token", "elbo_per_token", "alignment_links"]

NAME = "numpyro"


def check(model_class, method: str) -> None:
    """Refuse, before any work, a Pyro model without a NumPyro twin or a method NumPyro
    lacks."""
    if declared(model_class, "backend") != "numpyro":
        twin_class(model_class)
    get_method(method)


def check_devices(devices: int, rows: int) -> None:
    """Refuse more devices than present, or batches that do not split over them."""
    data_parallel(devices, rows)


def check_run(run) -> None:
    if not is_numpyro_model(run.model):
        twin_class(type(run.model))


def method_family(method: str):
    """A fresh NumPyro family of ``method`` (what a NumPyro model is built with)."""
    return get_method(method).family()
