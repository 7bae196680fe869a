"""Seq2SeqAlignment for NumPyro: the model of :mod:`ppl_attention.pyro.models.seq2seq` (read its
docstring for the maths), as pure JAX functions of a parameter dict keyed like the torch model's
``state_dict()``, and the same ``model``/``guide`` programs with the site ``"align"``.

``m, params = Seq2SeqAlignment.from_torch(torch_model)`` gives the twin of a trained torch model;
``m.init_params(key)`` fresh weights. The programs read their weights from
``numpyro.param("seq2seq", …)``, one pytree-valued parameter keyed like the torch
``state_dict()`` (so the weight transfer between the twins matches names as they are).

It meets the NumPyro model contract (:mod:`.base`): ``model``/``guide`` with the contract's
switches, and the capability members ``exact_token_log_likelihood(batch)`` … reading the
parameter; their pure-function forms ``exact_token_log_likelihood_of(params, batch)`` …
(``params`` the flat dict) are what those members and the benchmarks call.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro import handlers

from ...core.errors import UserError
from ...core.numerics import LOG_ZERO
from ..attend import attend
from ..families import (
    FAMILIES,
    Categorical,
    Family,
    GaussianContext,
    from_torch_family,
    make_family,
    masked_softmax,
)
from ..nn import Params, bilstm, from_torch, gates, init_linear, linear, lstm_update, sub
from ..scores import BiaffineArcScore, BilinearScore, make_score
from .base import AlignmentModel

__all__ = ["Seq2SeqAlignment", "SITE"]

SITE = "align"


def _embed(params, name, ids):
    return params[f"{name}.weight"][ids]


def _init_lstm(key, prefix, d_in, hidden, suffixes):
    p = {}
    bound = 1.0 / hidden**0.5
    for suffix in suffixes:
        for kind, shape in (("weight_ih", (4 * hidden, d_in)), ("weight_hh", (4 * hidden, hidden)),
                            ("bias_ih", (4 * hidden,)), ("bias_hh", (4 * hidden,))):
            key, k = jax.random.split(key)
            p[f"{prefix}.{kind}{suffix}"] = jax.random.uniform(k, shape, minval=-bound,
                                                               maxval=bound)
    return p


class Seq2SeqAlignment(AlignmentModel):
    """Same constructor as the torch model (``dropout`` must be 0 here: the mirror trains and
    evaluates without it)."""

    param_name = "seq2seq"  # the one pytree-valued numpyro.param of model and guide
    families = tuple(FAMILIES)

    def __init__(self, src_vocab: int, tgt_vocab: int, hidden: int = 64, embed: int | None = None,
                 score: str = "additive", family: Family | None = None, dropout: float = 0.0,
                 q_prior: bool = True, encoder_layers: int = 1):
        if hidden % 2:
            raise UserError(f"hidden must be even (a bidirectional encoder), got {hidden}")
        if dropout:
            raise UserError("--dropout: the NumPyro Seq2SeqAlignment trains without dropout; use "
                            "the pyro backend or --dropout 0")
        if encoder_layers < 0:
            raise UserError(f"encoder_layers must be at least 0, got {encoder_layers}")
        embed = embed or hidden
        if encoder_layers == 0 and embed != hidden:
            raise UserError(f"encoder_layers 0 (the attention reads the source embeddings) needs "
                            f"embed equal to hidden, got {embed} and {hidden}")
        self.config = dict(src_vocab=src_vocab, tgt_vocab=tgt_vocab, hidden=hidden, embed=embed,
                           score=score, dropout=dropout, q_prior=q_prior,
                           encoder_layers=encoder_layers)
        self.family = make_family(family, key_dim=hidden) if family is not None else Categorical()
        self.hidden, self.embed, self.q_prior = hidden, embed, q_prior
        self.score = make_score(score, hidden, hidden)
        self.q_score = BilinearScore(hidden, hidden)
        self.arc_score = BiaffineArcScore(hidden) if self.family.tree else None
        self.params: Params | None = None

    @classmethod
    def from_torch(cls, torch_model, training: bool = False) -> tuple[Seq2SeqAlignment, Params]:
        """The NumPyro twin of a torch ``Seq2SeqAlignment`` and its weights. For evaluation a
        model trained with dropout evaluates without it, as the torch model does in eval mode;
        for ``training`` a dropout is refused (the mirror has none)."""
        config = dict(torch_model.config)
        if not training:
            config["dropout"] = 0.0
        m = cls(family=from_torch_family(torch_model.family), **config)
        m.params = from_torch(torch_model.state_dict())
        return m, m.params

    def _param(self) -> Params:
        """The one parameter of the programs: the weights set by :meth:`from_torch` or
        :meth:`init_params`, else fresh ones from the seed's key."""
        return numpyro.param(self.param_name,
                             self.params if self.params is not None else self.init_params)

    def init_params(self, key) -> Params:
        c, h, e = self.config, self.hidden, self.embed
        ks = iter(jax.random.split(key, 16 + c["encoder_layers"]))
        p = {"src_emb.weight": jax.random.normal(next(ks), (c["src_vocab"], e)),
             "tgt_emb.weight": jax.random.normal(next(ks), (c["tgt_vocab"], e)),
             "q_emb.weight": jax.random.normal(next(ks), (c["tgt_vocab"], e))}
        for k in range(c["encoder_layers"]):
            p |= _init_lstm(next(ks), "encoder", e if k == 0 else h, h // 2,
                            (f"_l{k}", f"_l{k}_reverse"))
        p |= _init_lstm(next(ks), "q_encoder", e, h // 2, ("_l0", "_l0_reverse"))
        p |= _init_lstm(next(ks), "decoder", e + h, h, ("",))
        p |= {f"score.{k}": v for k, v in self.score.init(next(ks)).items()}
        p |= {f"q_score.{k}": v for k, v in self.q_score.init(next(ks)).items()}
        p |= init_linear(next(ks), "W_ch", h, h)
        p |= init_linear(next(ks), "W_cv", self.family.context_size(h), h, bias=False)
        p["W_cv.weight"] = p["W_cv.weight"].at[:, h:].set(0.0)  # tree parts: start as soft
        p |= init_linear(next(ks), "W_o", h, c["tgt_vocab"])
        p |= init_linear(next(ks), "q_scale", h, h)
        p |= {f"family.{k}": v for k, v in self.family.init(next(ks)).items()}
        if self.family.tree:
            k1, k2, k3 = jax.random.split(next(ks), 3)
            p |= {f"arc_score.{k}": v for k, v in self.arc_score.init(k1).items()}
            p |= {f"q_arc_score.{k}": v for k, v in self.arc_score.init(k2).items()}
            p |= init_linear(k3, "q_tree", h, h)
        self.params = p
        return p

    # --- deterministic network ------------------------------------------------------------
    def encode(self, params: Params, src, src_mask):
        """src ``[B, S]`` → H ``[B, S, h]`` (zero on padding): the BiLSTM's states, or with
        ``encoder_layers=0`` the source embeddings themselves."""
        emb = _embed(params, "src_emb", src)
        if self.config["encoder_layers"] == 0:
            return jnp.where(src_mask[..., None], emb, 0.0)
        return bilstm(params, "encoder", emb, src_mask, layers=self.config["encoder_layers"])

    def decode(self, params: Params, H, src_mask, tgt_in):
        """Decoder states ``[B, T, h]``, prior scores ``[B, T, S]``, soft contexts ``[B, T, h]``;
        input feeding with the prior's soft context c̄_{t−1}."""
        B = tgt_in.shape[0]
        emb = _embed(params, "tgt_emb", tgt_in)
        score_p, fam = sub(params, "score"), sub(params, "family")
        zeros = jnp.zeros((B, self.hidden), H.dtype)
        keys = self.score.project_keys(score_p, H)

        # the LSTM reads [y_{t−1} embedding; c̄_{t−1}]: the embedding's part of W_ih for every
        # step is one matmul before the scan
        W_ih = params["decoder.weight_ih"]
        E = emb.shape[-1]
        g_emb = emb @ W_ih[:, :E].T + params["decoder.bias_ih"]  # [B, T, 4h]

        def step(carry, g_t):
            h, c, ctx = carry
            h, c = lstm_update(g_t + ctx @ W_ih[:, E:].T,
                               gates(params, "hh", "", h, "decoder."), (h, c))
            e = self.score.from_projected(score_p, h[:, None], keys)[:, 0]
            ctx = (self.family.deterministic_weights(e, src_mask, fam)[:, None] @ H)[:, 0]
            return (h, c, ctx), (h, e, ctx)

        _, (hs, es, cs) = jax.lax.scan(step, (zeros, zeros, zeros), jnp.swapaxes(g_emb, 0, 1))
        return tuple(jnp.swapaxes(a, 0, 1) for a in (hs, es, cs))

    def emission_logits(self, params: Params, h, v):
        """W_o tanh(W_ch h + W_cv v) ``[..., V]`` (unnormalized), broadcasting enumeration dims
        of ``v``."""
        return linear(params, "W_o", jnp.tanh(linear(params, "W_ch", h)
                                              + linear(params, "W_cv", v)))

    def emission_log_prob(self, params: Params, h, v, y):
        """log softmax(W_o tanh(W_ch h + W_cv v))_y, broadcasting enumeration dims of ``v``."""
        logp = jax.nn.log_softmax(self.emission_logits(params, h, v), -1)
        y = jnp.broadcast_to(y, logp.shape[:-1])
        return jnp.take_along_axis(logp, y[..., None], -1)[..., 0]

    def emission_table(self, params: Params, h, H, y):
        """log p(y_t | h_t, H_j) for every t and j: h ``[B, T, h]``, H ``[B, S, h]``, y
        ``[B, T]`` → ``[B, T, S]``."""
        return self.emission_log_prob(params, h[:, :, None], H[:, None], y[..., None])

    def prior_and_emissions(self, params: Params, batch):
        """Log prior ``[B, T, S]`` and log p(y_t | h_t, H_j) for every j ``[B, T, S]``."""
        H = self.encode(params, batch.src, batch.src_mask)
        h, e, _ = self.decode(params, H, batch.src_mask, batch.tgt_in)
        log_prior = jax.nn.log_softmax(jnp.where(batch.src_mask[:, None], e, -jnp.inf), -1)
        return log_prior, self.emission_table(params, h, H, batch.tgt_out)

    @property
    def markov(self) -> bool:
        return getattr(self.family, "markov", False)

    def alignment_chain(self, params: Params, batch, method: str = "auto"):
        """The Markov family's chain with the evidence of ``batch``'s targets, a
        :class:`~ppl_attention.numpyro.structured.MonotonicAlignment` (as on the torch side)."""
        H = self.encode(params, batch.src, batch.src_mask)
        h, e, _ = self.decode(params, H, batch.src_mask, batch.tgt_in)
        emis = self.emission_table(params, h, H, batch.tgt_out)
        return self.family.alignment_distribution(e, batch.src_mask, emis, batch.tgt_mask,
                                                  sub(params, "family"), method)

    def exact_token_log_likelihood_of(self, params: Params, batch):
        """log p(y_t | x, y<t) ``[B, T]``, 0 on padding (the forward algorithm for the Markov
        family; the likelihood as it stands for a deterministic family)."""
        if self.family.deterministic:
            return self.soft_token_log_likelihood_of(params, batch)
        if self.markov:
            return self.alignment_chain(params, batch).token_log_likelihood()
        log_prior, emis = self.prior_and_emissions(params, batch)
        ll = jax.nn.logsumexp(jnp.where(batch.src_mask[:, None], log_prior + emis, -jnp.inf), -1)
        return jnp.where(batch.tgt_mask, ll, 0.0)

    def exact_posterior_of(self, params: Params, batch):
        """p(z_t = j | x, y) ``[B, T, S]``; for the Markov family the forward–backward marginals
        as ∂ log p(y | x) / ∂ log p(y_t | z_t = j) (as on the torch side)."""
        if self.markov:
            return self.alignment_chain(params, batch).marginals()
        log_prior, emis = self.prior_and_emissions(params, batch)
        return jax.nn.softmax(jnp.where(batch.src_mask[:, None], log_prior + emis, -jnp.inf), -1)

    # --- the tree families (as on the torch side) --------------------------------------------
    def tree_words(self, params: Params, H, src_mask):
        """Each source word with its parent and children weighted by the prior tree's arc
        marginals, ``[B, 1, S, 3h]``."""
        arcs = self.arc_score(sub(params, "arc_score"), H)[:, None]
        mu = self.family.tree_distribution(arcs, src_mask).marginals
        S = H.shape[1]
        mu = jnp.where(jnp.eye(S, dtype=bool), 0.0, mu)
        Hx = H[:, None]
        return jnp.concatenate([Hx, jnp.swapaxes(mu, -1, -2) @ Hx, mu @ Hx], -1)

    def mean_context(self, params: Params, H, src_mask, e):
        """The context of the mean alignment ``[B, T, d]`` (torch side: ``mean_context``)."""
        w = masked_softmax(e, src_mask[:, None])
        if self.family.tree:
            return (w[..., None, :] @ self.tree_words(params, H, src_mask))[..., 0, :]
        return self.family.deterministic_weights(e, src_mask[:, None],
                                                 sub(params, "family")) @ H

    def inference_tree_scores(self, params: Params, batch, H):
        """q's arc scores ``[B, S, S]`` (torch side: ``inference_tree_scores``)."""
        G = bilstm(params, "q_encoder", _embed(params, "q_emb", batch.tgt_out), batch.tgt_mask)
        a = jnp.where(batch.tgt_mask[:, None], self.q_score(sub(params, "q_score"), H, G),
                      LOG_ZERO)
        read = jax.nn.softmax(a, -1) @ G
        return self.arc_score(sub(params, "q_arc_score"),
                              H + jnp.tanh(linear(params, "q_tree", read)))

    def soft_token_log_likelihood_of(self, params: Params, batch):
        H = self.encode(params, batch.src, batch.src_mask)
        h, e, c = self.decode(params, H, batch.src_mask, batch.tgt_in)
        if self.family.tree:
            c = self.mean_context(params, H, batch.src_mask, e)
        return jnp.where(batch.tgt_mask, self.emission_log_prob(params, h, c, batch.tgt_out), 0.0)

    def inference_scores(self, params: Params, batch, H):
        """q's scores: BiLSTM over the whole target, bilinear with H (+ the prior's scores when
        ``q_prior``)."""
        G = bilstm(params, "q_encoder", _embed(params, "q_emb", batch.tgt_out), batch.tgt_mask)
        scores = self.q_score(sub(params, "q_score"), G, H)
        if self.q_prior:
            scores = scores + self.decode(params, H, batch.src_mask, batch.tgt_in)[1]
        return scores

    # --- decoding (the ``predictive`` capability: the torch side's members, in JAX) ---------
    def decoder_step_of(self, params: Params, H, src_mask, emb_t, state, keys):
        """One input-fed decoder step (torch side: ``decoder_step``): the new (h, c, c̄) and
        the prior scores ``[k, S]``."""
        h, c, ctx = state
        W_ih = params["decoder.weight_ih"]
        E = emb_t.shape[-1]
        g = emb_t @ W_ih[:, :E].T + ctx @ W_ih[:, E:].T + params["decoder.bias_ih"]
        h, c = lstm_update(g, gates(params, "hh", "", h, "decoder."), (h, c))
        score_p = sub(params, "score")
        e = self.score.from_projected(score_p, h[:, None], keys)[:, 0]
        w = self.family.deterministic_weights(e, src_mask, sub(params, "family"))
        return (h, c, (w[:, None] @ H)[:, 0]), e

    def start_decoding_of(self, params: Params, src, src_mask) -> dict:
        """The decoding state of one source ``src [1, S]`` (torch side: ``start_decoding``)."""
        H = self.encode(params, src, src_mask)
        zeros = jnp.zeros((H.shape[0], self.hidden), H.dtype)
        words = self.tree_words(params, H, src_mask) if self.family.tree else None
        return {"H": H, "mask": src_mask, "keys": self.score.project_keys(sub(params, "score"),
                                                                          H),
                "state": (zeros, zeros, zeros), "log_filter": None, "joint": None,
                "words": words}

    def decoding_step_of(self, params: Params, st: dict, prev):
        """log p(y_t = · | x, y<t) ``[k, V]`` for the k live hypotheses whose last tokens are
        ``prev [k]``, and the new state (torch side: ``decoding_step``): the exact predictive
        of a categorical or Markov alignment, the mean context's otherwise."""
        k = prev.shape[0]
        H = jnp.broadcast_to(st["H"], (k,) + st["H"].shape[1:])
        mask = jnp.broadcast_to(st["mask"], (k,) + st["mask"].shape[1:])
        keys = jnp.broadcast_to(st["keys"], (k,) + st["keys"].shape[1:])
        state, e = self.decoder_step_of(params, H, mask, _embed(params, "tgt_emb", prev),
                                        st["state"], keys)
        st = dict(st, state=state)
        h = state[0]
        fam = sub(params, "family")
        if self.markov:
            if st["log_filter"] is None:
                pred = self.family.start_log_probs(e, mask, fam)
            else:
                logT = self.family.transition_matrix(e, mask, fam)
                pred = jax.nn.logsumexp(st["log_filter"][:, :, None] + logT, 1)
            logits = self.emission_logits(params, h[:, None], H)  # [k, S, V]
            joint = pred[:, :, None] + jax.nn.log_softmax(logits, -1)
            st["joint"] = joint
            return jax.nn.logsumexp(joint, 1), st
        if self.family.enumerable:
            log_prior = jax.nn.log_softmax(jnp.where(mask, e, -jnp.inf), -1)
            logits = self.emission_logits(params, h[:, None], H)
            return jax.nn.logsumexp(log_prior[:, :, None] + jax.nn.log_softmax(logits, -1),
                                    1), st
        ctx = state[2]
        if self.family.tree:
            w = masked_softmax(e, mask)
            words = jnp.broadcast_to(st["words"], (k,) + st["words"].shape[1:])
            ctx = (w[:, None] @ words[:, 0])[:, 0]
        return jax.nn.log_softmax(self.emission_logits(params, h, ctx), -1), st

    @staticmethod
    def keep_hypotheses_of(st: dict, rows, tokens) -> dict:
        """Hypothesis ``rows[i]`` continued by ``tokens[i]`` becomes live hypothesis i."""
        st = dict(st, state=tuple(x[rows] for x in st["state"]))
        if st["joint"] is not None:
            picked = st["joint"][rows, :, tokens]
            st["log_filter"] = picked - jax.nn.logsumexp(picked, -1, keepdims=True)
        return st

    def start_decoding(self, src, src_mask):
        return self.start_decoding_of(self._param(), src, src_mask)

    def decoding_step(self, st, prev):
        return self.decoding_step_of(self._param(), st, prev)

    def keep_hypotheses(self, st, rows, tokens):
        return self.keep_hypotheses_of(st, rows, tokens)

    # --- the contract's capability members (parameters read as the programs read them) ------
    def exact_token_log_likelihood(self, batch):
        return self.exact_token_log_likelihood_of(self._param(), batch)

    def exact_posterior(self, batch):
        return self.exact_posterior_of(self._param(), batch)

    def soft_token_log_likelihood(self, batch):
        return self.soft_token_log_likelihood_of(self._param(), batch)

    # --- probabilistic program ------------------------------------------------------------
    def _plates(self, batch):
        B, T = batch.tgt_out.shape
        return numpyro.plate("batch", B, dim=-2), numpyro.plate("target", T, dim=-1)

    @staticmethod
    def _scale(kl_scale):
        if isinstance(kl_scale, (int, float)) and kl_scale == 1.0:
            return contextlib.nullcontext()
        return handlers.scale(scale=kl_scale)

    def model(self, batch, *, enumerate_z: bool = False, kl_scale=1.0):
        """p(y, z | x); ``enumerate_z``: parallel enumeration of the alignment."""
        p = self._param()
        H = self.encode(p, batch.src, batch.src_mask)
        h, e, _ = self.decode(p, H, batch.src_mask, batch.tgt_in)
        if self.markov:
            return self._markov_model(p, batch, H, h, e, enumerate_z)
        plate_b, plate_t = self._plates(batch)
        if self.family.tree:  # one tree per source, outside the target plate
            arcs = self.arc_score(sub(p, "arc_score"), H)[:, None]
            with plate_b, self._scale(kl_scale):
                v, _ = attend(SITE, arcs, H, self.family, mask=batch.src_mask, attention=e)
            with plate_b, plate_t:
                lp = self.emission_log_prob(p, h, v, batch.tgt_out)
                numpyro.factor("y", jnp.where(batch.tgt_mask, lp, 0.0))
            return
        with plate_b, plate_t:
            with self._scale(kl_scale):
                # enumerated: unmasked, so a padded target adds log Σ_z p(z) = 0 (torch side)
                v, _ = attend(SITE, e, H, self.family, mask=batch.src_mask, keys=H,
                              target_mask=None if enumerate_z else batch.tgt_mask,
                              params=sub(p, "family"),
                              infer={"enumerate": "parallel"} if enumerate_z else None)
            lp = self.emission_log_prob(p, h, v, batch.tgt_out)
            numpyro.factor("y", jnp.where(batch.tgt_mask, lp, 0.0))

    def _markov_model(self, p: Params, batch, H, h, e, enumerate_z: bool):
        """z_t ~ p(z_t | z_{t−1}, x, y<t) and the factor ``y`` under
        ``numpyro.contrib.control_flow.scan`` (sites ``align``/``y`` stacked over t; the torch
        side's sequential sites ``align_t`` under ``pyro.markov``). Enumerated, TraceEnum_ELBO
        runs the forward algorithm. Padded targets keep their site and a zero factor."""
        from numpyro.contrib.control_flow import scan

        B = batch.tgt_out.shape[0]
        fam = sub(p, "family")
        infer = {"enumerate": "parallel"} if enumerate_z else {}
        S = H.shape[1]

        def step(prev, xs):
            h_t, e_t, y_t, keep_t = xs
            with numpyro.plate("batch", B, dim=-1):
                logp = self.family.transition_log_probs(e_t, batch.src_mask, prev, fam)
                # the floor stands in for log 0: NumPyro's validation refuses −inf logits
                # a fresh infer dict per site: NumPyro writes each site's dim names into it
                z = numpyro.sample(SITE, dist.Categorical(logits=jnp.maximum(logp, LOG_ZERO)),
                                   infer=dict(infer))
                v = (jax.nn.one_hot(z, S, dtype=H.dtype)[..., None] * H).sum(-2)
                # an observed site, not a factor: NumPyro's scan misnames the enumeration dims
                # of a factor's log-density (numpyro 0.22)
                with handlers.mask(mask=keep_t):
                    numpyro.sample("y", dist.Categorical(logits=self.emission_logits(p, h_t, v)),
                                   obs=y_t)
            return z, None

        xs = tuple(jnp.swapaxes(a, 0, 1) for a in (h, e, batch.tgt_out, batch.tgt_mask))
        scan(step, jnp.full((B,), -1), xs)

    def guide(self, batch, *, posterior: str = "inference", enumerate_z: bool = False,
              kl_scale=1.0, baseline=None):
        """q(z | x, y): ``"inference"``, ``"prior"`` or ``"none"`` as on the torch side."""
        if posterior == "none":
            return
        p = self._param()
        H = self.encode(p, batch.src, batch.src_mask)
        if self.family.tree:
            return self._tree_guide(p, batch, H, posterior, kl_scale, baseline, enumerate_z)
        if posterior == "prior":
            scores = self.decode(p, H, batch.src_mask, batch.tgt_in)[1]
        elif posterior == "inference":
            scores = self.inference_scores(p, batch, H)
        else:
            raise UserError(f"posterior must be 'inference', 'prior' or 'none', got {posterior!r}")
        scale_arg = None
        if isinstance(self.family, GaussianContext):
            mean = masked_softmax(scores, batch.src_mask[:, None]) @ H
            scale_arg = jax.nn.softplus(linear(p, "q_scale", mean)) + 1e-4
        plate_b, plate_t = self._plates(batch)
        with plate_b, plate_t, self._scale(kl_scale):
            attend(SITE, scores, H, self.family, mask=batch.src_mask, keys=H, guide=True,
                   params=sub(p, "family"),
                   target_mask=batch.tgt_mask, scale=scale_arg,
                   infer={"enumerate": "parallel"} if enumerate_z else None)

    def _tree_guide(self, p: Params, batch, H, posterior, kl_scale, baseline,
                    enumerate_z=False):
        """q(tree | x, y) as on the torch side (enumerated when ``enumerate_z``: a sparse q)."""
        if posterior == "prior":
            arcs = self.arc_score(sub(p, "arc_score"), H)
        elif posterior == "inference":
            arcs = self.inference_tree_scores(p, batch, H)
        else:
            raise UserError(f"posterior must be 'inference', 'prior' or 'none', got {posterior!r}")
        with self._plates(batch)[0], self._scale(kl_scale):
            attend(SITE, arcs[:, None], H, self.family, mask=batch.src_mask, guide=True,
                   infer={"enumerate": "parallel"} if enumerate_z else None)
