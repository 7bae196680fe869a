"""Posterior analysis of alignments: ArviZ InferenceData, guide-vs-exact diagnostics, figures."""

from .diagnostics import KHAT_THRESHOLD, guide_diagnostics
from .figures import (
    entropy_per_position,
    plot_alignment_posteriors,
    plot_entropy,
    plot_pair_heatmaps,
)
from .inference_data import to_inference_data

__all__ = ["KHAT_THRESHOLD", "entropy_per_position", "guide_diagnostics",
           "plot_alignment_posteriors", "plot_entropy", "plot_pair_heatmaps",
           "to_inference_data"]
