"""Word aligners at corpus scale in JAX: Bayesian IBM Model 1, IBM Model 2 and an HMM aligner,
each with a NULL word, over the sparse tables of :mod:`ppl_attention.data.indexed` — the
conditionals the ``gibbs`` kernel draws from and the expectations ``vb`` takes.

The models (f_j the target words, e_i the source words, e_0 = NULL):

    θ_e ~ Dirichlet(α·1_{V_f})              translation table, one row per source word and NULL
    IBM1:  p(a_j = i) = 1 / (S + 1)         i = 0 (NULL), 1 … S
    IBM2:  p(a_j = i) ∝ δ_{b(i, j)}         δ ~ Dirichlet(γ·1): NULL bucket, and the
           displacement i − 1 − ⌊(j + ½)·S/T⌋ from the diagonal, clipped to [−D, D]
    HMM:   p(a_j = i | a_{j−1}) ∝ φ_{b(i − m)}   φ ~ Dirichlet(γ·1): NULL bucket, and the jump
           from m, the last real position aligned before j (−1 at the start: the NULL state
           remembers it, as in Och & Ney 2003 and eflomal), clipped to [−D, D] — jumps in
           both directions
    f_j | a_j = i ~ Categorical(θ_{e_i})

The distortion and jump factors are those of Vogel, Ney & Tillmann (1996) without the
per-sentence normalization (deficient, as eflomal's and IBM Models 3–5 are): the weight of an
alignment is the product of the bucket weights it uses, so the conditional of δ and φ given the
alignments is exactly the Dirichlet of their counts — the blocked Gibbs sampler and mean-field
VB below are exact for the density they share with the NumPyro programs that NUTS runs
(:mod:`ppl_attention.numpyro.models.word_aligners`).

Tables: ``log_theta [C]`` over the corpus's cells (co-occurring word pairs); the rest of each row
holds the prior's mass only, drawn as one Gamma((V_f − k_e)·α) (the sum of independent
Gammas of equal rate). ``log_dist [K]``: the buckets, ``K = 2D + 2`` (displacements −D … D,
then NULL). A batch is a dict of ``src [B, S1]``, ``src_mask``, ``tgt [B, T]``, ``tgt_mask``,
``cell [B, S1, T]``; alignments are indices into the S1 axis (0 = NULL, −1 on padding).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.special import digamma, gammaln

from ..core.errors import UserError
from ..core.numerics import LOG_ZERO
from ..data.aligner_tables import (
    ALIGNER_DEFAULTS,
    ALIGNER_KINDS,
    ALIGNERS,
    MAX_FERTILITY,
    AlignerKind,
    default_null_prior,
    n_buckets,
)
from ..structures import jax_ops
from ..structures.linear_chain import chain_forward
from ..structures.semirings import PROB

__all__ = ["ALIGNERS", "AlignerSpec", "aligner", "log_gamma_draws", "sample_translation",
           "expected_log_translation",
           "translation_kl", "sample_buckets", "expected_log_buckets", "bucket_kl",
           "batch_step", "uniform_tables", "TablePrior", "posterior_mean_log_translation",
           "posterior_mean_log_buckets", "fertility_counts", "sample_fertility", "ALIGNER_KINDS",
           "expected_log_fertility", "posterior_mean_log_fertility", "fertility_kl",
           "LOG_PAST_F"]

NEG = LOG_ZERO


@dataclass(frozen=True)
class AlignerSpec:
    """``model``: ibm1, ibm2, hmm or fertility (what each is and does: ``kind``, declared in
    :data:`~ppl_attention.data.aligner_tables.ALIGNER_KINDS`); ``alpha``: the translation
    rows' Dirichlet concentration (per target word); ``gamma``: the buckets'; ``max_jump``: D;
    ``beta``: the fertility rows' (fertility only); ``max_fertility``: F, the most links a
    source position takes (fertility only); ``null_prior``: NULL's weight ν — 0: learned, the
    NULL bucket one of the buckets' Dirichlet; ν > 0: fixed, as eflomal's ``null_prior``
    (Östling & Tiedemann 2016), a target word's NULL link weighted ν · θ_NULL(f_j) against a
    real link's θ_{e_i}(f_j) · δ(jump), the real buckets a Dirichlet of their own — the
    alignment weights are then a Gibbs distribution rather than normalized, and ``loglik`` is
    log Σ_a w(a) (aligners with a NULL bucket: IBM2, HMM, fertility). The defaults are
    :data:`~ppl_attention.data.aligner_tables.ALIGNER_DEFAULTS`'s, ``wordalign``'s too; ν
    not given (None) is :func:`~ppl_attention.data.aligner_tables.default_null_prior`'s
    (eflomal's 0.2 with a NULL bucket, 0 for IBM1)."""

    model: str
    alpha: float = ALIGNER_DEFAULTS["alpha"]
    gamma: float = ALIGNER_DEFAULTS["gamma"]
    max_jump: int = ALIGNER_DEFAULTS["max_jump"]
    beta: float = 1.0
    max_fertility: int = MAX_FERTILITY
    null_prior: float | None = None

    def __post_init__(self):
        if self.model not in ALIGNERS:
            raise UserError(f"unknown aligner {self.model!r}; valid: {', '.join(ALIGNERS)}")
        if self.null_prior is None:
            object.__setattr__(self, "null_prior", default_null_prior(self.model))
        if not self.alpha > 0 or not self.gamma > 0 or not self.beta > 0:
            raise UserError(f"alpha, gamma and beta must be > 0, got {self.alpha}, "
                            f"{self.gamma}, {self.beta}")
        if not isinstance(self.max_jump, int) or self.max_jump < 1:
            raise UserError(f"max_jump must be an int ≥ 1, got {self.max_jump!r}")
        if not isinstance(self.max_fertility, int) or self.max_fertility < 1:
            raise UserError(f"max_fertility must be an int ≥ 1, got {self.max_fertility!r}")
        if isinstance(self.null_prior, bool) or not isinstance(self.null_prior, (int, float)) \
                or not (math.isfinite(self.null_prior) and self.null_prior >= 0):
            raise UserError(f"null_prior must be a number ≥ 0 (0: learned), got "
                            f"{self.null_prior!r}")
        if self.null_prior and self.kind.buckets == "none":
            raise UserError(f"null_prior {self.null_prior}: {self.model} has no NULL bucket "
                            f"(its NULL is one more source position); give 0")

    @property
    def kind(self) -> AlignerKind:
        return ALIGNER_KINDS[self.model]

    @property
    def n_fertility(self) -> int:
        """Columns of the fertility table: fertilities 0 … F (none without fertilities)."""
        return self.max_fertility + 1 if self.kind.fertility else 0

    @property
    def n_buckets(self) -> int:
        return n_buckets(self.model, self.max_jump)

    @property
    def null_bucket(self) -> int:
        return 2 * self.max_jump + 1


def aligner(model: str, **options) -> AlignerSpec:
    return AlignerSpec(model, **options)


# --- tables ------------------------------------------------------------------------------------

def _segment_logsumexp(x, seg, n):
    m = jax.ops.segment_max(x, seg, num_segments=n)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    return m + jnp.log(jax.ops.segment_sum(jnp.exp(x - m[seg]), seg, num_segments=n))


def uniform_tables(spec: AlignerSpec, corpus_arrays: dict):
    """Tables to start from: every cell of a row equal, the buckets uniform (NULL's at its
    fixed weight where ``spec.null_prior`` fixes it). One compiled program (its eager
    operations on a 100k-pair corpus's cells took a second)."""
    return _uniform_tables(spec, corpus_arrays["cell_src"], int(corpus_arrays["n_src"]))


@functools.partial(jax.jit, static_argnums=(0, 2))
def _uniform_tables(spec: AlignerSpec, cell_src, n_src: int):
    k = jnp.bincount(cell_src, length=n_src)
    log_theta = -jnp.log(jnp.maximum(k, 1))[cell_src]
    n = spec.n_buckets - (1 if spec.null_prior else 0)
    log_dist = _with_null(spec, jnp.full((n,), -jnp.log(max(n, 1)), jnp.float32))
    return log_theta.astype(jnp.float32), log_dist.astype(jnp.float32)


def log_gamma_draws(key, shape_param, capacity: int | None = None):
    """log G, G ~ Gamma(a, 1) elementwise, exactly: Marsaglia & Tsang's (2000) squeeze for
    a ≥ 1 and its boost log G(a) = log G(a + 1) + log U / a for a < 1. Every element proposes
    once; then the rejected ones (≤ 5 %) are gathered into ``capacity`` slots (default: a
    sixteenth of the elements; more rounds of gathering if more were rejected) and propose
    again until each is accepted — a round costs its slots, not the whole array, where
    ``jax.random.gamma`` loops per element (50× slower on a CPU over a million cells).
    Each element's value is its first accepted proposal, each proposal drawn afresh: the
    draws are exact whatever the capacity."""
    a = jnp.asarray(shape_param)
    a = a if jnp.issubdtype(a.dtype, jnp.floating) else a.astype(jnp.float32)
    shape, flat = a.shape, a.ravel()
    n = flat.size
    if n == 0:
        return flat.reshape(shape)
    boost = flat < 1
    a1 = jnp.where(boost, flat + 1, flat)
    d = a1 - 1.0 / 3.0
    c = 1.0 / jnp.sqrt(9.0 * d)
    tiny = jnp.finfo(flat.dtype).tiny

    def propose(k, d, c):  # (accepted, log G) of one proposal per element
        k1, k2 = jax.random.split(k)
        x = jax.random.normal(k1, d.shape, d.dtype)
        v = (1.0 + c * x) ** 3
        u = jax.random.uniform(k2, d.shape, d.dtype, minval=tiny)
        log_v = jnp.log(jnp.maximum(v, tiny))
        ok = (v > 0) & (jnp.log(u) < 0.5 * x * x + d - d * v + d * log_v)
        return ok, jnp.log(d) + log_v

    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int)
                                 or capacity < 1):
        raise UserError(f"log_gamma_draws: capacity must be an int ≥ 1, got {capacity!r}")
    key, k0, k3 = jax.random.split(key, 3)
    done, out = propose(k0, d, c)
    slots = min(n, max(1, n // 16) if capacity is None else capacity)

    def not_all(state):
        return ~jnp.all(state[1])

    def redraw(state):  # up to `slots` rejected elements, proposing until each is accepted
        key, done, out = state
        key, k = jax.random.split(key)
        idx = jnp.nonzero(~done, size=slots, fill_value=n)[0]  # n: an empty slot
        at = jnp.minimum(idx, n - 1)
        d_s, c_s = d[at], c[at]

        def again(s):
            k, ok_s, val_s = s
            k, kk = jax.random.split(k)
            ok, val = propose(kk, d_s, c_s)
            return k, ok_s | ok, jnp.where(ok & ~ok_s, val, val_s)

        _, _, val = jax.lax.while_loop(not_all, again, (k, idx >= n, jnp.zeros_like(d_s)))
        return (key, done.at[idx].set(True, mode="drop"),
                out.at[idx].set(val, mode="drop"))

    _, _, out = jax.lax.while_loop(not_all, redraw, (key, done, out))
    u = jax.random.uniform(k3, flat.shape, flat.dtype, minval=tiny)
    return jnp.where(boost, out + jnp.log(u) / flat, out).reshape(shape)


class TablePrior(NamedTuple):
    """Pseudo-counts added to the Dirichlet priors — tables trained on other text
    (``wordalign --load``) or an eflomal priors file (``--priors``): ``cells [C]`` each cell's,
    ``rows [n_src]`` each row's total over *all* its pseudo-counts (those outside the corpus's
    cells included, so a row keeps the mass it had), ``buckets [K]`` the buckets'. The prior
    becomes θ_e ~ Dirichlet(α + p_e), δ ~ Dirichlet(γ + p_δ); a pair (e, f) with no pseudo-count
    (an unseen word) keeps α; ``fertility [n_src, F + 1]`` the fertility rows' (ψ_e ~
    Dirichlet(β + p_e); no columns for a model without fertilities)."""

    cells: jax.Array
    rows: jax.Array
    buckets: jax.Array
    fertility: jax.Array | None = None


def _prior_parts(prior, counts, cell_src, n_src):
    """(cell pseudo-counts [C], row pseudo-count totals [n_src]) — zeros without a prior."""
    if prior is None:
        return jnp.zeros_like(counts), jnp.zeros(n_src, counts.dtype)
    return prior.cells.astype(counts.dtype), prior.rows.astype(counts.dtype)


def sample_translation(key, spec, counts, cell_src, n_src: int, n_tgt: int, prior=None):
    """log θ_c of a draw of every row's Dirichlet(α + p + counts) posterior, sparse: ``counts
    [C]`` the links of each cell, ``prior`` a :class:`TablePrior` (or None: p = 0); the row's
    entries beyond its k_e cells drawn as one Gamma((V_f − k_e)·α + p_e − Σ_c∈e p_c) (a sum of
    independent Gammas of one rate is one Gamma)."""
    k1, k2 = jax.random.split(key)
    pc, pr = _prior_parts(prior, counts, cell_src, n_src)
    log_g = log_gamma_draws(k1, spec.alpha + pc + counts)
    k_e = jnp.bincount(cell_src, length=n_src)
    outside = jnp.maximum(pr - jax.ops.segment_sum(pc, cell_src, num_segments=n_src), 0.0)
    rest_shape = (n_tgt - k_e) * spec.alpha + outside
    has_rest = rest_shape > 0
    log_rest = jnp.where(has_rest, log_gamma_draws(k2, jnp.maximum(rest_shape, 1e-30).astype(
        log_g.dtype)), NEG)
    row = _segment_logsumexp(log_g, cell_src, n_src)
    log_z = jnp.logaddexp(row, log_rest)
    return log_g - log_z[cell_src]


def expected_log_translation(spec, counts, cell_src, n_src: int, n_tgt: int, prior=None):
    """E_q[log θ_c] under q(θ_e) = Dirichlet(α + p_e + n̄_e): ψ(α + p_c + n̄_c) − ψ(V_f·α + p_e
    + Σ_c∈e n̄_c), p the ``prior``'s pseudo-counts (0 without one)."""
    pc, pr = _prior_parts(prior, counts, cell_src, n_src)
    total = jax.ops.segment_sum(counts, cell_src, num_segments=n_src)
    return digamma(spec.alpha + pc + counts) - digamma(n_tgt * spec.alpha + pr + total)[cell_src]


def posterior_mean_log_translation(spec, counts, cell_src, n_src: int, n_tgt: int,
                                   prior=None):
    """log E[θ_c] = log (α + p_c + n_c) − log (V_f·α + p_e + n_e) of the rows' Dirichlet
    posteriors given the cells' (expected) counts ``[C]``."""
    pc, pr = _prior_parts(prior, counts, cell_src, n_src)
    total = jax.ops.segment_sum(counts, cell_src, num_segments=n_src)
    return jnp.log(spec.alpha + pc + counts) - jnp.log(n_tgt * spec.alpha + pr + total)[cell_src]


def translation_kl(spec, counts, cell_src, n_src: int, n_tgt: int, prior=None):
    """Σ_e KL(Dirichlet(α + p_e + n̄_e) ‖ Dirichlet(α + p_e)) over the rows; the entries outside
    the cells have n̄ = 0 and contribute nothing."""
    a = spec.alpha
    pc, pr = _prior_parts(prior, counts, cell_src, n_src)
    total = jax.ops.segment_sum(counts, cell_src, num_segments=n_src)
    a0 = n_tgt * a + pr
    psi_tot = digamma(a0 + total)
    per_row = gammaln(a0 + total) - gammaln(a0)
    per_cell = -(gammaln(a + pc + counts) - gammaln(a + pc)) + counts * (
        digamma(a + pc + counts) - psi_tot[cell_src])
    return per_row.sum() + per_cell.sum()


def _bucket_prior(spec, counts, prior):
    return spec.gamma + (0.0 if prior is None else prior.buckets.astype(counts.dtype))


def _learned(spec, x):
    """The buckets the Dirichlet covers: all of them, or — NULL's weight fixed
    (``spec.null_prior``) — the real ones (NULL's bucket, the last, left out)."""
    return x[..., :-1] if spec.null_prior else x


def _with_null(spec, log_real):
    """log δ over every bucket from the Dirichlet's buckets: NULL's fixed log ν appended
    where ``spec.null_prior`` fixes it."""
    if not spec.null_prior:
        return log_real
    return jnp.concatenate([log_real, jnp.full(log_real.shape[:-1] + (1,),
                                               math.log(spec.null_prior), log_real.dtype)], -1)


def sample_buckets(key, spec, counts, prior=None):
    """log δ of a draw of Dirichlet(γ + p_δ + counts) (over the real buckets, NULL's fixed,
    where ``spec.null_prior`` fixes it)."""
    if spec.n_buckets == 0:
        return jnp.zeros((0,), jnp.float32)
    a = _learned(spec, _bucket_prior(spec, counts, prior) + counts)
    return _with_null(spec, jnp.log(jax.random.dirichlet(key, a, dtype=a.dtype)))


def expected_log_buckets(spec, counts, prior=None):
    if spec.n_buckets == 0:
        return jnp.zeros((0,), jnp.float32)
    a = _learned(spec, _bucket_prior(spec, counts, prior) + counts)
    return _with_null(spec, digamma(a) - digamma(a.sum()))


def posterior_mean_log_buckets(spec, counts, prior=None):
    if spec.n_buckets == 0:
        return jnp.zeros((0,), jnp.float32)
    a = _learned(spec, _bucket_prior(spec, counts, prior) + counts)
    return _with_null(spec, jnp.log(a) - jnp.log(a.sum()))


def bucket_kl(spec, counts, prior=None):
    """KL(Dirichlet(γ + p_δ + counts) ‖ Dirichlet(γ + p_δ)) (over the real buckets where
    ``spec.null_prior`` fixes NULL's weight)."""
    if spec.n_buckets == 0:
        return 0.0
    a0 = _learned(spec, _bucket_prior(spec, counts, prior) * jnp.ones_like(counts))
    return _dirichlet_kl(a0, _learned(spec, counts))


def _dirichlet_kl(a0, counts):
    """Σ over the rows (the last axis a row) of KL(Dirichlet(a0 + counts) ‖ Dirichlet(a0))."""
    a = a0 + counts
    return (gammaln(a.sum(-1)) - gammaln(a0.sum(-1)) - (gammaln(a) - gammaln(a0)).sum(-1)
            + (counts * (digamma(a) - digamma(a.sum(-1, keepdims=True)))).sum(-1)).sum()


# --- one batch: IBM1 / IBM2 -------------------------------------------------------------------

def _emission(log_theta, b):
    """log θ(f_j | e_i) ``[B, S1, T]``, −∞ off the real cells."""
    real = b["src_mask"][:, :, None] & b["tgt_mask"][:, None, :]
    return jnp.where(real, log_theta[b["cell"]], NEG)


def _displacement_bucket(spec, b):
    """IBM2's bucket of each (i, j) ``[B, S1, T]``: NULL at i = 0."""
    S = b["src_mask"].sum(-1)[:, None, None] - 1
    T = b["tgt_mask"].sum(-1)[:, None, None]
    S1, Tp = b["src"].shape[1], b["tgt"].shape[1]
    i = jnp.arange(S1)[None, :, None] - 1
    j = jnp.arange(Tp)[None, None, :]
    diag = jnp.floor((j + 0.5) * S / jnp.maximum(T, 1)).astype(jnp.int32)
    d = jnp.clip(i - diag, -spec.max_jump, spec.max_jump) + spec.max_jump
    return jnp.where(i < 0, spec.null_bucket, d)


def _position_logits(spec, log_theta, log_dist, b):
    logits = _emission(log_theta, b)
    if spec.kind.buckets == "none":
        S1 = b["src_mask"].sum(-1)[:, None, None]
        return logits - jnp.log(S1.astype(logits.dtype))
    return logits + log_dist[_displacement_bucket(spec, b)]


#: the longest axis whose prefix sums :func:`_prefix_sums` takes by a triangular matmul
PREFIX_MATMUL_MAX = 256


def _prefix_sums(x, axis):
    """Inclusive prefix sums of ``x`` along ``axis``: for an axis of n ≤
    :data:`PREFIX_MATMUL_MAX`, the product with the upper-triangular ones ``[n, n]`` (one dense
    matmul, in full float32 precision on every device; XLA's CPU cumulative sum is a
    reduce-window of n steps, several times slower on the short axes of sentences), else
    ``jnp.cumsum``."""
    n = x.shape[axis]
    if n > PREFIX_MATMUL_MAX:
        return jnp.cumsum(x, axis)
    tri = jnp.triu(jnp.ones((n, n), x.dtype))
    out = jnp.tensordot(x, tri, axes=((axis,), (0,)), precision=jax.lax.Precision.HIGHEST)
    return jnp.moveaxis(out, -1, axis)


def _inverse_cdf(key, probs, axis):
    """One categorical draw per slice of ``probs`` along ``axis`` from one uniform each (the
    inverse CDF: far fewer random numbers than Gumbel noise on every entry)."""
    cum = _prefix_sums(probs, axis)
    total = jnp.take(cum, -1, axis)
    u = jax.random.uniform(key, total.shape, total.dtype) * total
    return jnp.sum(cum < jnp.expand_dims(u, axis), axis, dtype=jnp.int32).clip(
        0, probs.shape[axis] - 1)


def _counts(totals, name, size, dtype):
    """The running total ``totals[name]`` that a batch's counts are scattered into (the sweep's
    loop carry, updated in place), else zeros ``[size]`` (the batch's counts alone)."""
    if totals is not None and name in totals:
        return totals[name]
    return jnp.zeros(size, dtype)


def _independent_step(spec, key, log_theta, log_dist, b, n_cells, mode, totals=None):
    logits = _position_logits(spec, log_theta, log_dist, b)
    tm = b["tgt_mask"]
    log_z = jax.nn.logsumexp(logits, 1)  # [B, T]
    real = b["src_mask"][:, :, None] & tm[:, None, :]
    probs = jnp.where(real, jnp.exp(logits - jnp.where(tm, log_z, 0.0)[:, None]), 0.0)
    token = jnp.where(tm, log_z, 0.0)
    out = {"probs": probs, "loglik": token.sum(), "token_loglik": token}
    if mode == "score":
        return out
    bucket = _displacement_bucket(spec, b) if spec.n_buckets else None
    if mode in ("draw", "both"):
        a = _inverse_cdf(key, probs, 1)  # [B, T]
        cells = jnp.take_along_axis(b["cell"], a[:, None, :], 1)[:, 0]
        w = tm.astype(probs.dtype)
        out["align"] = jnp.where(tm, a, -1)
        out["drawn_cells"] = _counts(totals, "drawn_cells", n_cells, w.dtype).at[
            cells.ravel()].add(w.ravel())
        if spec.n_buckets:
            bd = jnp.take_along_axis(bucket, a[:, None, :], 1)[:, 0]
            out["drawn_buckets"] = jnp.zeros(spec.n_buckets, w.dtype).at[bd.ravel()].add(
                w.ravel())
    if mode in ("expect", "both"):
        out["expected_cells"] = _counts(totals, "expected_cells", n_cells, probs.dtype).at[
            b["cell"].ravel()].add((probs * (b["src_mask"][:, :, None] & tm[:, None, :])).ravel())
        if spec.n_buckets:
            out["expected_buckets"] = jnp.zeros(spec.n_buckets, probs.dtype).at[
                bucket.ravel()].add(
                (probs * tm[:, None, :]).ravel())
    return out


# --- one batch: the HMM -------------------------------------------------------------------------

def _jump_bucket(spec, to_pos, from_pos):
    """The bucket of the jump from real position ``from_pos`` (−1: the start) to ``to_pos``:
    to_pos − from_pos clipped to [−D, D], shifted to 0 … 2D."""
    return jnp.clip(to_pos - from_pos, -spec.max_jump, spec.max_jump) + spec.max_jump


def _jump_weights(spec, log_dist, S: int):
    """W[m, k] = φ_{b(k − (m − 1))}: from memory index m (0: the start, m: real position m − 1)
    to real position k ``[S + 1, S]`` (probabilities), and the bucket of each entry."""
    m = jnp.arange(S + 1)[:, None] - 1
    k = jnp.arange(S)[None, :]
    bucket = _jump_bucket(spec, k, m)
    return jnp.exp(log_dist[bucket]), bucket


def _hmm_forward(spec, log_theta, log_dist, b):
    """The scaled forward pass over (state, memory) — the structure library's chain recursion
    (:func:`~ppl_attention.structures.linear_chain.chain_forward`) in the probability semiring,
    the state the memory m (0: the start, m: real position m − 1) and one step per target word:

        β_j = (E_j[NULL] φ_null) β_{j−1} + pad(E_j[real] ⊙ (β_{j−1} W)),   normalized by c_j.

    Returns per step j the normalized real-state weights ``a_real [T, B, S]``, NULL-state
    weights ``a_null [T, B, S+1]`` (by memory), the memory distribution before the step ``prev
    [T, B, S+1]``, the normalizers ``c`` and log Z ``[B]``."""
    le = _emission(log_theta, b)  # [B, S1, T]
    shift = jnp.max(le, 1)  # [B, T]
    shift = jnp.where(shift > NEG / 2, shift, 0.0)
    E = jnp.exp(le - shift[:, None])  # [B, S1, T]
    B, S1, T = E.shape
    S = S1 - 1
    W, _ = _jump_weights(spec, log_dist, S)
    phi_null = jnp.exp(log_dist[spec.null_bucket])
    start = jnp.zeros((B, S + 1), E.dtype).at[:, 0].set(1.0)

    def contract(beta, E_j, key):  # [B, S+1], [B, S1]
        a_real = E_j[:, 1:] * (beta @ W)
        return (E_j[:, 0] * phi_null)[:, None] * beta + jnp.pad(a_real, ((0, 0), (1, 0)))

    E_t = jnp.moveaxis(E, 2, 0)  # [T, B, S1]
    real = b["tgt_mask"].T
    final, (after, c) = chain_forward(jax_ops, PROB, start, (E_t,), real, contract,
                                      normalize=True)
    ok = real & (c > 0)
    c = jnp.where(ok, c, 1.0)
    ll = jnp.where(ok, jnp.log(c) + shift.T, 0.0)
    prev = jnp.concatenate([start[None], after[:-1]], 0)  # the memory before step j
    a_real = E_t[..., 1:] * (prev @ W) / c[..., None]
    a_null = (E_t[..., 0] * phi_null)[..., None] * prev / c[..., None]
    return {"a_real": a_real, "a_null": a_null, "prev": prev, "final": final, "c": c,
            "log_z": ll.sum(0), "token_loglik": ll.T, "W": W, "E": E}


def _hmm_backward_marginals(spec, fw, b, log_dist):
    """Link marginals ``[B, S1, T]`` and expected bucket counts ``[K]`` (forward–backward, the
    backward messages scaled by the forward pass's normalizers c_j, so that forward × backward
    is the posterior)."""
    W = fw["W"]
    S = W.shape[1]
    phi_null = jnp.exp(log_dist[spec.null_bucket])
    _, bucket = _jump_weights(spec, log_dist, S)
    E_t = jnp.moveaxis(fw["E"], 2, 0)  # [T, B, S1]

    def step(bwd, xs):  # bwd: [B, S+1], over the memory after step j
        a_real, a_null, prev, E_j, c_j, real_j = xs
        post_real = a_real * bwd[:, 1:]  # real position k at j
        post_null = a_null * bwd  # NULL at j, remembering m
        z = post_real.sum(-1) + post_null.sum(-1)
        z = jnp.where(real_j & (z > 0), z, 1.0)
        post_real, post_null = post_real / z[:, None], post_null / z[:, None]
        r = E_j[:, 1:] * bwd[:, 1:]  # [B, S]
        xi = prev[:, :, None] * W[None] * (r / (c_j * z)[:, None])[:, None, :]  # [B, S+1, S]
        xi = jnp.where(real_j[:, None, None], xi, 0.0)
        jumps = jnp.zeros(2 * spec.max_jump + 1, xi.dtype).at[bucket.ravel()].add(
            xi.sum(0).ravel())
        nulls = jnp.where(real_j, post_null.sum(-1), 0.0).sum()
        before = (r @ W.T + (E_j[:, 0] * phi_null)[:, None] * bwd) / c_j[:, None]
        new = jnp.where(real_j[:, None], before, bwd)
        marg = jnp.concatenate([post_null.sum(-1, keepdims=True), post_real], -1)
        return new, (jnp.where(real_j[:, None], marg, 0.0), jumps, nulls)

    B = b["tgt"].shape[0]
    _, (marg, jumps, nulls) = jax.lax.scan(
        step, jnp.ones((B, S + 1), fw["E"].dtype),
        (fw["a_real"], fw["a_null"], fw["prev"], E_t, fw["c"], b["tgt_mask"].T), reverse=True)
    buckets = jnp.concatenate([jumps.sum(0), nulls.sum()[None]])
    return jnp.moveaxis(marg, 0, 2), buckets  # [B, S1, T]


def _hmm_sample(spec, key, fw, b, log_dist):
    """Backward sampling: alignments ``[B, T]`` (S1 indices, −1 on padding) and the drawn
    bucket counts ``[K]``."""
    W = fw["W"]
    S = W.shape[1]
    B = b["tgt"].shape[0]
    k0, key = jax.random.split(key)
    m = _inverse_cdf(k0, fw["final"], -1)
    keys = jax.random.split(key, fw["a_real"].shape[0])
    rows = jnp.arange(B)
    _, bucket = _jump_weights(spec, log_dist, S)

    def step(m, xs):
        a_real, a_null, prev, real_j, kk = xs
        k1, k2 = jax.random.split(kk)
        p_real = jnp.where(m >= 1, a_real[rows, jnp.maximum(m - 1, 0)], 0.0)
        p_null = a_null[rows, m]
        is_real = jax.random.uniform(k1, (B,), p_real.dtype) * (p_real + p_null) < p_real
        k = m - 1  # the real position when real
        m_before = jnp.where(is_real, _inverse_cdf(k2, prev * W[:, jnp.maximum(k, 0)].T, -1), m)
        a = jnp.where(is_real, m, 0)  # S1 index: real position k is column k + 1 = m
        jb = bucket[m_before, jnp.maximum(k, 0)]
        jb = jnp.where(is_real, jb, spec.null_bucket)
        return (jnp.where(real_j, m_before, m),
                (jnp.where(real_j, a, -1), jnp.where(real_j, jb, -1)))

    _, (align, jb) = jax.lax.scan(step, m, (fw["a_real"], fw["a_null"], fw["prev"],
                                            b["tgt_mask"].T, keys), reverse=True)
    valid = jb >= 0
    dt = fw["E"].dtype
    drawn = jnp.zeros(spec.n_buckets, dt).at[jnp.where(valid, jb, 0).ravel()].add(
        valid.ravel().astype(dt))
    return align.T, drawn


def _hmm_step(spec, key, log_theta, log_dist, b, n_cells, mode, totals=None):
    fw = _hmm_forward(spec, log_theta, log_dist, b)
    tm = b["tgt_mask"]
    out = {"loglik": fw["log_z"].sum(), "token_loglik": fw["token_loglik"]}
    if mode in ("expect", "both"):
        probs, out["expected_buckets"] = _hmm_backward_marginals(spec, fw, b, log_dist)
        out["probs"] = probs
        out["expected_cells"] = _counts(totals, "expected_cells", n_cells, probs.dtype).at[
            b["cell"].ravel()].add((probs * (b["src_mask"][:, :, None] & tm[:, None, :])).ravel())
    if mode in ("draw", "both"):
        a, out["drawn_buckets"] = _hmm_sample(spec, key, fw, b, log_dist)
        cells = jnp.take_along_axis(b["cell"], jnp.maximum(a, 0)[:, None, :], 1)[:, 0]
        w = (a >= 0).astype(fw["E"].dtype)
        out["align"] = a
        out["drawn_cells"] = _counts(totals, "drawn_cells", n_cells, w.dtype).at[
            cells.ravel()].add(w.ravel())
        if mode == "draw":  # the drawn alignment itself, one-hot (no backward pass)
            out["probs"] = jax.nn.one_hot(a, b["src"].shape[1], axis=1) * tm[:, None, :]
    return out


# --- one batch: the fertility aligner ------------------------------------------------------------

def _jump_log(spec, log_dist, to_pos, from_pos):
    """log φ of the jump from real position ``from_pos`` (−1: the start) to ``to_pos``."""
    return log_dist[_jump_bucket(spec, to_pos, from_pos)]


def _jump_tables(spec, log_dist, S1: int):
    """The jump terms of a word's link as small tables over the S1 columns (column c: real
    position c − 1, NULL at 0), gathered a row per sentence: ``pos [S1]`` the columns' real
    positions (NULL: −1); ``into [m, c]`` into column c from memory m (S1 index; 0: the start),
    NULL's weight at c = 0; ``out_of [x, c]`` from column c's position on to the next real
    link's column x (0: none) — column 0 (NULL) jumps on from the memory instead, which the
    caller sets."""
    pos = jnp.arange(S1) - 1
    into = jnp.where(pos[None] >= 0, _jump_log(spec, log_dist, pos[None], pos[:, None]),
                     log_dist[spec.null_bucket])
    out_of = jnp.where((pos >= 0)[:, None],
                       _jump_log(spec, log_dist, pos[:, None], pos[None]), 0.0)
    return pos, into, out_of


def _fertility_step(spec, key, log_theta, log_dist, log_psi, b, prev, n_cells,
                    totals=None):
    """One single-site Gibbs sweep over the target words of a batch, j = 0 … T − 1, every
    sentence at once, under the tables (Östling & Tiedemann 2016's model 3 without its
    collapsing). The alignment's weight is the HMM's times each source position's fertility
    factor ψ_{e_i}(n_i), n_i = |{j : a_j = i}| ≤ F:

        w(a) = Π_j θ_{e_{a_j}}(f_j) φ_{b(a_j − m_j)} · Π_{i ≥ 1} ψ_{e_i}(n_i)

    (m_j the last real position before j, −1 at the start; NULL's bucket for a_j = 0, which
    leaves the memory as it is). Given the rest, p(a_j = i | a_−j) ∝ θ_{e_i}(f_j) · φ_{b(i −
    m_j)} · φ_{b(k − i)} · ψ_{e_i}(n_i^{−j} + 1) / ψ_{e_i}(n_i^{−j}), k the next real link after
    j (its jump starts at i; from m_j if a_j is NULL), the fertility ratio 0 past F. The words
    after j are the previous sweep's, the words before it this sweep's. Returns ``align [B,
    T]`` (S1 indices, −1 on padding), ``drawn_cells``, ``drawn_buckets``, ``drawn_fert [n_src,
    F + 1]`` (each real source position's fertility, by its word), ``probs [B, S1, T]``: each
    target word's conditional p(a_j = · | a_−j, tables) it was drawn from (0 on padding) — their
    average over the sweeps is the Rao–Blackwellized link marginal, smoother than the drawn
    links' frequencies, as eflomal sums its sampling distributions —, and ``loglik``: log w of
    the drawn alignments (the joint weight, not a likelihood with a summed out: that sum is
    intractable under fertilities)."""
    le = _emission(log_theta, b)  # [B, S1, T]
    B, S1, T = le.shape
    tm, sm = b["tgt_mask"], b["src_mask"]
    F = spec.max_fertility
    psi = log_psi[b["src"]]  # [B, S1, F + 1]
    prev = jnp.where(tm, prev, -1)

    def next_real(carry, a_j):  # reverse: the first real link after each j (0: none)
        return jnp.where(a_j >= 1, a_j, carry), carry

    _, nxt = jax.lax.scan(next_real, jnp.zeros(B, jnp.int32), prev.T, reverse=True)
    fert = jax.nn.one_hot(prev, S1, dtype=jnp.int32).sum(1)  # [B, S1]; −1 → zeros
    rows = jnp.arange(B)
    keys = jax.random.split(key, T)
    pos, into, out_of = _jump_tables(spec, log_dist, S1)  # NULL's jump on set per step
    # log ψ(n + 1) − log ψ(n) by fertility n, −∞ past F: [B, S1, F + 1]
    gain_psi = jnp.concatenate([psi[..., 1:] - psi[..., :-1],
                                jnp.full(psi.shape[:-1] + (1,), NEG, psi.dtype)], -1)

    def step(carry, xs):
        m, fert = carry
        le_j, old, nx, real_j, k = xs
        fert = fert - jax.nn.one_hot(jnp.where(real_j, old, -1), S1, dtype=jnp.int32)
        pm = m - 1  # the memory's real position (−1: the start)
        jump_in = into[m]
        null_out = jnp.where(nx >= 1, _jump_log(spec, log_dist, nx - 1, pm), 0.0)
        jump_out = jnp.where(pos[None] >= 0, out_of[nx], null_out[:, None])
        ratio = jnp.take_along_axis(gain_psi, jnp.clip(fert, 0, F)[..., None], -1)[..., 0]
        logits = le_j + jump_in + jump_out + jnp.where(pos[None] >= 0, ratio, 0.0)
        logits = jnp.where(sm, logits, NEG)
        probs = jnp.exp(logits - jnp.max(logits, -1, keepdims=True))
        a = jnp.where(real_j, _inverse_cdf(k, probs, -1), -1)
        cond = jnp.where(real_j[:, None], probs / probs.sum(-1, keepdims=True), 0.0)
        fert = fert + jax.nn.one_hot(a, S1, dtype=jnp.int32)
        bucket = jnp.where(a >= 1, _jump_bucket(spec, a - 1, pm), spec.null_bucket)
        gain = jnp.where(real_j, le_j[rows, jnp.maximum(a, 0)] + log_dist[bucket], 0.0)
        return (jnp.where(a >= 1, a, m), fert), (a, jnp.where(real_j, bucket, -1), gain, cond)

    (_, fert), (align, buckets, gain, cond) = jax.lax.scan(
        step, (jnp.zeros(B, jnp.int32), fert),
        (jnp.moveaxis(le, 2, 0), prev.T, nxt, tm.T, keys))
    align, buckets = align.T, buckets.T
    dt = log_theta.dtype
    real_src = sm & (jnp.arange(S1) >= 1)[None]
    fert_c = jnp.clip(fert, 0, F)
    psi_term = jnp.where(real_src, jnp.take_along_axis(psi, fert_c[..., None], -1)[..., 0], 0.0)
    cells = jnp.take_along_axis(b["cell"], jnp.maximum(align, 0)[:, None, :], 1)[:, 0]
    w = tm.astype(dt)
    valid = buckets >= 0
    return {"align": align,
            "loglik": gain.sum() + psi_term.sum(),
            "drawn_cells": _counts(totals, "drawn_cells", n_cells, dt).at[cells.ravel()].add(
                w.ravel()),
            "drawn_buckets": jnp.zeros(spec.n_buckets, dt).at[
                jnp.where(valid, buckets, 0).ravel()].add(valid.ravel().astype(dt)),
            "drawn_fert": (b["src"], fert_c, real_src),
            "probs": jnp.moveaxis(cond, 0, 2).astype(dt)}


#: log of the fertility factor's relaxation past F in mean-field VB (:func:`_fertility_mean_field`):
#: ψ̃(n) = ψ(F) · e^LOG_PAST_F for n > F, where the Gibbs sampler's ψ(n) is 0 — a factorized q
#: puts some mass on every fertility, and log 0 would make every expectation −∞
LOG_PAST_F = -30.0


def _fertility_add(P, p):
    """The distribution ``[..., F + 2]`` (fertilities 0 … F, then "more than F") of a count
    given by ``P`` plus one Bernoulli(``p [...]``) link."""
    shifted = jnp.concatenate([jnp.zeros_like(P[..., :1]), P[..., :-1]], -1)
    new = P * (1 - p)[..., None] + shifted * p[..., None]
    return new.at[..., -1].add(P[..., -1] * p)


def expected_log_fertility(spec, counts, prior=None):
    """E_q[log ψ_e(n)] ``[n_src, F + 1]`` under q(ψ_e) = Dirichlet(β + p_e + n̄_e)."""
    a = _fertility_prior(spec, counts, prior) + counts
    return digamma(a) - digamma(a.sum(-1, keepdims=True))


def _fertility_prior(spec, counts, prior):
    if prior is not None and prior.fertility is not None and prior.fertility.shape[-1]:
        return spec.beta + prior.fertility.astype(counts.dtype)
    return spec.beta * jnp.ones_like(counts)


def posterior_mean_log_fertility(spec, counts, prior=None):
    """log E[ψ_e(n)] ``[n_src, F + 1]`` of the rows' Dirichlet(β + p_e + counts) posteriors
    (counts 0: the prior's means, where the fertility aligner's chains start)."""
    a = _fertility_prior(spec, counts, prior) + counts
    return jnp.log(a) - jnp.log(a.sum(-1, keepdims=True))


def fertility_kl(spec, counts, prior=None):
    """Σ_e KL(Dirichlet(β + p_e + n̄_e) ‖ Dirichlet(β + p_e)) over the fertility rows."""
    return _dirichlet_kl(_fertility_prior(spec, counts, prior), counts)


def _fertility_mean_field(spec, log_theta, log_dist, log_psi, b, q_prev, n_cells, totals):
    """One coordinate-ascent sweep of mean-field VB for the fertility aligner over a batch:
    q(a) = Π_j q_j(a_j) per sentence, each q_j set in turn (j = 0 … T − 1) to its optimum
    given the others and the tables' expectations (``log_theta``, ``log_dist``, ``log_psi``
    are E_q[log θ], E_q[log φ], E_q[log ψ]):

        log q_j(i) = E log θ_{e_i}(f_j) + E_{q−j}[log φ_{b(i − m_j)}] + E_{q−j}[log φ_{b(k − i)}]
                     + E_{q−j}[log ψ̃_{e_i}(n_i^{−j} + 1) − log ψ̃_{e_i}(n_i^{−j})] + const,

    the same terms as the Gibbs sampler's conditional (:func:`_fertility_step`), averaged over
    the others' q: m_j, the last real link before j, has the distribution the updated q_<j
    give (carried forward), k, the next real link after j, the one the previous sweep's q_>j
    give (a reverse scan); NULL's term is its weight plus the jump from m_j to k; the count
    n_i^{−j} is a sum of Bernoullis (its distribution over 0 … F and "more": this sweep's
    q_<j convolved with the previous sweep's q_>j). ψ̃ is ψ with fertilities past F at
    ψ(F)·e^:data:`LOG_PAST_F` instead of 0. ``q_prev [B, S1, T]``: the previous sweep's q
    (0 on padding). Returns ``probs`` (the new q), the expected counts ``expected_cells``
    (added to ``totals``), ``expected_buckets [K]``, ``expected_fert`` (source ids, ``[B,
    S1, F + 1]`` expected fertility counts — past F counted at F —, real mask) and
    ``loglik``: E_q[log w̃(a)] + H(q), the batch's part of the ELBO."""
    le = _emission(log_theta, b)  # [B, S1, T]
    B, S1, T = le.shape
    tm, sm = b["tgt_mask"], b["src_mask"]
    F = spec.max_fertility
    dt = le.dtype
    pos, into, out_of = _jump_tables(spec, log_dist, S1)
    real_col = (pos >= 0)[None] & sm  # [B, S1]: the real source positions
    psi = log_psi[b["src"]]  # [B, S1, F + 1]
    # g(n) = E log ψ̃(n + 1) − E log ψ̃(n), n = 0 … F, "more"
    gain = jnp.concatenate([psi[..., 1:] - psi[..., :-1],
                            jnp.full((B, S1, 1), LOG_PAST_F, dt), jnp.zeros((B, S1, 1), dt)],
                           -1)
    # hankel[..., a, c] = g(a + c): the gain of a count a before j and c after it (0: more)
    at = jnp.minimum(jnp.arange(F + 1)[:, None] + jnp.arange(F + 2)[None], F + 1)
    hankel = gain[..., at]  # [B, S1, F + 1, F + 2]
    q_prev = jnp.where(tm[:, None, :], q_prev, 0.0)
    q_real = jnp.where(real_col[:, :, None], q_prev, 0.0)
    none = jax.nn.one_hot(jnp.zeros(B, jnp.int32), S1, dtype=dt)
    empty = jnp.zeros((B, S1, F + 2), dt).at[..., 0].set(1.0)

    def after(carry, q_j):  # reverse: the next real link and the count after each j
        nxt, count = carry
        q0 = q_j[:, :1]
        nxt_here = jnp.where(jnp.arange(S1)[None] >= 1, q_j + q0 * nxt, q0 * nxt)
        return (nxt_here, _fertility_add(count, q_j * (jnp.arange(S1)[None] >= 1))), \
            (nxt, count)

    # q_prev with padded target words as NULL links: they pass the memory on
    q_pass = jnp.where(tm[:, None, :], q_real.at[:, 0].set(q_prev[:, 0]),
                       jax.nn.one_hot(jnp.zeros((B, T), jnp.int32), S1, axis=1, dtype=dt))
    _, (nxt_all, suffix_all) = jax.lax.scan(after, (none, empty), jnp.moveaxis(q_pass, 2, 0),
                                            reverse=True)

    def step(carry, xs):
        mem, prefix, pairs = carry
        le_j, nxt, suffix, real_j = xs
        jump_in = mem @ into  # [B, S1]
        null_out = (nxt[:, 1:] * jump_in[:, 1:]).sum(-1)
        jump_out = jnp.where(pos[None] >= 0, nxt @ out_of, null_out[:, None])
        # E g(a + c), a the count before j (prefix), c after it (suffix): "more" gains 0
        fert = ((prefix[..., :F + 1, None] * hankel).sum(-2) * suffix).sum(-1)
        logits = le_j + jump_in + jump_out + jnp.where(real_col, fert, 0.0)
        logits = jnp.where(sm, logits, NEG)
        q = jnp.where(real_j[:, None], jax.nn.softmax(logits, -1), 0.0)
        local = (q * jnp.where(sm, le_j + jump_in, 0.0)).sum() - \
            jnp.where(q > 0, q * jnp.log(jnp.where(q > 0, q, 1.0)), 0.0).sum()
        q0 = jnp.where(real_j, q[:, 0], 1.0)[:, None]
        real_q = q * (jnp.arange(S1)[None] >= 1)
        pairs = pairs + mem.T @ real_q  # [m, c]: Σ μ_j(m) q_j(c), the jumps' expected counts
        return (mem * q0 + real_q, _fertility_add(prefix, real_q), pairs), (q, local)

    (_, count, pairs), (q, local) = jax.lax.scan(
        step, (none, empty, jnp.zeros((S1, S1), dt)),
        (jnp.moveaxis(le, 2, 0), nxt_all, suffix_all, tm.T))
    q = jnp.moveaxis(q, 0, 2)  # [B, S1, T]
    nulls = q[:, 0].sum()
    bucket = _jump_bucket(spec, pos[None], pos[:, None])  # [m, c]
    buckets = jnp.zeros(spec.n_buckets, dt).at[bucket[:, 1:].ravel()].add(
        pairs[:, 1:].ravel()).at[spec.null_bucket].add(nulls)
    # the counts' final distributions: E log ψ̃ of each real source position
    fert_dist = jnp.concatenate([count[..., :F], count[..., F:].sum(-1, keepdims=True)], -1)
    psi_term = (count[..., :F + 1] * psi).sum(-1) + count[..., F + 1] * (psi[..., F] + LOG_PAST_F)
    real = sm[:, :, None] & tm[:, None, :]
    return {"probs": q,
            "loglik": local.sum() + jnp.where(real_col, psi_term, 0.0).sum(),
            "expected_cells": _counts(totals, "expected_cells", n_cells, dt).at[
                b["cell"].ravel()].add(jnp.where(real, q, 0.0).ravel()),
            "expected_buckets": buckets,
            "expected_fert": (b["src"], fert_dist, real_col)}


def fertility_counts(spec, drawn_fert, n_src: int, dtype=jnp.float32, into=None):
    """``[n_src, F + 1]``: how many real source positions of each word have each fertility,
    from :func:`_fertility_step`'s ``drawn_fert`` (source ids, fertilities, real mask); added
    to ``into`` (a running total ``[n_src, F + 1]``, updated in place) where given."""
    src, fert, real = drawn_fert
    flat = (src * spec.n_fertility + fert).ravel()
    base = jnp.zeros(n_src * spec.n_fertility, dtype) if into is None else into.reshape(-1)
    return base.at[flat].add(real.ravel().astype(base.dtype)).reshape(n_src, spec.n_fertility)


def sample_fertility(key, spec, counts, prior=None):
    """log ψ ``[n_src, F + 1]`` of a draw of every source word's Dirichlet(β + p + counts)
    (``prior``: a :class:`TablePrior`, its ``fertility`` the pseudo-counts p, or None)."""
    log_g = log_gamma_draws(key, _fertility_prior(spec, counts, prior) + counts)
    return log_g - jax.nn.logsumexp(log_g, -1, keepdims=True)


MODES = ("draw", "expect", "both", "score")


def batch_step(spec: AlignerSpec, key, log_theta, log_dist, b: dict, n_cells: int,
               mode: str = "both", prev=None, log_psi=None, into: dict | None = None) -> dict:
    """One batch under the current tables: ``loglik`` (log p(f | e, tables), the alignments
    summed out), ``token_loglik [B, T]`` (log p(f_j | f_<j, e, tables), 0 on padding: the
    scaled forward pass's normalizers for the HMM) and ``probs [B, S1, T]`` — each target
    word's posterior over NULL and the source positions (``mode`` "expect" or "both"; for the
    HMM under "draw", the drawn alignment one-hot; "score": the likelihoods alone, and
    ``probs`` for IBM1/2) —; ``mode`` "expect" / "both": the expected counts ``expected_cells
    [C]``, ``expected_buckets [K]``; "draw" / "both": an alignment drawn from the posterior
    (``align [B, T]``) and its counts ``drawn_cells``, ``drawn_buckets``. The fertility
    aligner draws by one single-site Gibbs sweep from ``prev`` (the batch's alignment ``[B,
    T]``) under ``log_psi`` (:func:`_fertility_step`), "draw" only. ``into``: running totals
    ``{"drawn_cells" | "expected_cells": [C]}`` (a sweep's loop carry) — the batch's cell
    counts are scattered into them and returned as the new totals, in place of a fresh
    ``[C]`` of zeros per batch and the sum of two ``[C]`` vectors after it."""
    if mode not in MODES:
        raise UserError(f"batch_step: mode must be one of {MODES}, got {mode!r}")
    if spec.kind.fertility:
        if mode != "draw" or prev is None or log_psi is None:
            raise UserError("batch_step: the fertility aligner only draws (mode 'draw'), from "
                            "the previous alignment (prev) and its fertility table (log_psi)")
        return _fertility_step(spec, key, log_theta, log_dist, log_psi, b, prev, n_cells,
                               into)
    if prev is not None or log_psi is not None:
        raise UserError(f"batch_step: prev and log_psi are the fertility aligner's; "
                        f"{spec.model} draws every alignment afresh")
    if spec.kind.buckets == "jump":
        return _hmm_step(spec, key, log_theta, log_dist, b, n_cells, mode, into)
    return _independent_step(spec, key, log_theta, log_dist, b, n_cells, mode, into)
