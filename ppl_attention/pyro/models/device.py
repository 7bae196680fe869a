"""Where a model lives: the device on which a tool puts the tensors it makes for the model."""

from __future__ import annotations

import torch

__all__ = ["model_device"]


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s parameters (the CPU for a model without any)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))
