"""The XLA flags the NumPyro side runs with, set on import — before JAX starts its CPU backend,
which reads ``XLA_FLAGS`` at the first computation, not at ``import jax``.

jaxlib 0.10's CPU backend fuses dot products, reductions and elementwise operations into its
experimental YNNPACK library calls, and such fusions inside a ``lax.while_loop`` body
(SparseMAP's active-set search, :mod:`ppl_attention.structures.sparsemap`) crash the process
with a segmentation fault in a transpose of the fusion — which fusion depends on the rest of the
program (keeping reductions out was not enough inside a training step).
``--xla_cpu_experimental_ynn_fusion_type=`` (an empty list) turns those fusions off; measured
here, a word aligner's Gibbs sweep and a seq2seq training step take the same time either way
(within 2 %). A user who sets the option in ``XLA_FLAGS`` keeps their own value; a process
whose JAX backend started before ppl_attention was imported runs with what it started with.
"""

from __future__ import annotations

import os

YNN_FLAG = "--xla_cpu_experimental_ynn_fusion_type="


def avoid_known_faults() -> None:
    """Add :data:`YNN_FLAG` to ``XLA_FLAGS`` unless the user set that option."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_experimental_ynn_fusion_type" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " " + YNN_FLAG).strip()


avoid_known_faults()
