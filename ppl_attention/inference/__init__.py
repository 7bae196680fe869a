"""Methods registry, fit, evaluate and compare."""

from .evaluate import alignment_links, elbo_per_token, evaluate, map_alignments, nll_per_token
from .fit import fit
from .methods import METHODS, Method, get_method
from .run import Run

__all__ = ["METHODS", "Method", "get_method", "fit", "evaluate", "nll_per_token",
           "elbo_per_token", "map_alignments", "alignment_links", "Run"]
