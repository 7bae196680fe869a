"""AttentionSeqVAE for NumPyro: the model of :mod:`ppl_attention.pyro.models.seq_vae` (read its
docstring for the maths), the Pyro model's declared twin (``numpyro_twin``; ``ppl-attention
check-twin seq-vae ppl_attention.numpyro.models.seq_vae:AttentionSeqVAE --task reorder``).

It meets the NumPyro model contract (:mod:`.base`): the same constructor, declarations and
programs as the Pyro model — ``model``/``guide`` with the contract's switches and the step
argument ``beta`` (:meth:`step_arguments`), sites ``"z"`` (the global latent, under the batch
plate), ``"align"`` (a categorical alignment over the decoder's memory, enumerated when
``enumerate_z``; soft attention has no site), ``"x"`` (the tokens) and the guide's
``"free_bits"`` factor. The weights are one pytree-valued ``numpyro.param("seq_vae", …)`` keyed
like the torch model's ``state_dict()``, so they move between the twins by name as they are;
``m.init_params(key)`` gives fresh ones, ``m, params = AttentionSeqVAE.from_torch(torch_model)``
the twin of a trained torch model.

What the mirror has not: the continuous alignment families (weibull, lognormal: use the Pyro
backend) and word dropout (a training-time option; the mirror evaluates a model trained with it
without it, as the torch model does in eval mode, and refuses to train with it). Rows of a padded
batch without tokens (NumPyro's bucketing) have their z and free-bits terms masked out, so they
add nothing to the loss.
"""

from __future__ import annotations

import contextlib
import math

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro import handlers

from ...common.seq_vae_options import ANNEALING, OPTION_HELP, check_family, check_options
from ...core.errors import UserError
from ..attend import attend
from ..families import Family, from_torch_family, make_family
from ..nn import (
    Params,
    bilstm,
    from_torch,
    gru_cell,
    init_linear,
    linear,
    sub,
    transformer_decoder_layer,
    transformer_encoder_layer,
)
from ..scores import make_score
from .base import AlignmentModel

__all__ = ["AttentionSeqVAE", "kl_normal_per_dim", "SITE"]

SITE = "align"
MIRRORED_FAMILIES = ("soft", "categorical")


def kl_normal_per_dim(mu, sigma):
    """KL(N(μ, σ²) ‖ N(0, 1)) per dimension = ½(μ² + σ² − 1) − log σ."""
    return 0.5 * (mu**2 + sigma**2 - 1.0) - jnp.log(sigma)


