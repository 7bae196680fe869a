"""The run directory (:mod:`ppl_attention.runs`, below both backends), as ``pa.inference``
shows it."""

from ..runs import COMPLETE, PARTIAL, Run, load_checkpoint, read_config, run_extra

__all__ = ["Run", "COMPLETE", "PARTIAL", "run_extra", "read_config", "load_checkpoint"]
