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
from .distributions import MaskedDirichlet, MaskedRelaxedCategorical
from .families import (
    FAMILIES,
    Categorical,
    Dirichlet,
    Entmax,
    Family,
    GaussianContext,
    LogNormal,
    MarkovCategorical,
    RelaxedCategorical,
    SegmentCRF,
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
    masked_softmax,
)
from .scores import (
    SCORES,
    AdditiveScore,
    BiaffineArcScore,
    BilinearScore,
    DotScore,
    MultiHeadScore,
    ScaledDotScore,
    make_score,
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
           "make_family", "FAMILIES", "MarkovCategorical", "SegmentCRF", "MaskedDirichlet",
           "MaskedRelaxedCategorical", "masked_softmax", "SCORES", "make_score",
           "AdditiveScore", "BilinearScore", "DotScore", "ScaledDotScore", "MultiHeadScore",
           "BiaffineArcScore"]