def _positions(L: int, d: int):
    pos = jnp.arange(L)[:, None]
    div = jnp.exp(jnp.arange(0, d, 2) * (-math.log(10000.0) / d))
    pe = jnp.zeros((L, d))
    pe = pe.at[:, 0::2].set(jnp.sin(pos * div))
    return pe.at[:, 1::2].set(jnp.cos(pos * div)[:, : d // 2])


# --- fresh weights, torch's default initializations under torch's names ---------------------

def _init_rnn(key, prefix: str, d_in: int, hidden: int, suffixes, gates: int = 3) -> Params:
    """A torch GRU (``gates`` 3) or LSTM (4): U(−1/√h, 1/√h) for every weight and bias."""
    p = {}
    bound = 1.0 / math.sqrt(hidden)
    for suffix in suffixes:
        for kind, shape in (("weight_ih", (gates * hidden, d_in)),
                            ("weight_hh", (gates * hidden, hidden)),
                            ("bias_ih", (gates * hidden,)), ("bias_hh", (gates * hidden,))):
            key, k = jax.random.split(key)
            p[f"{prefix}{kind}{suffix}"] = jax.random.uniform(k, shape, minval=-bound,
                                                              maxval=bound)
    return p


def _init_attention(key, name: str, d: int) -> Params:
    """torch.nn.MultiheadAttention: Xavier-uniform packed projections, zero biases."""
    k1, k2 = jax.random.split(key)
    bound = math.sqrt(6.0 / (d + 3 * d))
    p = {f"{name}.in_proj_weight": jax.random.uniform(k1, (3 * d, d), minval=-bound,
                                                      maxval=bound),
         f"{name}.in_proj_bias": jnp.zeros(3 * d)}
    p |= init_linear(k2, f"{name}.out_proj", d, d)
    p[f"{name}.out_proj.bias"] = jnp.zeros(d)
    return p


def _init_transformer_layer(key, name: str, d: int, cross: bool) -> Params:
    """torch.nn.TransformerEncoderLayer (``cross``: DecoderLayer), feed-forward 2d."""
    k1, k2, k3, k4 = jax.random.split(key, 4)
    p = _init_attention(k1, f"{name}.self_attn", d)
    if cross:
        p |= _init_attention(k2, f"{name}.multihead_attn", d)
    p |= init_linear(k3, f"{name}.linear1", d, 2 * d)
    p |= init_linear(k4, f"{name}.linear2", 2 * d, d)
    for i in (1, 2, 3) if cross else (1, 2):
        p[f"{name}.norm{i}.weight"] = jnp.ones(d)
        p[f"{name}.norm{i}.bias"] = jnp.zeros(d)
    return p


class AttentionSeqVAE(AlignmentModel):
    """The constructor, options and defaults of the torch model; ``family`` must be soft or
    categorical here, and ``word_dropout`` 0."""

    param_name = "seq_vae"  # the one pytree-valued numpyro.param of model and guide
    site = SITE
    data = "sequences"
    latents = ("z",)
    latent_guide = True  # the guide samples z (amortized): trained by the alignment methods
    posteriors = ("none", "prior")  # the alignment's guide, if any, is the family's posterior
    families = MIRRORED_FAMILIES
    training_defaults = {"lr": 3e-3}
    option_help = OPTION_HELP

    def __init__(self, vocab: int, hidden: int = 128, latent: int = 16, embed: int | None = None,
                 encoder: str = "gru", decoder: str = "gru", attention: str = "additive",
                 memory: str = "decoder", z_input: str = "both", family: Family | str | None = None,
                 heads: int = 4, layers: int = 1, z_slots: int = 4, word_dropout: float = 0.0,
                 free_bits: float = 0.0, max_len: int = 64, kl_anneal: str = "none",
                 anneal_steps: int = 1000):
        check_options(hidden=hidden, latent=latent, encoder=encoder, decoder=decoder,
                      attention=attention, memory=memory, z_input=z_input, heads=heads,
                      layers=layers, z_slots=z_slots, word_dropout=word_dropout,
                      free_bits=free_bits, max_len=max_len, kl_anneal=kl_anneal,
                      anneal_steps=anneal_steps)
        if word_dropout:
            raise UserError(f"word_dropout={word_dropout}: the NumPyro AttentionSeqVAE trains "
                            f"without word dropout; use the pyro backend or word_dropout=0")
        self.family = make_family(family, key_dim=hidden)
        if self.family.name not in MIRRORED_FAMILIES:
            raise UserError(f"the NumPyro AttentionSeqVAE has soft and categorical alignments, "
                            f"not {self.family.name!r}: use the pyro backend")
        check_family(self.family.deterministic, decoder, attention)
        self.hidden, self.latent, self.embed = hidden, latent, embed or hidden
        self.score = (make_score(attention, hidden, hidden)
                      if decoder == "gru" and attention != "none" else None)
        self.params: Params | None = None

    @classmethod
    def from_torch(cls, torch_model, training: bool = False) -> tuple[AttentionSeqVAE, Params]:
        """The NumPyro twin of a torch ``AttentionSeqVAE`` and its weights. For evaluation a
        model trained with word dropout evaluates without it, as the torch model does in eval
        mode; for ``training`` word dropout is refused (the mirror has none)."""
        config = dict(torch_model.config)
        if not training:
            config["word_dropout"] = 0.0
        m = cls(family=from_torch_family(torch_model.family), **config)
        m.params = from_torch(torch_model.state_dict())
        return m, m.params

    def _param(self) -> Params:
        """The one parameter of the programs: the weights set by :meth:`from_torch`, else
        fresh ones from the seed's key (:meth:`init_params`)."""
        return numpyro.param(self.param_name,
                             self.params if self.params is not None else self.init_params)

    def init_params(self, key) -> Params:
        """Fresh weights under the torch model's ``state_dict`` names and shapes."""
        c, h, e, d = self.config, self.hidden, self.embed, self.latent
        V = c["vocab"]
        zc = d if c["z_input"] in ("concat", "both") else 0
        ks = iter(jax.random.split(key, 16 + 2 * c["layers"]))
        p = {"emb.weight": jax.random.normal(next(ks), (V, e))}
        if c["encoder"] == "gru":
            p |= _init_rnn(next(ks), "encoder.", e, h // 2, ("_l0", "_l0_reverse"))
        else:
            p |= init_linear(next(ks), "enc_in", e, h)
            for i in range(c["layers"]):
                p |= _init_transformer_layer(next(ks), f"encoder.layers.{i}", h, cross=False)
        p |= init_linear(next(ks), "q_mu", h, d)
        p |= init_linear(next(ks), "q_log_sigma", h, d)
        if c["decoder"] == "gru":
            p |= _init_rnn(next(ks), "decoder.", e + zc, h, ("",))
            if c["attention"] != "none":
                p |= {f"score.{k}": v for k, v in self.score.init(next(ks)).items()}
                p |= init_linear(next(ks), "W_c", h, h, bias=False)
        else:
            p |= init_linear(next(ks), "dec_in", e + zc, h)
            for i in range(c["layers"]):
                p |= _init_transformer_layer(next(ks), f"decoder.layers.{i}", h, cross=True)
            p |= init_linear(next(ks), "z_memory", d, c["z_slots"] * h)
        if c["z_input"] in ("init", "both"):
            p |= init_linear(next(ks), "W_init", d, h)
        p |= init_linear(next(ks), "W_s", h, h)
        p |= init_linear(next(ks), "W_z", d, h, bias=False)
        p |= init_linear(next(ks), "W_o", h, V)
        return p

    # --- properties --------------------------------------------------------------------------
    @property
    def generative(self) -> bool:
        """False for memory "encoder": p(x | z) then reads x itself (no bound, no samples)."""
        return self.config["memory"] == "decoder"

    @property
    def enumerate_alignment(self) -> bool:
        return self.config["attention"] != "none" and self.family.enumerable

    @property
    def _samples_alignment(self) -> bool:
        return (self.config["decoder"] == "gru" and self.config["attention"] != "none"
                and not self.family.deterministic)

    # --- inference network -------------------------------------------------------------------
    def encode(self, p: Params, batch):
        """x ``[B, L]`` → encoder states H ``[B, L, h]`` (0 on padding), μ and σ ``[B, d]``."""
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
        """GRU decoder: states s_0..s_T ``[B, T+1, h]``. Transformer decoder: outputs
        ``[B, T, h]``."""
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
              else jnp.zeros((B, self.hidden), emb.dtype))

        def step(s, x):
            s = gru_cell(p, "", x, s, "decoder.")
            return s, s

        _, ss = jax.lax.scan(step, s0, jnp.swapaxes(emb, 0, 1))
        return jnp.concatenate([s0[:, None], jnp.swapaxes(ss, 0, 1)], 1)

    def memory_and_scores(self, p: Params, states, H, src_mask, T: int):
        """GRU decoder with attention: memory ``[B, S, h]``, scores e ``[B, T, S]`` and their
        mask ``[B, T, S]`` (decoder memory: position j < t is visible to output t)."""
        query = states[:, 1:]
        if self.config["memory"] == "decoder":
            memory = states[:, :-1]
            mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (states.shape[0], T, T))
        else:
            memory = H
            mask = jnp.broadcast_to(src_mask[:, None], (src_mask.shape[0], T, src_mask.shape[1]))
        return memory, self.score(sub(p, "score"), query, memory), mask

    def output_logits(self, p: Params, states, z, context=None):
        """logits ``[..., B, T, V]`` from decoder states (GRU: s_1..s_T), the context (which
        may carry enumeration dims on the left) and z."""
        s = states[:, 1:] if self.config["decoder"] == "gru" else states
        pre = linear(p, "W_s", s) + linear(p, "W_z", z)[:, None]
        if context is not None:
            pre = pre + linear(p, "W_c", context)
        return linear(p, "W_o", jnp.tanh(pre))

    def token_log_likelihood(self, p: Params, batch, z, H=None):
        """log p(x_t | x_<t, z) ``[B, T]`` (0 on padding), exact: the soft context, or a
        categorical alignment summed out, Σ_j p(a_t = j)·p(x_t | a_t = j)."""
        c = self.config
        if H is None and c["memory"] == "encoder":
            H = self.encode(p, batch)[0]
        T = batch.tgt_in.shape[1]
        states = self.decoder_states(p, z, batch.tgt_in, H, batch.src_mask)
        y = batch.tgt_out
        if c["decoder"] == "transformer" or c["attention"] == "none":
            logp = jax.nn.log_softmax(self.output_logits(p, states, z), -1)
            ll = jnp.take_along_axis(logp, y[..., None], -1)[..., 0]
        else:
            memory, e, mask = self.memory_and_scores(p, states, H, batch.src_mask, T)
            if self.family.deterministic:
                w = self.family.deterministic_weights(e, mask)
                logp = jax.nn.log_softmax(self.output_logits(p, states, z, w @ memory), -1)
                ll = jnp.take_along_axis(logp, y[..., None], -1)[..., 0]
            else:
                log_prior = jax.nn.log_softmax(jnp.where(mask, e, -jnp.inf), -1)  # [B, T, S]
                # every memory position j as the context: [B, T, S, V]
                pre = (linear(p, "W_s", states[:, 1:])[:, :, None]
                       + linear(p, "W_z", z)[:, None, None] + linear(p, "W_c", memory)[:, None])
                logp = jax.nn.log_softmax(linear(p, "W_o", jnp.tanh(pre)), -1)
                idx = jnp.broadcast_to(y[:, :, None, None], (*logp.shape[:-1], 1))
                emis = jnp.take_along_axis(logp, idx, -1)[..., 0]
                ll = jax.nn.logsumexp(jnp.where(mask, log_prior + emis, -jnp.inf), -1)
        return jnp.where(batch.tgt_mask, ll, 0.0)

    # --- probabilistic program ---------------------------------------------------------------
    @staticmethod
    def _scale(scale):
        """Log-densities times ``scale``; a (concrete) 0 — β at the first step of linear KL
        annealing — masks them, since NumPyro's ``scale`` takes only positive numbers (a traced
        β, as in the jitted step, may be 0)."""
        if isinstance(scale, (int, float)):
            if scale == 1.0:
                return contextlib.nullcontext()
            if scale == 0.0:
                return handlers.mask(mask=False)
        return handlers.scale(scale=scale)

    @staticmethod
    def _rows(batch):
        """``[B, 1]``: the rows with tokens (a padded row of a NumPyro batch has none), where
        the per-sequence sites z and free bits count."""
        return batch.tgt_mask.any(-1)[:, None]

    def model(self, batch, *, enumerate_z: bool = False, kl_scale=1.0, beta=1.0):
        """p(x, z, a): z ~ N(0, I) (its log-density scaled by ``beta``), the alignment (if the
        family samples one; enumerated when ``enumerate_z``, scaled by ``kl_scale``), tokens
        observed."""
        p = self._param()
        B, T = batch.tgt_out.shape
        H = self.encode(p, batch)[0] if self.config["memory"] == "encoder" else None
        with numpyro.plate("batch", B, dim=-2):
            with self._scale(beta), handlers.mask(mask=self._rows(batch)):
                loc = jnp.zeros((B, 1, self.latent), p["W_z.weight"].dtype)
                z = numpyro.sample("z", dist.Normal(loc, 1.0).to_event(1))[:, 0]
            plate_t = numpyro.plate("target", T, dim=-1)
            if self._samples_alignment:
                states = self.decoder_states(p, z, batch.tgt_in, H, batch.src_mask)
                memory, e, mask = self.memory_and_scores(p, states, H, batch.src_mask, T)
                with plate_t:
                    with self._scale(kl_scale):
                        ctx, _ = attend(SITE, e, memory, self.family, mask=mask, keys=memory,
                                        target_mask=None if enumerate_z else batch.tgt_mask,
                                        infer={"enumerate": "parallel"} if enumerate_z else None)
                    logits = self.output_logits(p, states, z, ctx)  # enum dims broadcast
                    with handlers.mask(mask=batch.tgt_mask):
                        numpyro.sample("x", dist.Categorical(logits=logits), obs=batch.tgt_out)
            else:
                ll = self.token_log_likelihood(p, batch, z, H)
                with plate_t:
                    numpyro.factor("x", ll)

    def guide(self, batch, *, posterior: str = "none", enumerate_z: bool = False, kl_scale=1.0,
              baseline=None, beta=1.0, use_free_bits: bool = True):
        """q(z | x) = N(μ(x), σ(x)); with ``posterior="prior"`` also q(a | x, z) = the family's
        posterior at the decoder's own scores (enumerated when ``enumerate_z``). ``baseline`` is
        the contract's (NumPyro's score-function loss applies it itself)."""
        if posterior not in self.posteriors:
            raise UserError(f"posterior must be one of {', '.join(self.posteriors)}, got "
                            f"{posterior!r}")
        p = self._param()
        B, T = batch.tgt_out.shape
        H, mu, sigma = self.encode(p, batch)
        rows = self._rows(batch)
        with numpyro.plate("batch", B, dim=-2):
            with self._scale(beta), handlers.mask(mask=rows):
                z = numpyro.sample("z", dist.Normal(mu[:, None], sigma[:, None])
                                   .to_event(1))[:, 0]
            fb = self.config["free_bits"] if use_free_bits else 0.0
            if fb > 0:
                # log q += Σ_d relu(λ − KL_d): the ELBO's KL term becomes Σ_d max(KL_d, λ)
                gap = jnp.clip(fb - kl_normal_per_dim(mu, sigma), 0.0).sum(-1)
                numpyro.factor("free_bits", jnp.where(rows, beta * gap[:, None], 0.0))
            if posterior == "prior" and self._samples_alignment:
                states = self.decoder_states(p, z, batch.tgt_in, H, batch.src_mask)
                memory, e, mask = self.memory_and_scores(p, states, H, batch.src_mask, T)
                with numpyro.plate("target", T, dim=-1), self._scale(kl_scale):
                    attend(SITE, e, memory, self.family, mask=mask, keys=memory, guide=True,
                           target_mask=batch.tgt_mask,
                           infer={"enumerate": "parallel"} if enumerate_z else None)

    # --- training ----------------------------------------------------------------------------
    def step_arguments(self, step: int) -> dict:
        """β(step) of the z site's KL annealing, for model and guide at that step."""
        return {"beta": ANNEALING[self.config["kl_anneal"]](step, self.config["anneal_steps"])}
