"""Simplex distributions over a ragged set of source positions, NumPyro side: the same maths as
:mod:`ppl_attention.pyro.distributions` (see there for the densities). NumPyro has no
RelaxedOneHotCategorical at all; these give exactly 0 on masked positions.

Both draw in log space, where nothing underflows:

- ``MaskedDirichlet`` normalizes log-Gamma draws (``jax.random.loggamma``, exact for small
  concentrations and with finite implicit-reparameterization gradients; ``jax.random.gamma``
  underflows to 0 for α ≲ 0.05 and its gradient there is NaN under ``jit``);
- ``MaskedRelaxedCategorical`` returns the log of its draw as the site's *intermediate*
  (``sample_with_intermediates``), and ``log_prob(value, intermediates)`` reads it — the torch
  side's ``value._pa_log_value``. At low temperatures or far-apart logits a draw's smallest
  coordinates underflow to 0 in float32, and log(max(x, tiny)) there is wrong by hundreds of
  nats: a Monte Carlo KL(q ‖ p) of such draws comes out hugely negative, and an ELBO trained on
  it climbs without bound. A program must therefore be replayed with the intermediates
  (:func:`ppl_attention.numpyro.traces.replay`); a value without them is scored as before.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import digamma, gammaln
from numpyro.distributions import Distribution, MaskedDistribution, constraints

__all__ = ["MaskedDirichlet", "MaskedRelaxedCategorical", "IntermediatesMasked", "safe_log"]


def _tiny(dtype):
    return jnp.finfo(dtype).tiny


def safe_log(x):
    """log x with 0 ↦ log of the dtype's smallest normal number (−87.3 in float32): finite,
    and the same under ``jax.jit`` — a subnormal floor such as 1e-38 is flushed to 0 there, and
    its log is not −inf."""
    return jnp.log(jnp.maximum(x, _tiny(x.dtype)))


def _broadcast_mask(param, mask):
    param = jnp.asarray(param)
    if mask is None:
        mask = jnp.ones(param.shape, bool)
    param, mask = jnp.broadcast_arrays(param, jnp.asarray(mask).astype(bool))
    return param, mask


class MaskedDirichlet(Distribution):
    """Dirichlet(α) on the sub-simplex of unmasked positions. ``concentration [..., S]``,
    ``mask [..., S]`` bool. A draw is softmax of log-Gamma(α_u) draws over the unmasked u
    (exactly 0 elsewhere); ``jax.random.loggamma`` has implicit reparameterization gradients,
    as torch's Gamma sampler does, and they stay finite for tiny α."""

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
        log_g = jax.random.loggamma(key, jnp.broadcast_to(self.concentration, shape))
        return jax.nn.softmax(jnp.where(self.source_mask, log_g, -jnp.inf), -1)

    def log_prob(self, value):
        m = self.source_mask.astype(value.dtype)
        a = self.concentration
        return (((a - 1) * safe_log(value) * m).sum(-1)
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

    def sample_with_intermediates(self, key, sample_shape=()):
        """``(x, [log x])``: the draw and its exact logarithm (−∞ on masked positions)."""
        shape = tuple(sample_shape) + self.batch_shape + self.event_shape
        dtype = self.logits.dtype
        u = jax.random.uniform(key, shape, dtype, minval=_tiny(dtype), maxval=1 - 1e-7)
        gumbel = -jnp.log(-jnp.log(u))
        log_x = jax.nn.log_softmax((self.logits + gumbel) / self.temperature, -1)
        return jnp.exp(log_x), [log_x]

    def sample(self, key, sample_shape=()):
        return self.sample_with_intermediates(key, sample_shape)[0]

    def mask(self, mask):
        """As ``Distribution.mask``, keeping the draw's logarithm (``IntermediatesMasked``)."""
        if mask is True:
            return self
        return IntermediatesMasked(self, mask)

    def log_prob(self, value, intermediates=None):
        m = self.source_mask
        tau = self.temperature
        log_x = intermediates[0] if intermediates else \
            safe_log(value)
        n = m.astype(value.dtype).sum(-1)
        log_pi = jnp.where(m, self.logits, 0.0)
        log_x_u = jnp.where(m, log_x, 0.0)
        per_pos = jnp.where(m, log_pi - (tau + 1) * log_x_u, 0.0).sum(-1)
        inner = jnp.where(m, log_pi - tau * log_x_u, -jnp.inf)
        return (gammaln(n) + (n - 1) * jnp.log(tau) + per_pos
                - n * jax.nn.logsumexp(inner, -1))


class IntermediatesMasked(MaskedDistribution):
    """``MaskedDistribution`` that hands its base's intermediates through (NumPyro's drops
    them: a masked relaxed site would be scored from its underflowed value again)."""

    def sample_with_intermediates(self, key, sample_shape=()):
        return self.base_dist.sample_with_intermediates(key, sample_shape)

    def log_prob(self, value, intermediates=None):
        if not intermediates or isinstance(self._mask, bool):
            return super().log_prob(value)
        return jnp.where(self._mask, self.base_dist.log_prob(value, intermediates), 0.0)
