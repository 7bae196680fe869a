"""Is the global latent used? Posterior-collapse diagnostics of an
:class:`~ppl_attention.pyro.models.seq_vae.AttentionSeqVAE` (the ``evaluate --json`` keys):

- ``kl``: E_x KL(q(z | x) ‖ p(z)) in nats per sequence, and ``kl_per_dim`` (analytic, Normal);
- ``active_units``: dimensions d with Cov_x(E_q[z_d]) > 0.01 (Burda et al. 2016);
- ``mutual_info``: I(x; z) under q = E_x E_q(z|x)[log q(z | x) − log q(z)], q(z) the aggregate
  posterior (1/N) Σ_n q(z | x_n) over the evaluated sequences (He et al. 2019's estimator);
- ``iwae_nll``: −log (1/K) Σ_k p(x, z_k)/q(z_k | x), z_k ~ q, K = 100 (Burda et al. 2016), per
  sequence (and ``iwae_nll_per_token``); with ``elbo`` ≤ −iwae_nll ≤ log p(x);
- ``z_ablation_gap``: per token, −log p(x | z = ε) − (−log p(x | z = μ + σε)): how much worse the
  reconstruction gets when q's draw is replaced by a prior draw (the same ε), 0 when q = p.

log p(x | z) is exact for soft attention and for a categorical alignment (summed out); for the
continuous alignment families only the ELBO is reported.
"""

from __future__ import annotations

import math

import torch
from pyro.infer import Trace_ELBO

from ...core.errors import UserError

__all__ = ["elbo_per_token", "latent_diagnostics", "kl_normal_per_dim", "ACTIVE_THRESHOLD"]

ACTIVE_THRESHOLD = 0.01
LOG_2PI = math.log(2 * math.pi)


