"""The XLA flags the NumPyro side runs with, set on import — before JAX starts its CPU backend,
which reads ``XLA_FLAGS`` at the first computation, not at ``import jax``.

jaxlib 0.10's CPU backend fuses reductions into its experimental YNNPACK library calls, and one
such fusion inside a ``lax.while_loop`` body (SparseMAP's active-set search,
:mod:`ppl_attention.structures.sparsemap`) crashes the process with a segmentation fault in a
transpose of that fusion. ``--xla_cpu_experimental_ynn_fusion_type=-reduce`` keeps reductions
out of those fusions (dot products and elementwise fusions stay). A user who sets the flag in
``XLA_FLAGS`` keeps their own value; a process whose JAX backend started before ppl_attention
was imported runs with whatever it started with.
"""

from __future__ import annotations

import os

YNN_FLAG = "--xla_cpu_experimental_ynn_fusion_type=-reduce"


def avoid_known_faults() -> None:
    """Add :data:`YNN_FLAG` to ``XLA_FLAGS`` unless the user set that option."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_experimental_ynn_fusion_type" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " " + YNN_FLAG).strip()


avoid_known_faults()
