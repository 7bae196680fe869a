"""The Pyro model collection."""

from .bam_classifier import BAMClassifier
from .gat import BayesianGAT
from .seq2seq import Seq2SeqAlignment
from .seq_vae import AttentionSeqVAE

__all__ = ["AttentionSeqVAE", "BAMClassifier", "BayesianGAT", "Seq2SeqAlignment"]
