"""ppl_attention: attention alignments as explicit latent variables of probabilistic programs.

The public surface::

    import ppl_attention as pa
    ctx, w = pa.attend("align", scores, values, family=pa.Categorical(), mask=src_mask)

The package is one folder per floor, read from the bottom (docs/architecture.md): ``core``
(pure Python: errors, checks, the family and method registries, numerical constants), ``data``,
``structures`` (each structured distribution's recursion, written once for both backends),
``common`` (the model contract and registry, run directories, metrics — what both backends
build on), the two sibling backends ``pyro`` and ``numpyro`` (the same module names on both
sides), ``tools`` (experiment, sweep, parity), ``analysis`` (ArviZ) and ``cli``.

``pa.models`` and ``pa.inference`` are the Pyro backend's model contract and inference
(``ppl_attention.pyro.models``, ``ppl_attention.pyro.inference``); ``pa.numpyro`` is the NumPyro
mirror; ``pa.data``, ``pa.analysis``, ``pa.errors``.

Every name loads on first use: ``import ppl_attention`` imports neither torch nor JAX, so the
NumPyro side (``import ppl_attention.numpyro``) runs without torch and Pyro ever loading, and
``pa.attend`` & co. bring in torch and Pyro when a Pyro user first touches them. The import
paths of version 0.1 (its flat modules) still work through :mod:`ppl_attention.compat`, with
a warning naming the new path.
"""

import importlib

from . import compat

__version__ = "0.1.0"

#: public name → the module that defines it
_NAMES = {
    "attend": "pyro.attend", "broadcast_source_mask": "pyro.attend",
    "MaskedDirichlet": "pyro.distributions", "MaskedRelaxedCategorical": "pyro.distributions",
    "DependencyTree": "pyro.trees", "LinearChainCRF": "pyro.crfs",
    "SemiMarkovCRF": "pyro.crfs", "CTC": "pyro.crfs",
    "TreeCRF": "pyro.crfs",
    "SparsemaxCategorical": "pyro.sparse", "SparseMAP": "pyro.sparse",
    **{n: "pyro.families" for n in ("FAMILIES", "Categorical", "Dirichlet", "Family",
                                    "GaussianContext", "LogNormal", "MarkovCategorical",
                                    "RelaxedCategorical", "SegmentCRF", "SegmentMarginals",
                                    "Segments", "Soft", "SparseCategorical", "Sparsemax",
                                    "Entmax", "SpanMarginals", "Spans", "Tree",
                                    "TreeMarginals", "Weibull", "make_family",
                                    "masked_softmax")},
    **{n: "pyro.scores" for n in ("SCORES", "AdditiveScore", "BiaffineArcScore",
                                  "BilinearScore", "DotScore", "MultiHeadScore",
                                  "ScaledDotScore", "make_score")},
}
#: public subpackage or module → where it lives
_SUBPACKAGES = {
    "analysis": "analysis", "numpyro": "numpyro", "pyro": "pyro", "data": "data",
    "core": "core", "common": "common", "tools": "tools", "cli": "cli",
    "structures": "structures",
    "models": "pyro.models", "inference": "pyro.inference", "errors": "core.errors",
    "structured": "pyro.structured", "trees": "pyro.trees",
    "importance": "common.importance_weights",
}

__all__ = sorted(_NAMES)

compat.install()


def __getattr__(name):
    """A public name from its module, or a subpackage (``pa.models``, ``pa.inference``,
    ``pa.data``, ``pa.analysis`` — ArviZ —, ``pa.numpyro`` — JAX), imported on first use."""
    if name in _NAMES:
        value = getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{_SUBPACKAGES[name]}", __name__)
    raise AttributeError(f"module 'ppl_attention' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_NAMES) | set(_SUBPACKAGES))
