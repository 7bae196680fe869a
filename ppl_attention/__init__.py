"""ppl_attention: attention alignments as explicit latent variables of probabilistic programs.

The public surface::

    import ppl_attention as pa
    ctx, w = pa.attend("align", scores, values, family=pa.Categorical(), mask=src_mask)
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
    Weibull,
    make_family,
    masked_softmax,
)
from .scores import (
    SCORES,
    AdditiveScore,
    BilinearScore,
    DotScore,
    MultiHeadScore,
    ScaledDotScore,
    make_score,
)

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
    """``pa.analysis`` (ArviZ) and ``pa.numpyro`` (JAX) load on first use: importing the package
    stays light when they are not needed."""
    if name in ("analysis", "numpyro"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'ppl_attention' has no attribute {name!r}")
