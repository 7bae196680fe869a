"""Inference on any model of the contract: the methods registry, the one Pyro training loop,
run directories, evaluation and decoding."""

from ...common.runs import Run
from ...core.training import TRAINING_DEFAULTS
from .evaluate import alignment_links, elbo_per_token, evaluate, map_alignments, nll_per_token
from .fit import fit
from .methods import METHODS, Method, get_method

__all__ = ["METHODS", "Method", "get_method", "fit", "TRAINING_DEFAULTS", "evaluate",
           "nll_per_token", "elbo_per_token", "map_alignments", "alignment_links", "Run"]
