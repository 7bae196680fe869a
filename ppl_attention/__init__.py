"""ppl_attention: attention alignments as explicit latent variables of probabilistic programs.

The public surface::

    import ppl_attention as pa
    ctx, w = pa.attend("align", scores, values, family=pa.Categorical(), mask=src_mask)

Models (``pa.models``: the contract ``AlignmentModel`` and the collection), inference
(``pa.inference``: methods, ``fit``, ``evaluate``, ``Run``), data (``pa.data``) and the ArviZ
analysis (``pa.analysis``) are subpackages.
"""

from .attend import attend, broadcast_source_mask
from .distributions import MaskedDirichlet, MaskedRelaxedCategorical
from .families import (
    FAMILIES,
    Categorical,
    Dirichlet,
    Family,
    GaussianContext,
    LogNormal,
    MarkovCategorical,
    RelaxedCategorical,
    SegmentCRF,
    Soft,
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
from .trees import DependencyTree

__version__ = "0.1.0"

__all__ = [
    "attend",
    "broadcast_source_mask",
    "Family",
    "Soft",
    "Categorical",
    "RelaxedCategorical",
    "Dirichlet",
    "Weibull",
    "LogNormal",
    "GaussianContext",
    "MarkovCategorical",
    "SegmentCRF",
    "Tree",
    "TreeMarginals",
    "DependencyTree",
    "BiaffineArcScore",
    "FAMILIES",
    "make_family",
    "masked_softmax",
    "MaskedDirichlet",
    "MaskedRelaxedCategorical",
    "AdditiveScore",
    "BilinearScore",
    "DotScore",
    "ScaledDotScore",
    "MultiHeadScore",
    "SCORES",
    "make_score",
]


def __getattr__(name):
    """The subpackages (``pa.models``, ``pa.inference``, ``pa.data``, ``pa.analysis`` — ArviZ —,
    ``pa.numpyro`` — JAX) load on first use: importing the package stays light."""
    if name in ("analysis", "numpyro", "models", "inference", "data", "core", "errors",
                "structured"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'ppl_attention' has no attribute {name!r}")
