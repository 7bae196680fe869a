"""AttentionSeqVAE: a sequence VAE with a global latent z and decoder-side attention.

Generative model (one sequence x = x_1..x_n, x_{n+1} = <eos>)::

    z ~ N(0, I_d)                                                     site "z"
    s_0 = tanh(W_init z)  (z_input "init"/"both"; else 0)
    s_t = GRU(s_{t-1}, [emb(x_{t-1}); z if "concat"/"both"])          x_0 = <bos>
    e_t = score(s_t, M)   over the memory M, masked                    (attention != "none")
    a_t ~ family(e_t)     site "align" (Soft: deterministic weights)   context c_t = Σ_j a_tj M_j
    x_t ~ softmax(W_o tanh(W_s s_t + W_c c_t + W_z z))                 site "x"

Memory ``"decoder"`` (default): M = (s_0, …, s_{t−1}), the decoder's own past states, so p(x | z)
is a proper autoregressive model — the ELBO bounds log p(x), IWAE estimates it, and prior samples
exist. This is the attention that can sideline z (it reads the history directly; the seed's
posterior-collapse risk). Memory ``"encoder"``: M = H, the encoder states of the very x being
reconstructed — the seed's "attend to the encoded input" variant. It is kept to show the
mechanism, but it is *not* a generative model of x (x is read through H), so its ELBO/IWAE are
not bounds on log p(x) and it has no prior samples; :meth:`generative` says which.

Inference network q(z | x) = N(μ, σ) from masked mean pooling of the encoder states H: a
bidirectional GRU or a Transformer encoder (multi-head self-attention, sinusoidal positions).
Decoder ``"transformer"``: masked self-attention + cross-attention to ``z_slots`` vectors made
from z (or to H with memory "encoder"); its attention is soft (no alignment site).

Objective: the method's ELBO (``soft``: Trace_ELBO; ``exact``: TraceEnum_ELBO, a categorical
alignment enumerated exactly; ``bam-weibull`` / ``bam-lognormal``: the alignment drawn in the
guide from the family's posterior at the decoder's own scores), with the KL weight β(step) on
the z site (``kl_anneal`` linear or sigmoid over ``anneal_steps``; :meth:`step_arguments`) and
free bits: the KL term becomes Σ_d max(KL_d, λ) (Kingma et al. 2016), implemented as the
analytic correction Σ_d relu(λ − KL_d) added to log q — in expectation exactly the free-bits
objective, and no gradient pushes a dimension's KL below λ. Word dropout replaces decoder
inputs by <unk> with probability p while training (Bowman et al. 2016).
"""

from __future__ import annotations

import contextlib
import math

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
import torch.nn.functional as F
from pyro.infer.util import is_validation_enabled
from torch import nn

from ...common.seq_vae_options import ANNEALING, OPTION_HELP, check_family, check_options
from ...core.errors import UserError
from ..attend import attend
from ..distributions import categorical_draws
from ..families import Family, make_family
from ..scores import make_score
from .base import AlignmentModel
from .rnn import run_packed
from .seq_vae_diagnostics import elbo_per_token, kl_normal_per_dim, latent_diagnostics

__all__ = ["AttentionSeqVAE", "kl_normal_per_dim", "free_bits_kl", "ANNEALING"]



def free_bits_kl(mu: torch.Tensor, sigma: torch.Tensor, floor: float) -> torch.Tensor:
    """The free-bits KL term Σ_d max(KL_d, λ) ``[B]`` (λ = ``floor`` nats per dimension)."""
    return kl_normal_per_dim(mu, sigma).clamp(min=floor).sum(-1)


def _scaled(scale):
    """Log-densities times ``scale``; a 0 — β at the first step of linear KL annealing — masks
    them, since Pyro's ``scale`` takes only positive numbers."""
    if isinstance(scale, (int, float)) and scale == 0.0:
        return poutine.mask(mask=False)
    return poutine.scale(scale=scale) if scale != 1.0 else contextlib.nullcontext()


