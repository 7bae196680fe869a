"""The Bayesian aligners of the collection, one model definition for all of them: a translation
table θ whose rows are Dirichlet, an alignment prior with its own global latents, the alignment
summed out exactly. :class:`BayesianAligner` owns the table, the program and the members the
tools read; each aligner below gives only its alignment prior.

For a pair (e, f) (a pairs batch's ``src``; the target ``tgt_out``, ``<eos>`` a target word
like any other):

    θ_e ~ Dirichlet(α·1_{V_f})   one row per source word (site ``theta``, ``[V_e (+1), V_f]``;
                                 the word aligners add NULL's row last)
    a_j ~ the aligner's alignment prior (its own global sites),   f_j | a_j = i ~ Cat(θ_{e_i})

and the program is ``numpyro.factor("y", log p(f_j | f_<j, e, globals))`` with the alignment
summed out, so NUTS, HMC and the ``svi-*`` autoguides infer the globals directly.

==================  ===========================  ============================================
registry name       class                        alignment prior (its global sites)
==================  ===========================  ============================================
``word-ibm1``       :class:`IBM1WordAligner`     uniform over NULL and the source
``word-ibm2``       :class:`IBM2WordAligner`     distortion buckets δ ~ Dirichlet(γ), NULL's
                                                 last (``dist``)
``word-hmm``        :class:`HMMWordAligner`      jump buckets δ ~ Dirichlet(γ) in both
                                                 directions, NULL's last (``dist``)
``bayesian-ibm2``   :class:`BayesianIBM2`        diagonal tension λ ~ Gamma(a, b), no NULL
                                                 (``lam``)
``bayesian-hmm``    :class:`BayesianHMMAligner`  monotonic jumps π ~ Dirichlet(β) over the
                                                 family's offsets, no NULL (``jumps``)
==================  ===========================  ============================================

The word aligners (with NULL) are the models ``ppl-attention wordalign`` samples at corpus
scale; they declare ``conjugate``, so ``gibbs`` and ``vb`` run on them through
:mod:`ppl_attention.numpyro.aligners` as well. Their tables are dense here (every source
word's row over every target word): the registry's tasks have vocabularies of tens to hundreds
of words, where NUTS can run.

The alignment posterior a model reports (``exact_posterior [B, T, S]``) is over the real
source positions; with NULL the mass it lacks, 1 − Σ_i, is NULL's, and the tools link a target
word only where its best position outweighs NULL.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist

from ..aligners import AlignerSpec, batch_step
from .base import AlignmentModel

__all__ = ["BayesianAligner", "WordAligner", "IBM1WordAligner", "IBM2WordAligner",
           "HMMWordAligner", "BayesianIBM2", "BayesianHMMAligner"]


class BayesianAligner(AlignmentModel):
    """The one model definition (module docstring). A subclass sets ``null`` (a NULL row in
    the table) and gives :meth:`alignment`; ``alpha`` is the translation rows' Dirichlet
    concentration per target word."""

    null_row = False
    families = ("categorical",)
    posteriors = ("none",)
    training_defaults = {"steps": 2000, "lr": 0.02}

    def _init_table(self, src_vocab: int, tgt_vocab: int, family, alpha: float):
        self.family = family
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.alpha = alpha

    def translation_table(self):
        """θ ``[V_e (+1), V_f]`` (site ``theta``)."""
        rows = self.src_vocab + int(self.null_row)
        return numpyro.sample("theta", dist.Dirichlet(jnp.full((self.tgt_vocab,), self.alpha))
                              .expand([rows]).to_event(1))

    def alignment(self, batch, theta, mode: str):
        """``mode="score"``: log p(f_j | f_<j, e, globals) ``[B, T]``; ``"expect"``:
        p(a_j = i | e, f, globals) ``[B, T, S]`` over the real source positions. The alignment
        prior's globals are sampled here."""
        raise NotImplementedError

    def model(self, batch, *, enumerate_z=False, kl_scale=1.0):
        numpyro.factor("y", self.exact_token_log_likelihood(batch))

    def guide(self, batch, *, posterior="none", enumerate_z=False, kl_scale=1.0,
              baseline=None):
        """No alignment guide: the alignment is summed out (the globals' guides are the
        methods' autoguides)."""

    def exact_token_log_likelihood(self, batch):
        """log p(f_j | f_<j, e, globals) ``[B, T]``, 0 on padding."""
        ll = self.alignment(batch, self.translation_table(), "score")
        return jnp.where(batch.tgt_mask, ll, 0.0)

    def exact_posterior(self, batch):
        """p(a_j = i | e, f, globals) ``[B, T, S]`` over the real source positions, 0 on
        padding."""
        post = self.alignment(batch, self.translation_table(), "expect")
        return post * batch.tgt_mask[:, :, None]


