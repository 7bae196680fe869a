"""ppl_attention: attention alignments as explicit latent variables of probabilistic programs.

The public surface::

    import ppl_attention as pa
    ctx, w = pa.attend("align", scores, values, family=pa.Categorical(), mask=src_mask)

Models (``pa.models``: the contract ``AlignmentModel`` and the collection), inference
(``pa.inference``: methods, ``fit``, ``evaluate``, ``Run``), data (``pa.data``) and the ArviZ
analysis (``pa.analysis``) are subpackages; ``pa.numpyro`` is the NumPyro mirror.

Every name loads on first use: ``import ppl_attention`` imports neither torch nor JAX, so the
NumPyro side (``import ppl_attention.numpyro``) runs without torch and Pyro ever loading, and
``pa.attend`` & co. bring in torch and Pyro when a Pyro user first touches them.
"""

import importlib

__version__ = "0.1.0"

#: public name → the module that defines it
_NAMES = {
    "attend": "attention", "broadcast_source_mask": "attention",
    "MaskedDirichlet": "distributions", "MaskedRelaxedCategorical": "distributions",
    "DependencyTree": "trees",
    **{n: "families" for n in ("FAMILIES", "Categorical", "Dirichlet", "Family",
                               "GaussianContext", "LogNormal", "MarkovCategorical",
                               "RelaxedCategorical", "SegmentCRF", "Soft", "Tree",
                               "TreeMarginals", "Weibull", "make_family", "masked_softmax")},
    **{n: "scores" for n in ("SCORES", "AdditiveScore", "BiaffineArcScore", "BilinearScore",
                             "DotScore", "MultiHeadScore", "ScaledDotScore", "make_score")},
}
_SUBPACKAGES = ("analysis", "numpyro", "models", "inference", "data", "core", "errors",
                "structured", "trees", "importance")

__all__ = sorted(_NAMES)


def __getattr__(name):
    """A public name from its module, or a subpackage (``pa.models``, ``pa.inference``,
    ``pa.data``, ``pa.analysis`` — ArviZ —, ``pa.numpyro`` — JAX), imported on first use."""
    if name in _NAMES:
        value = getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'ppl_attention' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_NAMES) | set(_SUBPACKAGES))
