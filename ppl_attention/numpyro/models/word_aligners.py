"""The word aligners of :mod:`ppl_attention.numpyro.aligners` as registry models — ``word-ibm1``,
``word-ibm2``, ``word-hmm`` — so that every method for global latents runs on the *same*
density: ``gibbs`` and ``vb`` through the aligners' conjugacy, ``nuts``, ``hmc`` and the
``svi-*`` autoguides through the program below (the alignment summed out exactly).

For a pair (e, f) with the NULL word e_0 put before the source (a pairs batch's ``src``; the
target ``tgt_out``, ``<eos>`` a target word like any other):

    θ_e ~ Dirichlet(α·1_{V_f})   one row per source word and NULL (site ``theta``,
                                 ``[V_e + 1, V_f]``, NULL's row last)
    δ ~ Dirichlet(γ·1_K)         the distortion (IBM2) or jump (HMM) buckets, NULL's last
                                 (site ``dist``, ``[K]``, K = 2D + 2; IBM1 has none)
    a_j ~ the aligner's alignment distribution,    f_j | a_j = i ~ Categorical(θ_{e_i})

Tables are dense here (every source word's row over every target word): the registry's tasks
have vocabularies of tens to hundreds of words, where NUTS can run. At corpus scale the same
aligners run over sparse tables from ``ppl-attention wordalign``.

The alignment posterior a model reports (``exact_posterior [B, T, S]``) is over the real
source positions; the mass it lacks, 1 − Σ_i, is NULL's, and the tools link a target word only
where its best position outweighs NULL.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist

from ..aligners import AlignerSpec, batch_step
from .base import AlignmentModel

__all__ = ["WordAligner", "IBM1WordAligner", "IBM2WordAligner", "HMMWordAligner"]


class WordAligner(AlignmentModel):
    """Base of the registry's word aligners (module docstring). ``alpha``: the translation
    rows' concentration per target word, ``gamma``: the buckets', ``max_jump``: D. Declares
    ``conjugate``: the ``gibbs`` and ``vb`` methods read :meth:`aligner_spec`,
    :meth:`conjugate_data` and :meth:`latent_values` instead of the program."""

    aligner = "hmm"
    latents = ("theta", "dist")
    families = ("categorical",)
    posteriors = ("none",)
    conjugate = True
    training_defaults = {"steps": 2000, "lr": 0.02}

    def __init__(self, src_vocab: int, tgt_vocab: int, *, family, alpha: float = 1.0,
                 gamma: float = 1.0, max_jump: int = 4):
        self.family = family
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.alpha, self.gamma, self.max_jump = alpha, gamma, max_jump
        self.spec = AlignerSpec(self.aligner, alpha=alpha, gamma=gamma, max_jump=max_jump)

    def aligner_spec(self) -> AlignerSpec:
        return self.spec

    @property
    def null(self) -> int:
        """NULL's source id: the row after the vocabulary's."""
        return self.src_vocab

    def aligner_batch(self, batch) -> dict:
        """The batch in the aligners' layout: ``src [B, S + 1]`` with NULL at position 0,
        ``src_mask``, ``tgt [B, T]``, ``tgt_mask``, and ``cell [B, S + 1, T]`` — the flat index
        e·V_f + f of each (source word, target word) into the dense table."""
        B = batch.src.shape[0]
        src = jnp.concatenate([jnp.full((B, 1), self.null, batch.src.dtype), batch.src], 1)
        src_mask = jnp.concatenate([jnp.ones((B, 1), bool), batch.src_mask], 1)
        cell = src[:, :, None] * self.tgt_vocab + batch.tgt_out[:, None, :]
        return {"src": src, "src_mask": src_mask, "tgt": batch.tgt_out,
                "tgt_mask": batch.tgt_mask, "cell": cell}

    def table_sizes(self) -> dict:
        """``n_src`` (with NULL), ``n_tgt``, ``n_cells`` of the dense table."""
        n_src = self.src_vocab + 1
        return {"n_src": n_src, "n_tgt": self.tgt_vocab, "n_cells": n_src * self.tgt_vocab}

    def conjugate_data(self, batch) -> tuple[dict, dict]:
        """(sizes, arrays) of ``batch`` as the conjugate samplers read a corpus
        (:func:`~ppl_attention.numpyro.inference.word_alignment.device_corpus`): one shape
        class of one batch, every cell of the dense table."""
        sizes = self.table_sizes()
        b = self.aligner_batch(batch)
        return sizes, {"classes": [{k: v[None] for k, v in b.items()}],
                       "cell_src": jnp.arange(sizes["n_cells"]) // sizes["n_tgt"]}

    def latent_values(self, log_theta, log_dist) -> dict:
        """The sites' values of tables drawn by the conjugate samplers: ``log_theta [..., C]``
        and ``log_dist [..., K]`` → ``{"theta": [..., V_e + 1, V_f], "dist": [..., K]}``."""
        lead = log_theta.shape[:-1]
        out = {"theta": jnp.exp(log_theta).reshape(*lead, self.src_vocab + 1, self.tgt_vocab)}
        if self.spec.n_buckets:
            out["dist"] = jnp.exp(log_dist)
        return out

    def _tables(self):
        theta = numpyro.sample("theta", dist.Dirichlet(jnp.full((self.tgt_vocab,), self.alpha))
                               .expand([self.src_vocab + 1]).to_event(1))
        log_theta = jnp.log(theta).reshape(-1)
        if not self.spec.n_buckets:
            return log_theta, jnp.zeros((0,), log_theta.dtype)
        d = numpyro.sample("dist", dist.Dirichlet(jnp.full((self.spec.n_buckets,),
                                                           self.gamma)))
        return log_theta, jnp.log(d)

    def _step(self, batch, mode):
        log_theta, log_dist = self._tables()
        return batch_step(self.spec, jax.random.PRNGKey(0), log_theta, log_dist,
                          self.aligner_batch(batch), self.table_sizes()["n_cells"], mode)

    def model(self, batch, *, enumerate_z=False, kl_scale=1.0):
        numpyro.factor("y", self.exact_token_log_likelihood(batch))

    def guide(self, batch, *, posterior="none", enumerate_z=False, kl_scale=1.0,
              baseline=None):
        """No alignment guide: the alignment is summed out (the globals' guides are the
        methods' autoguides)."""

    def exact_token_log_likelihood(self, batch):
        """log p(f_j | f_<j, e, θ, δ) ``[B, T]``, 0 on padding (for IBM1/2 the words are
        independent given the tables; for the HMM the forward pass's normalizers)."""
        return self._step(batch, "score")["token_loglik"]

    def exact_posterior(self, batch):
        """p(a_j = i | e, f, θ, δ) ``[B, T, S]`` over the real source positions (NULL has the
        rest), 0 on padding."""
        probs = self._step(batch, "expect")["probs"]  # [B, S + 1, T]
        return jnp.swapaxes(probs[:, 1:], 1, 2) * batch.tgt_mask[:, :, None]


class IBM1WordAligner(WordAligner):
    """Bayesian IBM Model 1 with NULL: p(a_j = i) = 1 / (S + 1)."""

    aligner = "ibm1"
    latents = ("theta",)


class IBM2WordAligner(WordAligner):
    """Bayesian IBM Model 2 with NULL: p(a_j = i) ∝ δ_{b(i, j)}, the bucket of the
    displacement from the diagonal (clipped to [−D, D]) or NULL's."""

    aligner = "ibm2"


class HMMWordAligner(WordAligner):
    """HMM aligner with NULL and jumps in both directions: p(a_j = i | a_{j−1}) ∝ φ_{b(i − m)},
    m the last real position aligned before j."""

    aligner = "hmm"
