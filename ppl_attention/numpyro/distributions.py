"""Simplex distributions over a ragged set of source positions, NumPyro side: the same maths as
:mod:`ppl_attention.distributions` (see there for the densities). NumPyro has no
RelaxedOneHotCategorical at all; these give exactly 0 on masked positions.

One difference from the torch side: a JAX array cannot carry its own log, so
``MaskedRelaxedCategorical.log_prob`` uses log(max(x, tiny)); at very low temperatures
(τ ≲ 0.1 in float32) a draw's smallest coordinates can underflow and the density differs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import digamma, gammaln
from numpyro.distributions import Distribution, constraints

__all__ = ["MaskedDirichlet", "MaskedRelaxedCategorical"]


def _tiny(dtype):
    return jnp.finfo(dtype).tiny


def _broadcast_mask(param, mask):
    param = jnp.asarray(param)
    if mask is None:
        mask = jnp.ones(param.shape, bool)
    param, mask = jnp.broadcast_arrays(param, jnp.asarray(mask).astype(bool))
    return param, mask


class MaskedDirichlet(Distribution):
    """Dirichlet(α) on the sub-simplex of unmasked positions. ``concentration [..., S]``,
    ``mask [..., S]`` bool. Sampling normalizes Gamma draws; ``jax.random.gamma`` has implicit
    reparameterization gradients, as torch's sampler does."""

    arg_constraints = {"concentration": constraints.independent(constraints.positive, 1)}
    support = constraints.simplex
    reparametrized_params = ["concentration"]
    pytree_data_fields = ("concentration", "source_mask")

    def __init__(self, concentration, mask=None, *, validate_args=None):
        concentration, mask = _broadcast_mask(concentration, mask)
        self.source_mask = mask
        self.concentration = jnp.where(mask, concentration, 1.0)
        super().__init__(jnp.shape(concentration)[:-1], jnp.shape(concentration)[-1:],
                         validate_args=validate_args)

    def sample(self, key, sample_shape=()):
        shape = tuple(sample_shape) + self.batch_shape + self.event_shape
        g = jax.random.gamma(key, jnp.broadcast_to(self.concentration, shape))
        g = jnp.maximum(g, _tiny(g.dtype)) * self.source_mask
        return g / g.sum(-1, keepdims=True)

    def log_prob(self, value):
        m = self.source_mask.astype(value.dtype)
        a = self.concentration
        return (((a - 1) * jnp.log(jnp.maximum(value, _tiny(value.dtype))) * m).sum(-1)
                + gammaln((a * m).sum(-1)) - (gammaln(a) * m).sum(-1))

    @property
    def mean(self):
        a = self.concentration * self.source_mask
        return a / a.sum(-1, keepdims=True)

    def entropy(self):
        m = self.source_mask.astype(self.concentration.dtype)
        a = self.concentration
        a0, n = (a * m).sum(-1), m.sum(-1)
        return ((gammaln(a) * m).sum(-1) - gammaln(a0) + (a0 - n) * digamma(a0)
                - ((a - 1) * digamma(a) * m).sum(-1))


class MaskedRelaxedCategorical(Distribution):
    """Concrete / Gumbel-softmax (Maddison et al. 2017, Definition 1): ``x = softmax((log π +
    g)/τ)``, g ~ Gumbel(0, 1), log π = −∞ on masked positions. Density on the n-point face:
    log Γ(n) + (n−1) log τ + Σ_u [log π_u − (τ+1) log x_u] − n · log Σ_u π_u x_u^(−τ)."""

    arg_constraints = {"logits": constraints.real_vector}
    support = constraints.simplex
    reparametrized_params = ["logits"]
    pytree_data_fields = ("logits", "source_mask", "temperature")

    def __init__(self, temperature, logits, mask=None, *, validate_args=None):
        logits, mask = _broadcast_mask(logits, mask)
        self.source_mask = mask
        self.temperature = jnp.asarray(temperature, dtype=logits.dtype)
        masked = jnp.where(mask, logits, -jnp.inf)
        self.logits = masked - jax.nn.logsumexp(masked, -1, keepdims=True)
        super().__init__(jnp.shape(logits)[:-1], jnp.shape(logits)[-1:], validate_args=False)

    def sample(self, key, sample_shape=()):
        shape = tuple(sample_shape) + self.batch_shape + self.event_shape
        u = jax.random.uniform(key, shape, minval=_tiny(jnp.float32), maxval=1 - 1e-7)
        gumbel = -jnp.log(-jnp.log(u))
        return jax.nn.softmax((self.logits + gumbel) / self.temperature, -1)

    def log_prob(self, value):
        m = self.source_mask
        tau = self.temperature
        log_x = jnp.log(jnp.maximum(value, _tiny(value.dtype)))
        n = m.astype(value.dtype).sum(-1)
        log_pi = jnp.where(m, self.logits, 0.0)
        log_x_u = jnp.where(m, log_x, 0.0)
        per_pos = jnp.where(m, log_pi - (tau + 1) * log_x_u, 0.0).sum(-1)
        inner = jnp.where(m, log_pi - tau * log_x_u, -jnp.inf)
        return (gammaln(n) + (n - 1) * jnp.log(tau) + per_pos
                - n * jax.nn.logsumexp(inner, -1))