class WordAligner(BayesianAligner):
    """The aligners with NULL of ``wordalign`` (module docstring). ``gamma``: the buckets'
    concentration, ``max_jump``: D. Declares ``conjugate``: the ``gibbs`` and ``vb`` methods
    read :meth:`aligner_spec`, :meth:`conjugate_data` and :meth:`latent_values` instead of the
    program."""

    aligner = "hmm"
    latents = ("theta", "dist")
    null_row = True
    conjugate = True

    def __init__(self, src_vocab: int, tgt_vocab: int, *, family, alpha: float = 1.0,
                 gamma: float = 1.0, max_jump: int = 4):
        self._init_table(src_vocab, tgt_vocab, family, alpha)
        self.gamma, self.max_jump = gamma, max_jump
        # ν = 0: this program's NULL is a row of its translation table and a bucket of its
        # jump Dirichlet (learned), so the conjugate methods' spec must say so
        self.spec = AlignerSpec(self.aligner, alpha=alpha, gamma=gamma, max_jump=max_jump,
                                null_prior=0.0)

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

    def alignment(self, batch, theta, mode):
        """The aligners' own step (:func:`~ppl_attention.numpyro.aligners.batch_step`), the
        buckets δ sampled here: for IBM1/2 the words are independent given the tables, for the
        HMM the forward pass's normalizers and its forward–backward marginals."""
        log_theta = jnp.log(theta).reshape(-1)
        if self.spec.n_buckets:
            log_dist = jnp.log(numpyro.sample(
                "dist", dist.Dirichlet(jnp.full((self.spec.n_buckets,), self.gamma))))
        else:
            log_dist = jnp.zeros((0,), log_theta.dtype)
        out = batch_step(self.spec, jax.random.PRNGKey(0), log_theta, log_dist,
                         self.aligner_batch(batch), self.table_sizes()["n_cells"], mode)
        if mode == "score":
            return out["token_loglik"]
        return jnp.swapaxes(out["probs"][:, 1:], 1, 2)  # [B, S + 1, T] → real positions


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


class BayesianIBM2(BayesianAligner):
    """IBM Model 2 with a diagonal distortion prior of continuous tension (fast_align's, Dyer
    et al. 2013) and no NULL — the registry's ``bayesian-ibm2``, a model whose global latents
    are a table and a positive scalar (where NUTS and the autoguides part ways):

        θ_e ~ Dirichlet(α·1)    one row per source word e (special tokens included)
        λ ~ Gamma(a, b)         (site ``lam``)
        p(a_t = j | λ) = softmax_j(−λ·|(t + ½)/m − (j + ½)/l|)     over the l real positions
    """

    latents = ("theta", "lam")

    def __init__(self, src_vocab: int, tgt_vocab: int, *, family, alpha: float = 1.5,
                 lam_shape: float = 2.0, lam_rate: float = 0.5):
        self._init_table(src_vocab, tgt_vocab, family, alpha)
        self.lam_prior = (lam_shape, lam_rate)

    def alignment(self, batch, theta, mode):
        lam = numpyro.sample("lam", dist.Gamma(*self.lam_prior))
        T, S = batch.tgt_out.shape[1], batch.src.shape[1]
        m = jnp.maximum(batch.tgt_mask.sum(-1, keepdims=True), 1)[:, :, None]
        n = jnp.maximum(batch.src_mask.sum(-1, keepdims=True), 1)[:, :, None]
        i = (jnp.arange(S) + 0.5)[None, None, :] / n
        t = (jnp.arange(T) + 0.5)[None, :, None] / m
        prior = jnp.where(batch.src_mask[:, None, :], -lam * jnp.abs(t - i), -jnp.inf)
        emis = _emissions(theta, batch)
        joint = jax.nn.log_softmax(prior, -1) + emis
        return jax.nn.logsumexp(joint, -1) if mode == "score" else jax.nn.softmax(joint, -1)


class BayesianHMMAligner(BayesianAligner):
    """A Bayesian HMM aligner with monotonic jumps and no NULL — the registry's
    ``bayesian-hmm`` (the jumps' posterior is what a user asks about):

        π ~ Dirichlet(β·1_W)    the jump distribution over the offsets −max_back … max_jump
                                of the ``markov-categorical`` family (site ``jumps``)
        a_1 ~ p(a_1 | π),  a_t | a_{t−1}, π ~ π_{a_t − a_{t−1}} (renormalized over the
                                positions that exist)

    The chain is summed out by
    :class:`~ppl_attention.numpyro.structured.MonotonicAlignment` (the Markov family's banded
    forward recursion). ``alpha``: the rows' concentration, ``jump_alpha``: β."""

    latents = ("theta", "jumps")
    families = ("markov-categorical",)

    def __init__(self, src_vocab: int, tgt_vocab: int, *, family, alpha: float = 1.5,
                 jump_alpha: float = 2.0):
        self._init_table(src_vocab, tgt_vocab, family, alpha)
        self.jump_alpha = jump_alpha

    def alignment(self, batch, theta, mode):
        jumps = numpyro.sample("jumps", dist.Dirichlet(jnp.full((self.family.width,),
                                                                self.jump_alpha)))
        emis = _emissions(theta, batch)
        chain = self.family.alignment_distribution(
            jnp.zeros_like(emis), batch.src_mask, emis, batch.tgt_mask,
            {"jump_logits": jnp.log(jumps)})
        return chain.token_log_likelihood() if mode == "score" else chain.marginals()


def _emissions(theta, batch):
    """log θ_{e_i}(f_t) ``[B, T, S]``: each target word under each source word's row."""
    rows = jnp.log(theta)[batch.src]  # [B, S, V_f]
    return jnp.take_along_axis(rows[:, None], batch.tgt_out[:, :, None, None], -1)[..., 0]
