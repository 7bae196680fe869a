"""The figures of runs and comparisons (:mod:`ppl_attention.plots`, below both backends)."""

from ..plots import (
    method_colour,
    plot_aer_vs_nll,
    plot_curves,
    plot_learning_curve,
    plot_nll,
    smooth,
)

__all__ = ["method_colour", "plot_aer_vs_nll", "plot_curves", "plot_learning_curve", "plot_nll",
           "smooth"]
