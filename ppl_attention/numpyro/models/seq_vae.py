"""AttentionSeqVAE for NumPyro: the model of :mod:`ppl_attention.models.seq_vae` (read its
docstring for the maths) as pure JAX functions of a parameter dict keyed like the torch model's
``state_dict()``, with the same ``model``/``guide`` programs (sites ``"z"``, ``"x"``,
``"free_bits"``). ``m, params = AttentionSeqVAE.from_torch(torch_model)``.

Alignments: soft attention, or a categorical alignment summed out in closed form inside the
``"x"`` factor (the same Σ_j p(a_t = j)·p(x_t | a_t = j) that Pyro's TraceEnum_ELBO computes over
its enumerated ``"align"`` site); the continuous families are Pyro-only here. Word dropout is a
training-time option of the torch side; this mirror evaluates and trains without it.
"""

from __future__ import annotations

import contextlib
import math

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro import handlers

from ...errors import UserError
from ..nn import (
    Params,
    bilstm,
    from_torch,
    gru_cell,
    linear,
    sub,
    transformer_decoder_layer,
    transformer_encoder_layer,
)
from ..scores import make_score

__all__ = ["AttentionSeqVAE", "kl_normal_per_dim"]


def kl_normal_per_dim(mu, sigma):
    """KL(N(μ, σ²) ‖ N(0, 1)) per dimension = ½(μ² + σ² − 1) − log σ."""
    return 0.5 * (mu**2 + sigma**2 - 1.0) - jnp.log(sigma)


