"""What both backends' sequence VAE (:mod:`ppl_attention.pyro.models.seq_vae` and its NumPyro twin
:mod:`ppl_attention.numpyro.models.seq_vae`) share, in pure Python: the options' values, their
checks, their help, and the KL annealing β(step) of the global latent z."""

from __future__ import annotations

import math

from ..core.errors import UserError

__all__ = ["ENCODERS", "DECODERS", "ATTENTION", "MEMORIES", "Z_INPUTS", "ANNEALING",
           "OPTION_HELP", "check_options", "check_family"]

ENCODERS = ("gru", "transformer")
DECODERS = ("gru", "transformer")
ATTENTION = ("none", "additive", "bilinear")
MEMORIES = ("decoder", "encoder")
Z_INPUTS = ("init", "concat", "both")

#: β(step, steps): the KL weight on z at a training step
ANNEALING = {
    "none": lambda step, steps: 1.0,
    "linear": lambda step, steps: min(1.0, step / max(1, steps)),
    # β = sigmoid(10 (step/steps − ½)): ≈ 0.007 at the start, 0.5 halfway, ≈ 1 at ``steps``
    "sigmoid": lambda step, steps: 1.0 / (1.0 + math.exp(-10.0 * (step / max(1, steps) - 0.5))),
}

OPTION_HELP = {"latent": "dimensions of z", "attention": "the GRU decoder's attention "
               "score: none, additive, bilinear", "memory": "attend over the decoder's past "
               "states (decoder: a generative model) or the encoder states of x (leaky)",
               "free_bits": "KL floor λ per dimension of z", "max_len": "longest sequence "
               "(tokens)", "kl_anneal": "KL annealing of z: none, linear, sigmoid"}


def check_options(*, hidden, latent, encoder, decoder, attention, memory, z_input, heads,
                  layers, z_slots, word_dropout, free_bits, max_len, kl_anneal,
                  anneal_steps) -> None:
    """Refuse a bad option of the sequence VAE with one line naming it."""
    if kl_anneal not in ANNEALING:
        raise UserError(f"kl_anneal must be one of {', '.join(ANNEALING)}; got {kl_anneal!r}")
    if not isinstance(anneal_steps, int) or anneal_steps < 1:
        raise UserError(f"anneal_steps must be a positive int, got {anneal_steps!r}")
    for name, value, valid in (("encoder", encoder, ENCODERS), ("decoder", decoder, DECODERS),
                               ("attention", attention, ATTENTION),
                               ("memory", memory, MEMORIES), ("z_input", z_input, Z_INPUTS)):
        if value not in valid:
            raise UserError(f"{name} must be one of {', '.join(valid)}; got {value!r}")
    for name, value in (("hidden", hidden), ("latent", latent), ("heads", heads),
                        ("layers", layers), ("z_slots", z_slots), ("max_len", max_len)):
        if not isinstance(value, int) or value < 1:
            raise UserError(f"{name} must be a positive int, got {value!r}")
    if hidden % 2 or hidden % heads:
        raise UserError(f"hidden ({hidden}) must be even and divisible by heads ({heads})")
    if not 0.0 <= word_dropout < 1.0:
        raise UserError(f"word_dropout must be in [0, 1), got {word_dropout}")
    if free_bits < 0:
        raise UserError(f"free_bits must be ≥ 0, got {free_bits}")


def check_family(deterministic: bool, decoder: str, attention: str) -> None:
    """An alignment family that samples needs the GRU decoder with attention."""
    if decoder == "transformer" and not deterministic:
        raise UserError("the Transformer decoder's attention is soft multi-head attention; "
                        "an alignment family needs decoder='gru'")
    if attention == "none" and not deterministic:
        raise UserError("an alignment family needs attention (additive or bilinear)")
