"""The experiment (:mod:`ppl_attention.experiment`, below both backends), as ``pa.inference``
shows it."""

from ..experiment import (
    Experiment,
    best_weights,
    check_experiment,
    eval_batches,
    report,
    train_one,
)

__all__ = ["Experiment", "train_one", "check_experiment", "report", "eval_batches",
           "best_weights"]
