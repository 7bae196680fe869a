"""A Bayesian HMM aligner: monotonic alignments whose jump distribution and translation table
are global latent variables — the registry's ``bayesian-hmm`` (a second model where MCMC
matters: the jumps' posterior is what a user asks about).

    θ_e ~ Dirichlet(α·1)                 translation table p(y | x_e), one row per source word
    π ~ Dirichlet(β·1_W)                 jump distribution over the offsets −max_back … max_jump
    z_1 ~ p(z_1 | π),  z_t | z_{t−1}, π ~ π_{z_t − z_{t−1}} (renormalized over the positions
                                          that exist)
    y_t | z_t, θ ~ Categorical(θ_{x_{z_t}})

The chain is summed out exactly by :class:`~ppl_attention.numpyro.structured.MonotonicAlignment`
(the Markov family's banded forward recursion): the model's log-density is that of (θ, π) given
the data, and NUTS, HMC or SVI with an autoguide infer them (``nuts``, …,
:mod:`ppl_attention.core.method_specs`). Its own members give the per-token likelihood and
the alignment marginals given the globals, which the tools condition on posterior draws.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist

from .base import AlignmentModel

__all__ = ["BayesianHMMAligner"]


class BayesianHMMAligner(AlignmentModel):
    """``alpha``: the translation rows' Dirichlet concentration; ``jump_alpha``: the jump
    distribution's. The family (``markov-categorical``) sets the offsets it allows."""

    latents = ("theta", "jumps")
    families = ("markov-categorical",)
    posteriors = ("none",)
    training_defaults = {"steps": 2000, "lr": 0.02}

    def __init__(self, src_vocab: int, tgt_vocab: int, *, family, alpha: float = 1.5,
                 jump_alpha: float = 2.0):
        self.family = family
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.alpha, self.jump_alpha = alpha, jump_alpha

    def chain(self, batch):
        """The alignment chain with the evidence of the targets, the globals sampled (or
        conditioned, when a tool fixes them)."""
        theta = numpyro.sample("theta", dist.Dirichlet(jnp.full((self.tgt_vocab,), self.alpha))
                               .expand([self.src_vocab]).to_event(1))
        jumps = numpyro.sample("jumps", dist.Dirichlet(jnp.full((self.family.width,),
                                                                self.jump_alpha)))
        rows = jnp.log(theta)[batch.src]  # [B, S, V_tgt]
        emis = jnp.take_along_axis(rows[:, None], batch.tgt_out[:, :, None, None], -1)[..., 0]
        B, T = batch.tgt_out.shape
        S = batch.src.shape[1]
        return self.family.alignment_distribution(
            jnp.zeros((B, T, S), emis.dtype), batch.src_mask, emis, batch.tgt_mask,
            {"jump_logits": jnp.log(jumps)})

    def model(self, batch, *, enumerate_z=False, kl_scale=1.0):
        numpyro.factor("y", self.exact_token_log_likelihood(batch))

    def guide(self, batch, *, posterior="none", enumerate_z=False, kl_scale=1.0,
              baseline=None):
        """No alignment guide: the chain is summed out exactly."""

    def exact_token_log_likelihood(self, batch):
        """log p(y_t | x, y<t, θ, π) ``[B, T]``, 0 on padding (the forward recursion)."""
        return jnp.where(batch.tgt_mask, self.chain(batch).token_log_likelihood(), 0.0)

    def exact_posterior(self, batch):
        """p(z_t = j | x, y, θ, π) ``[B, T, S]`` (forward–backward marginals)."""
        return self.chain(batch).marginals()
