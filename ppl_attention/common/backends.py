"""The backends a model runs under, by name: ``pyro`` (torch) and ``numpyro`` (JAX, the mirror).

Each entry is the module that implements the backend's side of the tools — ``check(model_class,
method)`` (refuse before any work), ``check_run(run)``, ``fit``, ``nll_per_token``,
``elbo_per_token``, ``alignment_links`` — imported when first asked for, so that the package
works without the optional ``numpyro`` extra and no lower floor imports the mirror.
"""

from __future__ import annotations

import importlib

from ..core.errors import UserError
from .contract import declared

__all__ = ["BACKENDS", "get_backend", "check_pyro_model"]

BACKENDS = {"pyro": "ppl_attention.pyro.inference.backend",
            "numpyro": "ppl_attention.numpyro.inference.backend"}

#: what to install when a backend's array library is missing
_INSTALL = {"pyro": "torch and Pyro: pip install torch pyro-ppl (both are dependencies of the "
                    "package's default install)",
            "numpyro": "the 'numpyro' extra: pip install -e '.[numpyro]'"}


def get_backend(name: str):
    """The backend module ``name``; a clear error when it is unknown or its extra is missing."""
    if name not in BACKENDS:
        raise UserError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    try:
        return importlib.import_module(BACKENDS[name])
    except ImportError as e:
        missing = (getattr(e, "name", None) or "").split(".")[0]
        if missing == "ppl_attention":  # a defect of the package, not a missing install
            raise
        raise UserError(f"--backend {name} needs {_INSTALL[name]} ({e})") from None


def check_pyro_model(cls) -> None:
    """Refuse a NumPyro model under ``--backend pyro`` — from its declaration alone, so the
    reason is the same whether torch is installed or not."""
    if declared(cls, "backend") != "pyro":
        raise UserError(f"{cls.__name__} is a NumPyro model: it runs under --backend numpyro "
                        f"only (it has no Pyro program to run)")
