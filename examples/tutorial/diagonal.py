"""A new model with a latent alignment, written against the model contract of ppl_attention
(docs/architecture.md): a neural IBM Model 2.

    p(z_t = j | x, t) ∝ exp(−λ·|(t + ½)/T − (j + ½)/S|)        a learned diagonal prior (λ > 0)
    p(y_t | z_t = j, x) = softmax(W e(x_j) + b)_{y_t}           a translation table of embeddings

Target tokens are independent given their alignments; the guide q(z_t | x, y) adds the evidence
e_q(y_t)ᵀ A e(x_j) to the prior's logits. The site "align" is written by ``pa.attend``, so every
method of the registry trains it (exact enumeration, variational attention, soft attention …),
and ``evaluate``, ``align``, ``analyze`` and ``diagnose`` work on it. It has no predictive for
decoding (its prior needs the target length), so ``decode`` refuses it.

    ppl-attention compare --model examples/tutorial/diagonal.py:DiagonalAlignment \\
        --task reorder --methods exact,vae-enum,soft --steps 300 --out runs/diagonal
"""

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from torch import nn

import ppl_attention as pa


class DiagonalAlignment(pa.models.AlignmentModel):
    """``dim``: embedding size; ``tension``: the diagonal prior's initial λ."""

    def __init__(self, src_vocab: int, tgt_vocab: int, *, family, dim: int = 32,
                 tension: float = 4.0):
        super().__init__()
        self.family = pa.make_family(family, key_dim=dim)
        self.embed = nn.Embedding(src_vocab, dim)
        self.out = nn.Linear(dim, tgt_vocab)
        self.log_tension = nn.Parameter(torch.tensor(float(tension)).log())
        self.q_embed = nn.Embedding(tgt_vocab, dim)
        self.q_bilinear = nn.Linear(dim, dim, bias=False)

    def prior_scores(self, batch):
        """−λ·|relative target position − relative source position|, ``[B, T, S]``."""
        S, T = batch.src.shape[1], batch.tgt_out.shape[1]
        dtype = self.out.weight.dtype  # tensors made here go on the inputs' device
        i = torch.arange(S, device=batch.src.device, dtype=dtype) + 0.5
        t = torch.arange(T, device=batch.src.device, dtype=dtype) + 0.5
        i = i / batch.src_mask.sum(-1, keepdim=True)  # [B, S]
        t = t / batch.tgt_mask.sum(-1, keepdim=True)  # [B, T]
        return -self.log_tension.exp() * (t[:, :, None] - i[:, None, :]).abs()

    def model(self, batch, *, enumerate_z=False, kl_scale=1.0):
        pyro.module("diagonal", self)
        values = self.embed(batch.src)  # [B, S, d]: what an alignment selects
        B, T = batch.tgt_out.shape
        with pyro.plate("batch", B, dim=-2), pyro.plate("target", T, dim=-1):
            with poutine.scale(scale=kl_scale):
                context, _ = pa.attend(
                    "align", self.prior_scores(batch), values, self.family, mask=batch.src_mask,
                    target_mask=None if enumerate_z else batch.tgt_mask,
                    infer={"enumerate": "parallel"} if enumerate_z else None)
            logits = self.out(context)  # [..., B, T, V]: enumerated values broadcast on the left
            pyro.sample("y", dist.Categorical(logits=logits).mask(batch.tgt_mask),
                        obs=batch.tgt_out)

    def guide(self, batch, *, posterior="inference", enumerate_z=False, kl_scale=1.0,
              baseline=None):
        if posterior == "none":
            return
        pyro.module("diagonal", self)
        values = self.embed(batch.src)
        scores = self.prior_scores(batch)
        if posterior == "inference":  # q(z_t | x, y): prior × evidence from y_t
            scores = scores + self.q_embed(batch.tgt_out) @ self.q_bilinear(values).transpose(1, 2)
        infer = {"enumerate": "parallel"} if enumerate_z else {}
        if baseline is not None:
            infer["baseline"] = {"baseline_value": baseline}
        B, T = batch.tgt_out.shape
        with pyro.plate("batch", B, dim=-2), pyro.plate("target", T, dim=-1), \
                poutine.scale(scale=kl_scale):
            pa.attend("align", scores, values, self.family, mask=batch.src_mask, guide=True,
                      target_mask=batch.tgt_mask, infer=infer or None)