def _positions(L: int, d: int):
    pos = jnp.arange(L)[:, None]
    div = jnp.exp(jnp.arange(0, d, 2) * (-math.log(10000.0) / d))
    pe = jnp.zeros((L, d))
    pe = pe.at[:, 0::2].set(jnp.sin(pos * div))
    return pe.at[:, 1::2].set(jnp.cos(pos * div)[:, : d // 2])


class AttentionSeqVAE:
    """Same constructor as the torch model; ``family`` must be soft or categorical."""

    def __init__(self, vocab: int, hidden: int = 128, latent: int = 16, embed: int | None = None,
                 encoder: str = "gru", decoder: str = "gru", attention: str = "additive",
                 memory: str = "decoder", z_input: str = "both", family: str = "soft",
                 heads: int = 4, layers: int = 1, z_slots: int = 4, word_dropout: float = 0.0,
                 free_bits: float = 0.0, max_len: int = 64, kl_anneal: str = "none",
                 anneal_steps: int = 1000):
        name = getattr(family, "name", family) or "soft"
        if name not in ("soft", "categorical"):
            raise UserError(f"the NumPyro AttentionSeqVAE has soft and categorical alignments; "
                             f"got {name!r} (use the Pyro backend)")
        embed = embed or hidden
        self.config = dict(vocab=vocab, hidden=hidden, latent=latent, embed=embed,
                           encoder=encoder, decoder=decoder, attention=attention, memory=memory,
                           z_input=z_input, family=name, heads=heads, layers=layers,
                           z_slots=z_slots, word_dropout=word_dropout, free_bits=free_bits,
                           max_len=max_len)
        self.hidden, self.latent = hidden, latent
        self.score = make_score(attention, hidden, hidden) if attention != "none" else None
        self.params: Params | None = None

    @classmethod
    def from_torch(cls, torch_model):
        m = cls(**torch_model.config, family=torch_model.family.name)
        m.params = from_torch(torch_model.state_dict())
        return m, m.params

    @property
    def generative(self) -> bool:
        return self.config["memory"] == "decoder"

    # --- inference network ---------------------------------------------------------------------
    def encode(self, p: Params, batch):
        """→ H ``[B, L, h]`` (0 on padding), μ, σ ``[B, d]``."""
        x, mask = batch.src, batch.src_mask
        emb = p["emb.weight"][x]
        c = self.config
        if c["encoder"] == "gru":
            H = bilstm(p, "encoder", emb, mask, cell="gru")
        else:
            h = linear(p, "enc_in", emb) + _positions(x.shape[1], self.hidden)
            for i in range(c["layers"]):
                h = transformer_encoder_layer(p, f"encoder.layers.{i}", h, c["heads"], ~mask)
            H = jnp.where(mask[..., None], h, 0.0)
        pooled = H.sum(1) / mask.sum(-1, keepdims=True)
        sigma = jax.nn.softplus(linear(p, "q_log_sigma", pooled)) + 1e-4
        return H, linear(p, "q_mu", pooled), sigma

    # --- decoder -----------------------------------------------------------------------------
    def decoder_states(self, p: Params, z, tgt_in, H=None, src_mask=None):
        """GRU: states s_0..s_T ``[B, T+1, h]``; Transformer: outputs ``[B, T, h]``."""
        c = self.config
        emb = p["emb.weight"][tgt_in]
        B, T = tgt_in.shape
        if c["z_input"] in ("concat", "both"):
            emb = jnp.concatenate([emb, jnp.broadcast_to(z[:, None], (B, T, z.shape[-1]))], -1)
        if c["decoder"] == "transformer":
            h = linear(p, "dec_in", emb) + _positions(T, self.hidden)
            if c["memory"] == "encoder":
                mem, mem_mask = H, ~src_mask
            else:
                mem, mem_mask = linear(p, "z_memory", z).reshape(B, c["z_slots"], -1), None
            for i in range(c["layers"]):
                h = transformer_decoder_layer(p, f"decoder.layers.{i}", h, mem, c["heads"],
                                              mem_mask)
            return h
        s0 = (jnp.tanh(linear(p, "W_init", z)) if c["z_input"] in ("init", "both")
              else jnp.zeros((B, self.hidden)))

        def step(s, x):
            s = gru_cell(p, "", x, s, "decoder.")
            return s, s

        _, ss = jax.lax.scan(step, s0, jnp.swapaxes(emb, 0, 1))
        return jnp.concatenate([s0[:, None], jnp.swapaxes(ss, 0, 1)], 1)

    def _memory_and_scores(self, p, states, H, src_mask, T):
        query = states[:, 1:]
        if self.config["memory"] == "decoder":
            memory = states[:, :-1]
            mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (states.shape[0], T, T))
        else:
            memory = H
            mask = jnp.broadcast_to(src_mask[:, None], (src_mask.shape[0], T, src_mask.shape[1]))
        return memory, self.score(sub(p, "score"), query, memory), mask

    def _pre(self, p, states, z):
        s = states[:, 1:] if self.config["decoder"] == "gru" else states
        return linear(p, "W_s", s) + linear(p, "W_z", z)[:, None]

    def token_log_likelihood(self, p: Params, batch, z, H=None):
        """log p(x_t | x_<t, z) ``[B, T]`` (0 on padding); a categorical alignment summed out."""
        c = self.config
        T = batch.tgt_in.shape[1]
        states = self.decoder_states(p, z, batch.tgt_in, H, batch.src_mask)
        y = batch.tgt_out
        pre = self._pre(p, states, z)
        if c["decoder"] == "transformer" or c["attention"] == "none":
            logp = jax.nn.log_softmax(linear(p, "W_o", jnp.tanh(pre)), -1)
            ll = jnp.take_along_axis(logp, y[..., None], -1)[..., 0]
        else:
            memory, e, mask = self._memory_and_scores(p, states, H, batch.src_mask, T)
            e = jnp.where(mask, e, -jnp.inf)
            if c["family"] == "soft":
                ctx = jax.nn.softmax(e, -1) @ memory
                logp = jax.nn.log_softmax(linear(p, "W_o", jnp.tanh(pre + linear(p, "W_c", ctx))),
                                          -1)
                ll = jnp.take_along_axis(logp, y[..., None], -1)[..., 0]
            else:
                log_prior = jax.nn.log_softmax(e, -1)  # [B, T, S]
                full = pre[:, :, None] + linear(p, "W_c", memory)[:, None]  # [B, T, S, h]
                logp = jax.nn.log_softmax(linear(p, "W_o", jnp.tanh(full)), -1)
                idx = jnp.broadcast_to(y[:, :, None, None], (*logp.shape[:-1], 1))
                emis = jnp.take_along_axis(logp, idx, -1)[..., 0]
                ll = jax.nn.logsumexp(jnp.where(mask, log_prior + emis, -jnp.inf), -1)
        return jnp.where(batch.tgt_mask, ll, 0.0)

    # --- probabilistic program ---------------------------------------------------------------
    @staticmethod
    def _scale(kl_scale):
        if isinstance(kl_scale, (int, float)) and kl_scale == 1.0:
            return contextlib.nullcontext()
        return handlers.scale(scale=kl_scale)

    def model(self, batch, kl_scale=1.0):
        p = numpyro.param("seq_vae", self.params)
        B = batch.tgt_out.shape[0]
        H = self.encode(p, batch)[0] if self.config["memory"] == "encoder" else None
        with numpyro.plate("batch", B, dim=-1):
            with self._scale(kl_scale):
                z = numpyro.sample("z", dist.Normal(jnp.zeros((B, self.latent)), 1.0)
                                   .to_event(1))
            numpyro.factor("x", self.token_log_likelihood(p, batch, z, H).sum(-1))

    def guide(self, batch, kl_scale=1.0, use_free_bits: bool = True):
        p = numpyro.param("seq_vae", self.params)
        _, mu, sigma = self.encode(p, batch)
        with numpyro.plate("batch", mu.shape[0], dim=-1):
            with self._scale(kl_scale):
                numpyro.sample("z", dist.Normal(mu, sigma).to_event(1))
            fb = self.config["free_bits"] if use_free_bits else 0.0
            if fb > 0:
                gap = jnp.clip(fb - kl_normal_per_dim(mu, sigma), 0.0).sum(-1)
                numpyro.factor("free_bits", kl_scale * gap)