class _PositionalEncoding(nn.Module):
    """Sinusoidal positions (Vaswani et al. 2017, §3.5) added to ``[B, L, d]``."""

    def __init__(self, d: int, max_len: int = 512):
        super().__init__()
        self.register_buffer("pe", torch.zeros(max_len, d), persistent=False)  # .to() moves it
        pos = torch.arange(max_len, device=self.pe.device).unsqueeze(1)
        div = torch.exp(torch.arange(0, d, 2, device=self.pe.device) * (-math.log(10000.0) / d))
        self.pe[:, 0::2] = torch.sin(pos * div)
        self.pe[:, 1::2] = torch.cos(pos * div)[:, : d // 2]

    def forward(self, x):
        if x.shape[1] > self.pe.shape[0]:
            raise UserError(f"sequence of {x.shape[1]} positions exceeds the positional "
                             f"encoding's {self.pe.shape[0]}")
        return x + self.pe[: x.shape[1]]


class AttentionSeqVAE(AlignmentModel):
    """Args: ``vocab`` size; ``hidden`` (h); ``latent`` (d); ``embed`` (default h);
    ``encoder`` ∈ {gru, transformer}; ``decoder`` ∈ {gru, transformer}; ``attention`` ∈ {none,
    additive, bilinear} (the GRU decoder's score; "bilinear" is Luong's multiplicative);
    ``memory`` ∈ {decoder, encoder}; ``z_input`` ∈ {init, concat, both}; ``family``: the
    alignment family (default Soft; a Categorical alignment is enumerated exactly); ``heads``,
    ``layers``: Transformer sizes; ``z_slots``: memory vectors the Transformer decoder makes
    from z; ``word_dropout``; ``free_bits`` (λ, nats per dimension); ``max_len``: the longest
    sequence accepted (tokens, without <eos>); ``kl_anneal`` ∈ ANNEALING and ``anneal_steps``:
    the KL weight β(step) on z."""

    data = "sequences"
    latents = ("z",)
    latent_guide = True  # the guide samples z (amortized): trained by the alignment methods
    posteriors = ("none", "prior")  # the alignment's guide, if any, is the family's posterior
    families = ("soft", "categorical", "weibull", "lognormal")  # at the decoder's own scores
    training_defaults = {"lr": 3e-3}
    option_help = OPTION_HELP
    numpyro_twin = "ppl_attention.numpyro.models.seq_vae:AttentionSeqVAE"

    def __init__(self, vocab: int, hidden: int = 128, latent: int = 16, embed: int | None = None,
                 encoder: str = "gru", decoder: str = "gru", attention: str = "additive",
                 memory: str = "decoder", z_input: str = "both", family: Family | str | None = None,
                 heads: int = 4, layers: int = 1, z_slots: int = 4, word_dropout: float = 0.0,
                 free_bits: float = 0.0, max_len: int = 64, kl_anneal: str = "none",
                 anneal_steps: int = 1000):
        super().__init__()
        check_options(hidden=hidden, latent=latent, encoder=encoder, decoder=decoder,
                      attention=attention, memory=memory, z_input=z_input, heads=heads,
                      layers=layers, z_slots=z_slots, word_dropout=word_dropout,
                      free_bits=free_bits, max_len=max_len, kl_anneal=kl_anneal,
                      anneal_steps=anneal_steps)
        self.family = make_family(family, key_dim=hidden)
        check_family(self.family.deterministic, decoder, attention)
        embed = embed or hidden
        self.hidden, self.latent = hidden, latent
        self.emb = nn.Embedding(vocab, embed)
        if encoder == "gru":
            self.encoder = nn.GRU(embed, hidden // 2, batch_first=True, bidirectional=True)
        else:
            self.enc_in = nn.Linear(embed, hidden)
            self.positions = _PositionalEncoding(hidden, max_len + 2)
            layer = nn.TransformerEncoderLayer(hidden, heads, 2 * hidden, dropout=0.0,
                                               batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.q_mu = nn.Linear(hidden, latent)
        self.q_log_sigma = nn.Linear(hidden, latent)
        zc = latent if z_input in ("concat", "both") else 0
        if decoder == "gru":
            self.decoder = nn.GRUCell(embed + zc, hidden)
            if attention != "none":
                self.score = make_score(attention, hidden, hidden)
                self.W_c = nn.Linear(hidden, hidden, bias=False)
        else:
            self.dec_in = nn.Linear(embed + zc, hidden)
            if not hasattr(self, "positions"):
                self.positions = _PositionalEncoding(hidden, max_len + 2)
            layer = nn.TransformerDecoderLayer(hidden, heads, 2 * hidden, dropout=0.0,
                                               batch_first=True)
            self.decoder = nn.TransformerDecoder(layer, layers)
            self.z_memory = nn.Linear(latent, z_slots * hidden)
        if z_input in ("init", "both"):
            self.W_init = nn.Linear(latent, hidden)
        self.W_s = nn.Linear(hidden, hidden)
        self.W_z = nn.Linear(latent, hidden, bias=False)
        self.W_o = nn.Linear(hidden, vocab)

    # --- properties --------------------------------------------------------------------------
    @property
    def generative(self) -> bool:
        """False for memory "encoder": p(x | z) then reads x itself (no bound, no samples)."""
        return self.config["memory"] == "decoder"

    @property
    def enumerate_alignment(self) -> bool:
        return self.config["attention"] != "none" and self.family.enumerable

    # --- inference network ---------------------------------------------------------------------
    def check_batch(self, batch) -> None:
        """Refuse an empty sequence or one longer than ``max_len`` with a clear error. The
        lengths are read (from the device) only while Pyro's validation is on, or when the
        padded width exceeds ``max_len``."""
        width, lengths = batch.src.shape[1], batch.src_mask.sum(-1)
        if width == 0 or (is_validation_enabled() and bool((lengths == 0).any())):
            bad = [int(i) for i in batch.index[lengths == 0]] if width else []
            raise UserError(f"empty sequence(s) at corpus index {bad}: a sequence VAE needs "
                             "at least one token")
        if width > self.config["max_len"] and int(lengths.max()) > self.config["max_len"]:
            i = int(batch.index[int(lengths.argmax())])
            raise UserError(f"sequence at corpus index {i} has {int(lengths.max())} tokens, more "
                             f"than max_len={self.config['max_len']} (truncate the data or "
                             "raise --max-len)")

    def encode(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x ``[B, L]`` → encoder states H ``[B, L, h]`` (0 on padding), μ and σ ``[B, d]``."""
        self.check_batch(batch)
        x, mask = batch.src, batch.src_mask
        emb = self.emb(x)
        if self.config["encoder"] == "gru":
            H = run_packed(self.encoder, emb, mask)
        else:
            H = self.encoder(self.positions(self.enc_in(emb)), src_key_padding_mask=~mask)
            H = H.masked_fill(~mask.unsqueeze(-1), 0.0)
        pooled = H.sum(1) / mask.sum(-1, keepdim=True).to(H.dtype)
        sigma = F.softplus(self.q_log_sigma(pooled)) + 1e-4
        return H, self.q_mu(pooled), sigma

    # --- decoder -----------------------------------------------------------------------------
    def _inputs(self, tgt_in: torch.Tensor) -> torch.Tensor:
        if self.training and self.config["word_dropout"] > 0:
            drop = torch.rand(tgt_in.shape, device=tgt_in.device) < self.config["word_dropout"]
            drop[:, 0] = False  # keep <bos>
            tgt_in = tgt_in.masked_fill(drop, 0)  # 0 = <unk> (Vocab's first special)
        return self.emb(tgt_in)

    def decoder_states(self, z: torch.Tensor, tgt_in: torch.Tensor, H=None, src_mask=None):
        """GRU decoder: states s_0..s_T ``[..., B, T+1, h]`` (z may carry sample dims on the
        left). Transformer decoder: outputs ``[..., B, T, h]``."""
        emb = self._inputs(tgt_in)
        B, T = tgt_in.shape
        lead = z.shape[:-2]
        emb = emb.expand(*lead, B, T, emb.shape[-1])
        zc = self.config["z_input"] in ("concat", "both")
        if zc:
            emb = torch.cat([emb, z.unsqueeze(-2).expand(*lead, B, T, z.shape[-1])], -1)
        if self.config["decoder"] == "transformer":
            flat = emb.reshape(-1, T, emb.shape[-1])
            if self.config["memory"] == "encoder":
                mem = H.expand(*lead, *H.shape).reshape(-1, *H.shape[1:])
                mem_mask = ~src_mask.expand(*lead, *src_mask.shape).reshape(-1, H.shape[1])
            else:
                mem = self.z_memory(z).reshape(-1, self.config["z_slots"], self.hidden)
                mem_mask = None
            causal = nn.Transformer.generate_square_subsequent_mask(T, device=flat.device,
                                                                    dtype=flat.dtype)
            out = self.decoder(self.positions(self.dec_in(flat)), mem, tgt_mask=causal,
                               tgt_is_causal=True, memory_key_padding_mask=mem_mask)
            return out.reshape(*lead, B, T, self.hidden)
        if self.config["z_input"] in ("init", "both"):
            s = torch.tanh(self.W_init(z))
        else:
            s = z.new_zeros(*lead, B, self.hidden)
        states = [s]
        flat_s = s.reshape(-1, self.hidden)
        for t in range(T):
            flat_s = self.decoder(emb[..., t, :].reshape(-1, emb.shape[-1]), flat_s)
            states.append(flat_s.reshape(*lead, B, self.hidden))
        return torch.stack(states, -2)

    def memory_and_scores(self, states, H, src_mask, T: int):
        """GRU decoder with attention: memory ``[..., B, S, h]``, scores e ``[..., B, T, S]`` and
        their mask ``[B, T, S]`` (decoder memory: position j < t is visible to output t)."""
        query = states[..., 1:, :]
        if self.config["memory"] == "decoder":
            memory = states[..., :-1, :]
            mask = torch.ones(T, T, dtype=torch.bool, device=states.device).tril()
            mask = mask.expand(states.shape[-3], T, T)
        else:
            memory = H.expand(*states.shape[:-2], *H.shape[-2:])
            mask = src_mask.unsqueeze(1).expand(src_mask.shape[0], T, src_mask.shape[1])
        return memory, self.score(query, memory), mask

    def output_logits(self, states, z, context=None):
        """logits ``[..., B, T, V]`` from decoder states (GRU: s_1..s_T), the context and z."""
        s = states[..., 1:, :] if self.config["decoder"] == "gru" else states
        pre = self.W_s(s) + self.W_z(z).unsqueeze(-2)
        if context is not None:
            pre = pre + self.W_c(context)
        return self.W_o(torch.tanh(pre))

    def token_log_likelihood(self, batch, z: torch.Tensor, H=None) -> torch.Tensor:
        """log p(x_t | x_<t, z) ``[..., B, T]`` (0 on padding), exact: the soft context, or a
        categorical alignment summed out, Σ_j p(a_t = j)·p(x_t | a_t = j). Continuous
        alignment families have no closed form here (use the ELBO)."""
        if H is None and self.config["memory"] == "encoder":
            H = self.encode(batch)[0]
        T = batch.tgt_in.shape[1]
        states = self.decoder_states(z, batch.tgt_in, H, batch.src_mask)
        y = batch.tgt_out.expand(*states.shape[:-3], *batch.tgt_out.shape)
        if self.config["decoder"] == "transformer" or self.config["attention"] == "none":
            logp = self.output_logits(states, z).log_softmax(-1)
            ll = logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)
        else:
            memory, e, mask = self.memory_and_scores(states, H, batch.src_mask, T)
            if self.family.deterministic:
                w = self.family.deterministic_weights(e, mask)
                logp = self.output_logits(states, z, w @ memory).log_softmax(-1)
                ll = logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)
            elif self.family.enumerable:
                log_prior = torch.where(mask, e, torch.full_like(e, -torch.inf)).log_softmax(-1)
                # every memory position j as the context: [..., B, T, S, V]
                s = states[..., 1:, :].unsqueeze(-2)
                pre = self.W_s(s) + self.W_z(z)[..., None, None, :] + self.W_c(memory).unsqueeze(-3)
                logp = self.W_o(torch.tanh(pre)).log_softmax(-1)
                idx = y[..., None, None].expand(*logp.shape[:-1], 1)
                emis = logp.gather(-1, idx).squeeze(-1)
                ll = (log_prior + emis).masked_fill(~mask, -torch.inf).logsumexp(-1)
            else:
                raise UserError(f"log p(x | z) has no closed form for the {self.family.name} "
                                 "alignment family; use the ELBO")
        return ll.masked_fill(~batch.tgt_mask, 0.0)

    # --- probabilistic program ---------------------------------------------------------------
    def model(self, batch, *, enumerate_z: bool = False, kl_scale: float = 1.0,
              beta: float = 1.0):
        """p(x, z, a): z ~ N(0, I) (its log-density scaled by ``beta``), alignments (if a family
        samples them; enumerated when ``enumerate_z``, scaled by ``kl_scale``), tokens observed."""
        pyro.module("seq_vae", self)
        B, T = batch.tgt_out.shape
        H = self.encode(batch)[0] if self.config["memory"] == "encoder" else None
        with pyro.plate("batch", B, dim=-2):
            with _scaled(beta):
                loc = self.W_z.weight.new_zeros(B, 1, self.latent)
                z = pyro.sample("z", dist.Normal(loc, 1.0).to_event(1)).squeeze(-2)
            plate_t = pyro.plate("target", T, dim=-1)
            if self._samples_alignment:
                states = self.decoder_states(z, batch.tgt_in, H, batch.src_mask)
                memory, e, mask = self.memory_and_scores(states, H, batch.src_mask, T)
                with plate_t:
                    with _scaled(kl_scale):
                        ctx, _ = attend("align", e, memory, self.family, mask=mask, keys=memory,
                                        target_mask=None if enumerate_z else batch.tgt_mask,
                                        infer={"enumerate": "parallel"} if enumerate_z else None)
                    logits = self.output_logits(states, z, ctx)  # enum dims broadcast
                    with poutine.mask(mask=batch.tgt_mask):
                        pyro.sample("x", dist.Categorical(logits=logits), obs=batch.tgt_out)
            else:
                ll = self.token_log_likelihood(batch, z, H)
                with plate_t:
                    pyro.factor("x", ll)

    @property
    def _samples_alignment(self) -> bool:
        return (self.config["decoder"] == "gru" and self.config["attention"] != "none"
                and not self.family.deterministic)

    def guide(self, batch, *, posterior: str = "none", enumerate_z: bool = False,
              kl_scale: float = 1.0, baseline=None, beta: float = 1.0,
              use_free_bits: bool = True):
        """q(z | x) = N(μ(x), σ(x)); with ``posterior="prior"`` also q(a | x, z) = the family's
        posterior at the decoder's own scores (BAM's choice; enumerated when ``enumerate_z``)."""
        pyro.module("seq_vae", self)
        B, T = batch.tgt_out.shape
        H, mu, sigma = self.encode(batch)
        with pyro.plate("batch", B, dim=-2):
            with _scaled(beta):
                z = pyro.sample("z", dist.Normal(mu.unsqueeze(-2), sigma.unsqueeze(-2))
                                .to_event(1)).squeeze(-2)
            fb = self.config["free_bits"] if use_free_bits else 0.0
            if fb > 0:
                # log q += Σ_d relu(λ − KL_d): the ELBO's KL term becomes Σ_d max(KL_d, λ)
                gap = (fb - kl_normal_per_dim(mu, sigma)).clamp(min=0.0).sum(-1)
                pyro.factor("free_bits", (beta * gap).unsqueeze(-1), has_rsample=True)
            if posterior == "prior" and self._samples_alignment:
                states = self.decoder_states(z, batch.tgt_in, H, batch.src_mask)
                memory, e, mask = self.memory_and_scores(states, H, batch.src_mask, T)
                infer = {"enumerate": "parallel"} if enumerate_z else {}
                if baseline is not None:
                    infer["baseline"] = {"baseline_value": baseline}
                with pyro.plate("target", T, dim=-1), _scaled(kl_scale):
                    attend("align", e, memory, self.family, mask=mask, keys=memory, guide=True,
                           target_mask=batch.tgt_mask, infer=infer or None)

    # --- training and evaluation -------------------------------------------------------------
    def step_arguments(self, step: int) -> dict:
        """β(step) of the z site's KL annealing, for model and guide at that step."""
        return {"beta": ANNEALING[self.config["kl_anneal"]](step, self.config["anneal_steps"])}

    def validation_loss(self, batches) -> float:
        """−ELBO/token at β = 1 without free bits (one draw of z)."""
        return -elbo_per_token(self, batches)

    def extra_report(self, batches, iwae_k: int = 100, seed: int = 0) -> dict:
        """Posterior-collapse diagnostics (:mod:`ppl_attention.pyro.models.seq_vae_diagnostics`)."""
        return latent_diagnostics(self, batches, iwae_k=iwae_k, seed=seed)

    # --- generation --------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, z: torch.Tensor, bos: int, eos: int, max_len: int | None = None,
                 greedy: bool = True, generator: torch.Generator | None = None,
                 forbid: tuple[int, ...] = ()) -> list[list[int]]:
        """Token ids for each z ``[N, d]`` (greedy, or ancestral sampling), decoder memory only."""
        if not self.generative:
            raise UserError("memory='encoder' reads x through its encoder states: it has no "
                             "prior samples")
        max_len = max_len or self.config["max_len"]
        N = z.shape[0]
        seqs = torch.full((N, 1), bos, dtype=torch.long, device=z.device)
        done = torch.zeros(N, dtype=torch.bool, device=z.device)
        for _ in range(max_len + 1):
            T = seqs.shape[1]
            states = self.decoder_states(z, seqs)
            if self.config["decoder"] == "gru" and self.config["attention"] != "none":
                memory, e, mask = self.memory_and_scores(states, None, None, T)
                log_prior = torch.where(mask, e, torch.full_like(e, -torch.inf)).log_softmax(-1)
                if self.family.deterministic:
                    w = self.family.deterministic_weights(e, mask)
                    logp = self.output_logits(states, z, w @ memory).log_softmax(-1)
                else:  # the exact predictive Σ_j p(a_t = j) p(x_t | a_t = j), or the mean
                    s = states[..., 1:, :].unsqueeze(-2)
                    pre = self.W_s(s) + self.W_z(z)[:, None, None] + self.W_c(memory).unsqueeze(-3)
                    logp = (log_prior.unsqueeze(-1) + self.W_o(torch.tanh(pre)).log_softmax(-1)
                            ).logsumexp(-2)
            else:
                logp = self.output_logits(states, z).log_softmax(-1)
            last = logp[:, -1].clone()
            for f in forbid:
                last[:, f] = -torch.inf
            nxt = last.argmax(-1) if greedy else categorical_draws(last.softmax(-1), 1,
                                                                   generator)[:, 0]
            nxt = torch.where(done, torch.full_like(nxt, eos), nxt)
            seqs = torch.cat([seqs, nxt.unsqueeze(1)], 1)
            done |= nxt == eos
            if bool(done.all()):
                break
        out = []
        for row in seqs[:, 1:].tolist():
            out.append(row[: row.index(eos)] if eos in row else row)
        return out
