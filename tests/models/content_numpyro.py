"""A content-based aligner in NumPyro alone (no torch).

Target token t aligns to one source position z_t with
    p(z_t = j | x, y<t) ∝ exp(h_t · B e(x_j)),   h_t = embedding of the previous target token,
and is emitted as p(y_t | z_t = j, x) = softmax(e(x_j) W + b)_{y_t}.
The inference network q(z_t | x, y) adds evidence from y_t: scores + g(y_t) · Q e(x_j).
"""
import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro import handlers

import ppl_attention as pa
import ppl_attention.numpyro  # noqa: F401  (makes pa.numpyro available)


def _normal(shape, scale):
    return lambda key: scale * jax.random.normal(key, shape)


class ContentAlignment(pa.numpyro.models.AlignmentModel):
    option_help = {"dim": "embedding size", "init_scale": "std of the initial weights",
                   "bilinear": "bilinear prior score (else a dot product)"}

    def __init__(self, src_vocab: int, tgt_vocab: int, *, family, dim: int = 16,
                 init_scale: float = 0.1, bilinear: bool = True):
        super().__init__()
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.dim, self.init_scale, self.bilinear = dim, init_scale, bilinear
        self.family = pa.numpyro.make_family(family, key_dim=dim)

    # ---- shared pieces -------------------------------------------------------------
    def _source(self, batch):
        E = numpyro.param("src_embed", _normal((self.src_vocab, self.dim), self.init_scale))
        return E[batch.src]                                           # [B, S, d]

    def _prior_scores(self, batch, values):
        H = numpyro.param("prev_embed", _normal((self.tgt_vocab, self.dim), self.init_scale))
        h = H[batch.tgt_in]                                           # [B, T, d]
        if self.bilinear:
            Bm = numpyro.param("prior_bilinear", _normal((self.dim, self.dim), self.init_scale))
            h = h @ Bm
        return h @ jnp.swapaxes(values, -1, -2)                       # [B, T, S]

    # ---- the contract ---------------------------------------------------------------
    def model(self, batch, *, enumerate_z=False, kl_scale=1.0):
        values = self._source(batch)
        scores = self._prior_scores(batch, values)
        W = numpyro.param("out_w", _normal((self.dim, self.tgt_vocab), self.init_scale))
        b = numpyro.param("out_b", jnp.zeros(self.tgt_vocab))
        B, T = batch.tgt_out.shape
        with numpyro.plate("batch", B, dim=-2), numpyro.plate("target", T, dim=-1):
            with handlers.scale(scale=kl_scale):
                ctx, _ = pa.numpyro.attend(
                    "align", scores, values, self.family, mask=batch.src_mask,
                    target_mask=None if enumerate_z else batch.tgt_mask,
                    infer={"enumerate": "parallel"} if enumerate_z else None)
            logits = ctx @ W + b                                      # [..., B, T, V]
            numpyro.sample("y", dist.Categorical(logits=logits).mask(batch.tgt_mask),
                           obs=batch.tgt_out)

    def guide(self, batch, *, posterior="inference", enumerate_z=False, kl_scale=1.0,
              baseline=None):
        if posterior == "none":
            return
        values = self._source(batch)
        scores = self._prior_scores(batch, values)
        if posterior == "inference":
            G = numpyro.param("q_embed", _normal((self.tgt_vocab, self.dim), self.init_scale))
            Q = numpyro.param("q_bilinear", _normal((self.dim, self.dim), self.init_scale))
            scores = scores + G[batch.tgt_out] @ jnp.swapaxes(values @ Q, -1, -2)
        infer = {"enumerate": "parallel"} if enumerate_z else None
        B, T = batch.tgt_out.shape
        with numpyro.plate("batch", B, dim=-2), numpyro.plate("target", T, dim=-1), \
                handlers.scale(scale=kl_scale):
            pa.numpyro.attend("align", scores, values, self.family, mask=batch.src_mask,
                              guide=True, target_mask=batch.tgt_mask, infer=infer)
