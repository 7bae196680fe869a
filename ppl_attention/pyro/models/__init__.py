"""The model collection and the contract every model meets (:mod:`.base`); the registry of
built-in models (:mod:`.registry`)."""

from ...common.registry import MODELS, load_model_class
from .bam_classifier import BAMClassifier
from .base import AlignmentModel, capabilities, check_model_class
from .gat import BayesianGAT
from .seq2seq import Seq2SeqAlignment
from .seq_vae import AttentionSeqVAE

__all__ = ["AlignmentModel", "AttentionSeqVAE", "BAMClassifier", "BayesianGAT", "MODELS",
           "Seq2SeqAlignment", "capabilities", "check_model_class", "load_model_class"]
