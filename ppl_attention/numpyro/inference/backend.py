"""The NumPyro backend's side of the tools (see :mod:`ppl_attention.backends`): a model runs
here through the NumPyro twin its class declares (``numpyro_twin``)."""

from __future__ import annotations

from .evaluate import alignment_links, elbo_per_token, nll_per_token, twin_class
from .fit import data_parallel, fit
from .methods import get_method

__all__ = ["check", "check_run", "fit", "nll_per_token", "elbo_per_token", "alignment_links"]

NAME = "numpyro"


def check(model_class, method: str) -> None:
    """Refuse, before any work, a model without a NumPyro twin or a method NumPyro lacks."""
    twin_class(model_class)
    get_method(method)


def check_devices(devices: int, rows: int) -> None:
    """Refuse more devices than present, or batches that do not split over them."""
    data_parallel(devices, rows)


def check_run(run) -> None:
    twin_class(type(run.model))