def kl_normal_per_dim(mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """KL(N(μ, σ²) ‖ N(0, 1)) per dimension = ½(μ² + σ² − 1) − log σ, same shape as μ."""
    return 0.5 * (mu.pow(2) + sigma.pow(2) - 1.0) - sigma.log()


def _closed_form(model) -> bool:
    """Is log p(x | z) exact (soft attention, or a categorical alignment summed out)?"""
    return (model.config["attention"] == "none" or model.family.deterministic
            or model.family.enumerable)


def _standard_normal(shape, like: torch.Tensor, generator=None) -> torch.Tensor:
    """N(0, 1) draws of ``shape`` on ``like``'s device and dtype, drawn where ``generator``
    lives (a CPU generator gives the same draws on every device)."""
    where = generator.device if generator is not None else like.device
    eps = torch.randn(shape, generator=generator, device=where, dtype=like.dtype)
    return eps.to(like.device)


def _normal_log_prob(z, mu, sigma):
    return (-0.5 * ((z - mu) / sigma).pow(2) - sigma.log() - 0.5 * LOG_2PI).sum(-1)


@torch.no_grad()
def _sequence_elbo(model, batch, generator) -> torch.Tensor:
    """One-draw ELBO per sequence ``[B]`` at β = 1 without free bits."""
    H, mu, sigma = model.encode(batch)
    if _closed_form(model):
        eps = _standard_normal(mu.shape, mu, generator)
        ll = model.token_log_likelihood(batch, mu + sigma * eps, H).sum(-1)
        return ll - kl_normal_per_dim(mu, sigma).sum(-1)
    # a sampled alignment: Pyro's single-particle ELBO of the whole batch, spread evenly
    loss = Trace_ELBO(max_plate_nesting=2).loss(
        model.model, lambda b: model.guide(b, posterior="prior", use_free_bits=False), batch)
    return mu.new_full((batch.size,), -loss / batch.size)


def elbo_per_token(model, batches, seed: int = 0) -> float:
    """ELBO (β = 1, no free bits, one draw of z) summed over ``batches`` / tokens."""
    g = torch.Generator().manual_seed(seed)
    was = model.training
    model.eval()
    try:
        total = sum(float(_sequence_elbo(model, b, g).sum()) for b in batches)
    finally:
        model.train(was)
    return total / sum(b.n_tokens for b in batches)


@torch.no_grad()
def _iwae(model, batch, k: int, generator, chunk: int = 20) -> torch.Tensor:
    """log (1/K) Σ_k p(x, z_k)/q(z_k | x) per sequence ``[B]``."""
    H, mu, sigma = model.encode(batch)
    logw = []
    for start in range(0, k, chunk):
        n = min(chunk, k - start)
        z = mu + sigma * _standard_normal((n, *mu.shape), mu, generator)
        ll = model.token_log_likelihood(batch, z, H).sum(-1)
        logw.append(ll + _normal_log_prob(z, torch.zeros_like(mu), torch.ones_like(sigma))
                    - _normal_log_prob(z, mu, sigma))
    return torch.cat(logw).logsumexp(0) - math.log(k)


@torch.no_grad()
def latent_diagnostics(model, batches, iwae_k: int = 100, mi_sequences: int = 2000,
                       seed: int = 0) -> dict:
    """The diagnostics of the module docstring over ``batches`` (a sequence VAE's batches)."""
    if iwae_k < 1:
        raise UserError(f"iwae_k must be at least 1, got {iwae_k}")
    model.eval()
    g = torch.Generator().manual_seed(seed)
    mus, sigmas, kl_dims = [], [], []
    elbo = iwae = gap = 0.0
    n_seq = n_tok = 0
    closed = _closed_form(model)
    for b in batches:
        H, mu, sigma = model.encode(b)
        mus.append(mu)
        sigmas.append(sigma)
        kl_dims.append(kl_normal_per_dim(mu, sigma))
        elbo += float(_sequence_elbo(model, b, g).sum())
        if closed:
            iwae += float(_iwae(model, b, iwae_k, g).sum())
            eps = _standard_normal(mu.shape, mu, g)
            ll_q = model.token_log_likelihood(b, mu + sigma * eps, H).sum()
            ll_p = model.token_log_likelihood(b, eps, H).sum()
            gap += float(ll_q - ll_p)
        n_seq += b.size
        n_tok += b.n_tokens
    mu, sigma, kl = torch.cat(mus), torch.cat(sigmas), torch.cat(kl_dims)
    active = mu.var(0, unbiased=True) > ACTIVE_THRESHOLD if n_seq > 1 else mu.new_zeros(0)
    # mutual information with the aggregate posterior over (up to) mi_sequences sequences
    m = min(n_seq, mi_sequences)
    mu_m, sigma_m = mu[:m], sigma[:m]
    z = mu_m + sigma_m * _standard_normal(mu_m.shape, mu_m, g)
    # log q(z_i | x_i) − log q(z_i) at the same draw: exactly 0 when every q(z | x) is one
    # distribution (the analytic E_q log q(z | x) would leave Monte Carlo noise there)
    log_q_own = _normal_log_prob(z, mu_m, sigma_m)
    log_qz = torch.stack([_normal_log_prob(z[i], mu_m, sigma_m).logsumexp(0) for i in range(m)])
    mutual_info = float((log_q_own - (log_qz - math.log(m))).mean())
    report = {
        "generative": model.generative,
        "n_sequences": n_seq,
        "n_tokens": n_tok,
        "elbo": elbo / n_seq,
        "elbo_per_token": elbo / n_tok,
        "kl": float(kl.sum(-1).mean()),
        "kl_per_dim": [float(v) for v in kl.mean(0)],
        "active_units": int(active.sum()),
        "latent": model.latent,
        "mutual_info": mutual_info,
        "iwae_k": iwae_k,
        "iwae_nll": -iwae / n_seq if closed else None,
        "iwae_nll_per_token": -iwae / n_tok if closed else None,
        "z_ablation_gap": gap / n_tok if closed else None,
    }
    return report
