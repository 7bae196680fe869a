"""The Pyro backend's side of the tools (see :mod:`ppl_attention.backends`): every model that
meets the contract runs here."""

from __future__ import annotations

from .evaluate import alignment_links, elbo_per_token, nll_per_token
from .fit import fit

__all__ = ["check", "check_run", "fit", "nll_per_token", "elbo_per_token", "alignment_links"]

NAME = "pyro"


def check(model_class, method) -> None:
    """Every model and every method of the registry run under Pyro."""


def check_run(run) -> None:
    """Every run evaluates under Pyro."""
