"""Corpora (TSV), alignments (Pharaoh), vocabularies, batches with masks, built-in tasks."""

from .batching import Batch, make_batches
from .corpus import DataError, read_sequences, read_tsv, write_tsv
from .pharaoh import read_pharaoh, write_pharaoh
from .tasks import TASKS, Task, make_task
from .vocab import BOS, EOS, PAD, UNK, Vocab

__all__ = [
    "Batch", "make_batches", "DataError", "read_sequences", "read_tsv", "write_tsv", "read_pharaoh",
    "write_pharaoh", "TASKS", "Task", "make_task", "Vocab", "PAD", "UNK", "BOS", "EOS",
]
