"""The tutorial's neural IBM Model 2 written in NumPyro alone, against the NumPyro model contract
(docs/architecture.md): the same maths as ``diagonal.py``, no torch.

    p(z_t = j | x, t) ∝ exp(−λ·|(t + ½)/T − (j + ½)/S|)        a learned diagonal prior (λ > 0)
    p(y_t | z_t = j, x) = softmax(e(x_j) W + b)_{y_t}           a translation table of embeddings

Parameters are ``numpyro.param`` sites with initial values drawn from a PRNG key, as NumPyro's
own examples write them; every tool finds them by running the programs. Batches arrive padded
to a few bucket shapes (padded rows have no target tokens), so lengths are clamped at 1 before
dividing by them. Train, compare and analyse it like any model:

    ppl-attention compare --model examples/tutorial/diagonal_numpyro.py:DiagonalAlignment \\
        --task reorder --n-train 5000 --methods exact,vae-enum,hard-enum --steps 300 --lr 0.05 \\
        --out runs/diagonal-numpyro

``twin_parameters`` names, for the few parameters whose name or layout differs, the Pyro twin's
weight (``diagonal.py``): a NumPyro user writes ``x @ W`` with ``W [in, out]`` where torch's
``nn.Linear`` keeps ``[out, in]``. With it, ``ppl-attention check-twin
examples/tutorial/diagonal.py:DiagonalAlignment
examples/tutorial/diagonal_numpyro.py:DiagonalAlignment --task reorder`` moves the weights by
name and compares the two models' losses and gradients for every method both run.
"""

import math

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro import handlers

import ppl_attention.numpyro as pan
from ppl_attention.numpyro.models import AlignmentModel


def _uniform(shape, bound):
    return lambda key: jax.random.uniform(key, shape, minval=-bound, maxval=bound)


class DiagonalAlignment(AlignmentModel):
    """``dim``: embedding size; ``tension``: the diagonal prior's initial λ."""

    twin_parameters = {"embed": "embed.weight", "q_embed": "q_embed.weight",
                       "out_w": ("out.weight", "transpose"), "out_b": "out.bias",
                       "q_bilinear": ("q_bilinear.weight", "transpose")}

    def __init__(self, src_vocab: int, tgt_vocab: int, *, family, dim: int = 32,
                 tension: float = 4.0):
        self.family = pan.make_family(family, key_dim=dim)
        self.src_vocab, self.tgt_vocab, self.dim, self.tension = src_vocab, tgt_vocab, dim, tension

    def embed(self, ids, name="embed", vocab=None):
        table = numpyro.param(name, lambda key: jax.random.normal(
            key, (vocab or self.src_vocab, self.dim)))
        return table[ids]

    def prior_scores(self, batch):
        """−λ·|relative target position − relative source position|, ``[B, T, S]``."""
        S, T = batch.src.shape[1], batch.tgt_out.shape[1]
        lam = jnp.exp(numpyro.param("log_tension", jnp.log(self.tension)))
        i = (jnp.arange(S) + 0.5) / jnp.maximum(batch.src_mask.sum(-1, keepdims=True), 1)
        t = (jnp.arange(T) + 0.5) / jnp.maximum(batch.tgt_mask.sum(-1, keepdims=True), 1)
        return -lam * jnp.abs(t[:, :, None] - i[:, None, :])

    def model(self, batch, *, enumerate_z=False, kl_scale=1.0):
        values = self.embed(batch.src)  # [B, S, d]: what an alignment selects
        bound = 1 / math.sqrt(self.dim)
        out_w = numpyro.param("out_w", _uniform((self.dim, self.tgt_vocab), bound))
        out_b = numpyro.param("out_b", _uniform((self.tgt_vocab,), bound))
        B, T = batch.tgt_out.shape
        with numpyro.plate("batch", B, dim=-2), numpyro.plate("target", T, dim=-1):
            with handlers.scale(scale=kl_scale):
                context, _ = pan.attend(
                    "align", self.prior_scores(batch), values, self.family, mask=batch.src_mask,
                    target_mask=None if enumerate_z else batch.tgt_mask,
                    infer={"enumerate": "parallel"} if enumerate_z else None)
            logits = context @ out_w + out_b  # [..., B, T, V]: enumerated values on the left
            numpyro.sample("y", dist.Categorical(logits=logits).mask(batch.tgt_mask),
                           obs=batch.tgt_out)

    def guide(self, batch, *, posterior="inference", enumerate_z=False, kl_scale=1.0,
              baseline=None):
        if posterior == "none":
            return
        values = self.embed(batch.src)
        scores = self.prior_scores(batch)
        if posterior == "inference":  # q(z_t | x, y): prior × evidence from y_t
            A = numpyro.param("q_bilinear", _uniform((self.dim, self.dim), 1 / math.sqrt(self.dim)))
            q = self.embed(batch.tgt_out, name="q_embed", vocab=self.tgt_vocab)
            scores = scores + q @ jnp.swapaxes(values @ A, 1, 2)
        B, T = batch.tgt_out.shape
        with numpyro.plate("batch", B, dim=-2), numpyro.plate("target", T, dim=-1), \
                handlers.scale(scale=kl_scale):
            pan.attend("align", scores, values, self.family, mask=batch.src_mask, guide=True,
                       target_mask=batch.tgt_mask,
                       infer={"enumerate": "parallel"} if enumerate_z else None)
