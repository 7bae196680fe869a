"""A small fully Bayesian alignment model (IBM Model 2 with a diagonal distortion prior), for
reference posteriors by NUTS in NumPyro with the alignments enumerated.

For pair (x, y) with |x| = l, |y| = m:

    θ_e ~ Dirichlet(α·1)                 translation table p(f | e), one row per source word e
    λ ~ Gamma(a, b)                      diagonal tension (fast_align, Dyer et al. 2013)
    z_j | λ ~ Categorical(softmax_i(−λ · |i/l − j/m|))      i = 0..l−1 (distortion prior)
    y_j | z_j, θ ~ Categorical(θ_{x_{z_j}})

``z`` is summed out exactly by enumeration (``infer={"enumerate": "parallel"}``), so NUTS
samples (θ, λ) from p(θ, λ | data) directly, and SVI with ``AutoNormal`` / ``AutoDelta`` fits
the same model with ``TraceEnum_ELBO``.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from ...common import arviz_api
from ...core.numerics import LOG_ZERO
from .base import AlignmentModel

__all__ = ["encode_pairs", "ibm2_model", "nuts_reference", "fit_svi", "compare_to_nuts",
           "BayesianIBM2"]


def encode_pairs(pairs, src_vocab: dict | None = None, tgt_vocab: dict | None = None):
    """Pairs of token lists → (src [N, L], src_mask, tgt [N, M], tgt_mask, src_vocab,
    tgt_vocab) as numpy arrays; vocabularies map token → id."""
    src_vocab = src_vocab or {w: i for i, w in enumerate(sorted({w for s, _ in pairs for w in s}))}
    tgt_vocab = tgt_vocab or {w: i for i, w in enumerate(sorted({w for _, t in pairs for w in t}))}
    N = len(pairs)
    L = max(len(s) for s, _ in pairs)
    M = max(len(t) for _, t in pairs)
    src = np.zeros((N, L), np.int32)
    tgt = np.zeros((N, M), np.int32)
    sm = np.zeros((N, L), bool)
    tm = np.zeros((N, M), bool)
    for n, (s, t) in enumerate(pairs):
        src[n, : len(s)] = [src_vocab[w] for w in s]
        tgt[n, : len(t)] = [tgt_vocab[w] for w in t]
        sm[n, : len(s)] = True
        tm[n, : len(t)] = True
    return src, sm, tgt, tm, src_vocab, tgt_vocab


def ibm2_model(src, src_mask, tgt, tgt_mask, n_src: int, n_tgt: int, alpha: float = 1.5,
               lam_prior=(2.0, 0.5)):
    """The model above. Arrays as :func:`encode_pairs` gives them. α > 1 keeps the posterior
    mode inside the simplex, so MAP (``AutoDelta``) is well posed; with α < 1 it sits on the
    boundary and MAP diverges."""
    theta = numpyro.sample("theta", dist.Dirichlet(jnp.full((n_tgt,), alpha))
                           .expand([n_src]).to_event(1))  # [n_src, n_tgt]
    lam = numpyro.sample("lam", dist.Gamma(*lam_prior))
    N, L = src.shape
    M = tgt.shape[1]
    l_len = src_mask.sum(-1, keepdims=True)[:, :, None]  # [N, 1, 1]
    m_len = tgt_mask.sum(-1, keepdims=True)[:, :, None]
    i = jnp.arange(L)[None, None, :]
    j = jnp.arange(M)[None, :, None]
    logits = -lam * jnp.abs(i / l_len - j / m_len)
    logits = jnp.where(src_mask[:, None, :], logits, LOG_ZERO)  # [N, M, L]
    emis = jnp.log(theta[src[:, None, :], tgt[:, :, None]])  # log p(y_j | x_i), [N, M, L]
    with numpyro.plate("pair", N, dim=-2), numpyro.plate("target", M, dim=-1):
        # unmasked on purpose: at a padded j, Σ_z p(z)·1 = 1 adds nothing
        z = numpyro.sample("z", dist.Categorical(logits=logits),
                           infer={"enumerate": "parallel"})
        lp = (jax.nn.one_hot(z, L) * emis).sum(-1)
        numpyro.factor("y", jnp.where(tgt_mask, lp, 0.0))


def _data_args(pairs):
    src, sm, tgt, tm, sv, tv = encode_pairs(pairs)
    return (jnp.asarray(src), jnp.asarray(sm), jnp.asarray(tgt), jnp.asarray(tm), len(sv),
            len(tv)), sv, tv


def nuts_reference(pairs, num_warmup: int = 500, num_samples: int = 1000, num_chains: int = 4,
                   seed: int = 0, progress: bool = False):
    """NUTS on :func:`ibm2_model` → (arviz.InferenceData, seconds)."""
    from numpyro.infer import MCMC, NUTS

    args, sv, tv = _data_args(pairs)
    mcmc = MCMC(NUTS(ibm2_model), num_warmup=num_warmup, num_samples=num_samples,
                num_chains=num_chains, chain_method="sequential", progress_bar=progress)
    t = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), *args)
    seconds = time.perf_counter() - t
    # az.from_numpyro re-runs the model without enumeration and fails: build it from draws
    draws = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    stats = {k: np.asarray(v) for k, v in mcmc.get_extra_fields(group_by_chain=True).items()}
    idata = arviz_api.from_dict(posterior=draws, sample_stats={"diverging": stats["diverging"]},
                         coords={"source_word": list(sv), "target_word": list(tv)},
                         dims={"theta": ["source_word", "target_word"]})
    return idata, seconds


def fit_svi(pairs, guide: str = "AutoNormal", steps: int = 3000, lr: float = 0.02,
            seed: int = 0, num_samples: int = 1000):
    """SVI with an autoguide on :func:`ibm2_model` (``TraceEnum_ELBO``, z enumerated) →
    (posterior means {name: array}, seconds)."""
    from numpyro.infer import SVI, Predictive, TraceEnum_ELBO, autoguide

    args, _, _ = _data_args(pairs)
    from numpyro import handlers

    # the autoguide covers (θ, λ); z stays enumerated in the model by TraceEnum_ELBO
    g = getattr(autoguide, guide)(handlers.block(ibm2_model, hide=["z"]))
    svi = SVI(ibm2_model, g, numpyro.optim.Adam(lr), TraceEnum_ELBO(max_plate_nesting=2))
    t = time.perf_counter()
    result = svi.run(jax.random.PRNGKey(seed), steps, *args, progress_bar=False)
    seconds = time.perf_counter() - t
    draws = Predictive(g, params=result.params, num_samples=num_samples)(
        jax.random.PRNGKey(seed + 1), *args)
    return {k: np.asarray(draws[k]).mean(0) for k in ("theta", "lam")}, seconds


def compare_to_nuts(pairs, guides=("AutoNormal", "AutoDelta"), seed: int = 0, **nuts_kwargs):
    """The NUTS reference (R-hat, bulk ESS) and, per autoguide, how far its posterior means are
    from the NUTS means: mean |Δθ| over the table and |Δλ|."""

    idata, nuts_s = nuts_reference(pairs, seed=seed, **nuts_kwargs)
    summary = arviz_api.summary(idata, var_names=["theta", "lam"])
    ref = {k: idata.posterior[k].mean(("chain", "draw")).values for k in ("theta", "lam")}
    rows = [{"method": "NUTS (reference)", "mean_abs_theta": 0.0, "abs_lam": 0.0,
             "seconds": nuts_s, "lam": float(ref["lam"])}]
    for guide in guides:
        means, s = fit_svi(pairs, guide, seed=seed)
        rows.append({"method": f"SVI {guide}",
                     "mean_abs_theta": float(np.abs(means["theta"] - ref["theta"]).mean()),
                     "abs_lam": float(abs(means["lam"] - ref["lam"])), "seconds": s,
                     "lam": float(means["lam"])})
    return {"max_rhat": float(summary["r_hat"].max()), "min_ess_bulk": float(
        summary["ess_bulk"].min()), "rows": rows, "idata": idata}


class BayesianIBM2(AlignmentModel):
    """The model above under the NumPyro model contract — the registry's ``bayesian-ibm2`` —,
    trained by the methods for global latents (``nuts``, ``hmc``, ``svi-normal``,
    ``svi-lowrank``, ``svi-delta``: :mod:`ppl_attention.core.method_specs`):

        θ_e ~ Dirichlet(α·1)    one row per source word e (special tokens included)
        λ ~ Gamma(a, b)
        z_t | λ ~ Categorical(softmax_j(−λ·|(t + ½)/m − (j + ½)/l|))      (site ``align``)
        y_t | z_t, θ ~ Categorical(θ_{x_{z_t}})

    The alignment is written by ``pa.numpyro.attend`` with the rows log θ_{x_j} as its values,
    so the selected row is the target's log-probabilities; MCMC and SVI see it enumerated.
    Arrays as a pairs batch gives them (``<eos>`` is a target token like any other)."""

    latents = ("theta", "lam")
    families = ("categorical",)
    posteriors = ("none",)
    training_defaults = {"steps": 2000, "lr": 0.02}

    def __init__(self, src_vocab: int, tgt_vocab: int, *, family, alpha: float = 1.5,
                 lam_shape: float = 2.0, lam_rate: float = 0.5):
        self.family = family
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.alpha, self.lam_prior = alpha, (lam_shape, lam_rate)

    def model(self, batch, *, enumerate_z=False, kl_scale=1.0):
        from numpyro import handlers

        from ..attend import attend

        theta = numpyro.sample("theta", dist.Dirichlet(jnp.full((self.tgt_vocab,), self.alpha))
                               .expand([self.src_vocab]).to_event(1))  # [V_src, V_tgt]
        lam = numpyro.sample("lam", dist.Gamma(*self.lam_prior))
        B, T = batch.tgt_out.shape
        S = batch.src.shape[1]
        m = jnp.maximum(batch.tgt_mask.sum(-1, keepdims=True), 1)[:, :, None]
        n = jnp.maximum(batch.src_mask.sum(-1, keepdims=True), 1)[:, :, None]
        i = (jnp.arange(S) + 0.5)[None, None, :] / n
        t = (jnp.arange(T) + 0.5)[None, :, None] / m
        scores = -lam * jnp.abs(t - i)  # [B, T, S]
        values = jnp.log(theta)[batch.src]  # [B, S, V_tgt]: each source word's row
        with numpyro.plate("batch", B, dim=-2), numpyro.plate("target", T, dim=-1):
            with handlers.scale(scale=kl_scale):
                logp, _ = attend("align", scores, values, self.family, mask=batch.src_mask,
                                 target_mask=None if enumerate_z else batch.tgt_mask,
                                 infer={"enumerate": "parallel"} if enumerate_z else None)
            numpyro.sample("y", dist.Categorical(logits=logp).mask(batch.tgt_mask),
                           obs=batch.tgt_out)

    def guide(self, batch, *, posterior="none", enumerate_z=False, kl_scale=1.0,
              baseline=None):
        """No alignment guide: the globals' guides are the methods' autoguides, the alignment
        is summed out."""
