"""``ScoreFunctionKL_ELBO`` for NumPyro: the mirror of
:class:`ppl_attention.pyro.inference.elbo.ScoreFunctionKL_ELBO` (the same name, arguments and
maths; read its docstring) — the ELBO with every latent site's KL in closed form and the
score-function gradient for the sites that cannot be reparameterized, a ``numpyro.infer.ELBO``
for ``numpyro.infer.SVI`` on a user's own model:

    ELBO = E_q[log p(y | z)] − Σ_z KL(q(z) ‖ p(z)),

    surrogate = ELBO + Σ_z [stop_grad(r_b − b_b) · log q(z_b) − stop_grad(same)],

r_b the log-likelihood of pair b (the sites under a plate named ``"batch"``; the whole model
when it has none), b_b a baseline (``infer={"baseline": {"baseline_value": b}}`` on the guide
site, per pair ``[B]`` or per token ``[B, T]``, summed per pair). The surrogate's value is
the ELBO and its gradient an unbiased estimate of the ELBO's. NumPyro's ``TraceGraph_ELBO``
scores the same draws but estimates each KL by sampling.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from numpyro import handlers
from numpyro.distributions.kl import kl_divergence
from numpyro.infer.elbo import ELBO

from ...core.errors import UserError
from ..traces import site_log_prob

__all__ = ["ScoreFunctionKL_ELBO", "score_function_kl_terms"]


def _batch_dim(trace):
    for site in trace.values():
        for frame in site.get("cond_indep_stack", ()) or ():
            if frame.name == "batch":
                return frame.dim, frame.size
    return None, 1


def _per_pair(x, dim, B: int):
    """Σ of every dim of ``x`` right of the batch plate's ``dim``: ``[B]`` (the whole of ``x``
    spread over the pairs when the trace has no batch plate)."""
    x = jnp.asarray(x)
    if dim is None or x.ndim < -dim:
        return jnp.broadcast_to(x.sum() / B, (B,))
    right = tuple(range(x.ndim + dim + 1, x.ndim))
    x = x.sum(right) if right else x
    return jnp.broadcast_to(x.reshape(-1, x.shape[-1]).sum(0), (B,))


def _masked_scaled(value, site):
    mask = site.get("mask")
    if mask is not None:
        value = jnp.where(mask, value, 0.0)
    scale = site.get("scale")
    return value * scale if scale is not None else value


def score_function_kl_terms(model_trace, guide_trace):
    """(ELBO, surrogate) of one draw from the two traces (module docstring)."""
    dim, B = _batch_dim(model_trace)
    latent = [n for n, s in guide_trace.items()
              if s["type"] == "sample" and not s.get("is_observed", False)]
    elbo, reward, kl_total = 0.0, jnp.zeros(B), 0.0
    for name, site in model_trace.items():
        if site["type"] != "sample":
            continue
        if name in latent:
            kl = kl_divergence(guide_trace[name]["fn"], site["fn"])
            kl_total = kl_total + _masked_scaled(kl, site).sum()
        elif site.get("is_observed", False):
            lp = _masked_scaled(site_log_prob(site, scaled=False), site)
            elbo = elbo + lp.sum()
            reward = reward + _per_pair(lp, dim, B)
        else:
            raise UserError(f"ScoreFunctionKL_ELBO: site {name!r} is latent in the model but "
                            f"not in the guide")
    value = elbo - kl_total
    surrogate = value
    for name in latent:
        g = guide_trace[name]
        if name not in model_trace:
            raise UserError(f"ScoreFunctionKL_ELBO: guide site {name!r} is not in the model")
        if g["fn"].has_rsample:
            continue
        log_q = _per_pair(site_log_prob(g, scaled=False), dim, B)
        b = (g.get("infer") or {}).get("baseline", {}).get("baseline_value")
        b = 0.0 if b is None else jnp.asarray(b)
        if jnp.ndim(b) >= 2:  # per token: the pair's sum (as the Pyro side)
            b = b.reshape(b.shape[0], -1).sum(-1)
        term = (jax.lax.stop_gradient(reward - b) * log_q).sum()
        surrogate = surrogate + term - jax.lax.stop_gradient(term)
    return value, surrogate


class ScoreFunctionKL_ELBO(ELBO):
    """The estimator of the module docstring, averaged over ``num_particles`` draws (vectorized
    with ``jax.vmap``); ``loss`` returns −ELBO whose gradient is the estimator's."""

    can_infer_discrete = True

    def loss_with_mutable_state(self, rng_key, param_map, model, guide, *args, **kwargs):
        def single(key):
            k_guide, k_model = jax.random.split(key)
            guide_trace = handlers.trace(handlers.seed(handlers.substitute(guide, data=param_map),
                                                       k_guide)).get_trace(*args, **kwargs)
            model_trace = handlers.trace(handlers.replay(handlers.seed(handlers.substitute(
                model, data=param_map), k_model), guide_trace)).get_trace(*args, **kwargs)
            return -score_function_kl_terms(model_trace, guide_trace)[1]

        keys = jax.random.split(rng_key, self.num_particles)
        loss = jnp.mean(jax.vmap(single)(keys)) if self.num_particles > 1 else single(keys[0])
        return {"loss": loss, "mutable_state": None}
