"""The NumPyro mirror of the model collection."""

from .seq2seq import SITE, Seq2SeqAlignment
from .seq_vae import AttentionSeqVAE

__all__ = ["AttentionSeqVAE", "Seq2SeqAlignment", "SITE"]
