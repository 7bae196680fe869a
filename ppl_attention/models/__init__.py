"""The Pyro model collection."""

from .seq2seq import Seq2SeqAlignment
from .seq_vae import AttentionSeqVAE

__all__ = ["AttentionSeqVAE", "Seq2SeqAlignment"]
