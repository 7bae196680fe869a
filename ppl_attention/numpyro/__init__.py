"""The NumPyro mirror of ppl_attention: the same names, arguments and maths under
``ppl_attention.numpyro`` — scores, families, ``attend``, ``models.Seq2SeqAlignment`` and the
inference registry — as plain JAX functions over parameter dicts keyed like the torch
``state_dict`` (see :mod:`ppl_attention.numpyro.nn` for why), jit-compiled.

Needs the ``numpyro`` extra: ``pip install -e ".[numpyro]"`` (jax, numpyro, funsor).
"""

from ..core import xla_flags  # noqa: F401  (XLA_FLAGS before JAX's backend starts)
from . import distributions, families, kl, scores
from .attend import attend, broadcast_source_mask
from .crfs import CTC, LinearChainCRF, SemiMarkovCRF, TreeCRF
from .families import (
    Categorical,
    Dirichlet,
    Entmax,
    Family,
    GaussianContext,
    LogNormal,
    RelaxedCategorical,
    SegmentMarginals,
    Segments,
    Soft,
    SpanMarginals,
    Spans,
    SparseCategorical,
    Sparsemax,
    Tree,
    TreeMarginals,
    Weibull,
    make_family,
)
from .sparse import SparseMAP, SparsemaxCategorical
from .trees import DependencyTree


def __getattr__(name):
    """``pa.numpyro.models`` (the NumPyro model contract and collection) and
    ``pa.numpyro.inference`` load on first use."""
    if name in ("models", "inference", "structured", "batching", "nn"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'ppl_attention.numpyro' has no attribute {name!r}")


__all__ = ["attend", "broadcast_source_mask", "distributions", "families", "kl", "scores",
           "Family", "Soft", "Categorical", "RelaxedCategorical", "Dirichlet", "Weibull",
           "LogNormal", "GaussianContext", "Segments", "SegmentMarginals", "Spans", "SpanMarginals",
           "Tree", "TreeMarginals", "Sparsemax", "Entmax", "SparseCategorical",
           "SparsemaxCategorical", "SparseMAP",
           "DependencyTree",
           "LinearChainCRF", "SemiMarkovCRF", "CTC", "TreeCRF",
           "make_family"]
