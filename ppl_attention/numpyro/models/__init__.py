"""The NumPyro model contract (:mod:`.base`: ``AlignmentModel`` and the generic members derived
from a program) and the NumPyro side of the model collection."""

from .base import AlignmentModel, capabilities, init_params
from .seq2seq import SITE, Seq2SeqAlignment
from .seq_vae import AttentionSeqVAE

__all__ = ["AlignmentModel", "AttentionSeqVAE", "Seq2SeqAlignment", "SITE", "capabilities",
           "init_params"]
