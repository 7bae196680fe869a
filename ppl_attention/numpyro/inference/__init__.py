from .elbo import ScoreFunctionKL_ELBO
from .evaluate import alignment_links, elbo_per_token, map_alignments, nll_per_token
from .fit import fit
from .methods import METHODS, enumerated_guide_loss, get_method, score_function_loss

__all__ = ["METHODS", "ScoreFunctionKL_ELBO", "alignment_links", "elbo_per_token",
           "enumerated_guide_loss", "fit", "get_method", "map_alignments", "nll_per_token",
           "score_function_loss"]
