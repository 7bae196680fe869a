from .seq2seq import Seq2SeqAlignment

__all__ = ["Seq2SeqAlignment"]
