"""The registry of models (:mod:`ppl_attention.registry`, below both backends), as the Pyro
side's ``pa.models`` shows it."""

from ..registry import MODELS, ModelEntry, load_model_class, model_reference, model_spec_of

__all__ = ["ModelEntry", "MODELS", "load_model_class", "model_reference", "model_spec_of"]
