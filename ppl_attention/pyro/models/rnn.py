"""Recurrent layers over padded batches: the one place the models pack a batch by its lengths."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["run_packed"]


def run_packed(rnn: nn.Module, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A batch-first ``nn.LSTM`` / ``nn.GRU`` over the real positions of each row only:
    ``inputs [B, L, e]`` and ``mask [B, L]`` (True on real positions, a prefix of each row) →
    outputs ``[B, L, h]``, 0 on padding. The lengths go to the CPU, as
    ``pack_padded_sequence`` requires on every device; the outputs stay on ``inputs``' device."""
    lengths = mask.sum(-1).cpu()
    packed = nn.utils.rnn.pack_padded_sequence(inputs, lengths, batch_first=True,
                                               enforce_sorted=False)
    out, _ = rnn(packed)
    padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True,
                                                 total_length=inputs.shape[1])
    return padded
