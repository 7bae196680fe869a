"""Alignment families for the NumPyro mirror: the same classes, arguments and maths as
:mod:`ppl_attention.pyro.families` (read its docstrings for the equations).

The one difference is functional: a family with parameters (the contextual prior network of
``Weibull``/``LogNormal``, keys ``"prior_net.0.weight"`` … as in torch's ``state_dict``) takes
them as ``params=`` in ``prior``; ``family.init(key)`` makes fresh ones. Shapes as on the
torch side: ``scores [..., T, S]``, ``values [..., S, dv]``, ``mask [..., T, S]`` bool.
"""

from __future__ import annotations

import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist

from ..core.errors import UserError
from ..core.family_specs import FAMILY_SPECS, Configured, FamilySpec, family_registry
from ..core.numerics import LOG_ZERO
from ..structures import jax_ops
from ..structures.entmax import entmax, entmax_bisect, sparsemax
from ..structures.linear_chain import (
    hmm_potentials,
    segment_log_partition,
    segment_marginals,
)
from ..structures.segment_selection import (
    coverage,
    coverage_statistics,
    selected_positions,
    selection_potentials,
)
from ..structures.span_selection import (
    read_positions,
    span_part_mask,
    span_parts,
    span_potentials,
    span_weights,
)
from . import kl as _kl  # noqa: F401  (registers the closed-form KLs)
from .crfs import LinearChainCRF, SemiMarkovCRF, TreeCRF
from .distributions import MaskedDirichlet, MaskedRelaxedCategorical
from .nn import Params, init_linear, linear
from .sparse import SparsemaxCategorical
from .structured import FLOOR, MonotonicAlignment
from .trees import DependencyTree, heads_to_arcs

__all__ = ["Family", "Soft", "Sparsemax", "Entmax", "Categorical", "SparseCategorical",
           "RelaxedCategorical", "Dirichlet", "Weibull",
           "LogNormal", "GaussianContext", "MarkovCategorical", "SegmentCRF", "Segments",
           "SegmentMarginals", "Spans", "SpanMarginals", "Tree",
           "TreeMarginals", "FAMILIES",
           "make_family", "masked_softmax"]


def masked_softmax(scores, mask):
    """softmax over the last dim with exactly 0 where ``mask`` is False."""
    if mask is None:
        return jax.nn.softmax(scores, -1)
    return jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), -1)


def masked_log_softmax(scores, mask, floor: float = LOG_ZERO):
    """log softmax with a finite ``floor`` where ``mask`` is False: probability 0 as for
    :func:`masked_softmax`, but enumeration and log q·q stay free of NaN gradients."""
    return jnp.where(mask, jax.nn.log_softmax(jnp.where(mask, scores, -jnp.inf), -1), floor)


def _normalize(s, mask):
    s = s * mask
    return s / jnp.maximum(s.sum(-1, keepdims=True), jnp.finfo(s.dtype).tiny)


class Family(Configured):
    """Base contract (see :class:`ppl_attention.pyro.families.Family`); traits and parameters from
    the same spec (:mod:`ppl_attention.core.family_specs`)."""

    spec: FamilySpec | None = None
    name: str = ""
    reparameterized: bool = False
    enumerable: bool = False
    deterministic: bool = False
    normalizes: bool = False
    markov: bool = False
    latent_context: bool = False
    tree: bool = False
    segments: bool = False
    spans: bool = False
    selects: bool = False
    sparse: bool = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("spec")
        if spec is not None:
            cls.name = spec.name
            for trait, value in spec.traits.items():
                setattr(cls, trait, value)

    def init(self, key) -> Params:
        """Fresh parameters of the family (none for most)."""
        return {}

    def has_parameters(self) -> bool:
        """Does :meth:`init` make any (so that ``attend`` registers them)?"""
        return False

    def deterministic_weights(self, scores, mask, params: Params | None = None):
        """Masked softmax unless the family says otherwise (SegmentCRF: its marginals)."""
        return masked_softmax(scores, mask)

    def prior(self, scores, mask, keys, values, params: Params | None = None):
        raise NotImplementedError

    def posterior(self, scores, mask, values, scale=None):
        raise NotImplementedError

    def weights(self, value, scores, mask):
        return value

    def context(self, value, values):
        return value @ values

    def context_size(self, value_dim: int) -> int:
        return value_dim

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self._config().items())
        return f"{type(self).__name__}({args})"


class Soft(Family):
    spec = FAMILY_SPECS["soft"]

    def prior(self, scores, mask, keys, values, params=None):
        return None

    def posterior(self, scores, mask, values, scale=None):
        return None


class Sparsemax(Family):
    """As :class:`ppl_attention.pyro.families.Sparsemax`: w = sparsemax(scores), exact zeros."""

    spec = FAMILY_SPECS["sparsemax"]

    def deterministic_weights(self, scores, mask, params: Params | None = None):
        return sparsemax(jax_ops, scores, mask)

    def prior(self, scores, mask, keys, values, params=None):
        return None

    def posterior(self, scores, mask, values, scale=None):
        return None


class Entmax(Family):
    """As :class:`ppl_attention.pyro.families.Entmax`: w = α-entmax(scores); with
    ``learn_alpha`` the family's parameter ``{"alpha_raw": ρ}``, α = 1 + softplus(ρ)
    (registered by ``attend`` as ``numpyro.param("family", …)``)."""

    spec = FAMILY_SPECS["entmax"]

    def __init__(self, alpha: float = 1.5, learn_alpha: bool = False, n_iter: int = 50):
        cfg = self._configure(alpha=alpha, learn_alpha=learn_alpha, n_iter=n_iter)
        self.alpha, self.learn_alpha, self.n_iter = cfg["alpha"], cfg["learn_alpha"], cfg["n_iter"]

    def has_parameters(self) -> bool:
        return self.learn_alpha

    def init(self, key) -> Params:
        if not self.learn_alpha:
            return {}
        return {"alpha_raw": jnp.asarray(math.log(math.expm1(self.alpha - 1.0)), jnp.float32)}

    def current_alpha(self, params: Params | None = None):
        if self.learn_alpha:
            if not params:
                raise UserError("Entmax(learn_alpha=True) needs its params= (family.init(key) "
                                "makes them)")
            return 1.0 + jax.nn.softplus(params["alpha_raw"])
        return self.alpha

    def deterministic_weights(self, scores, mask, params: Params | None = None):
        if self.learn_alpha:
            alpha = jnp.asarray(self.current_alpha(params), scores.dtype)
            return entmax_bisect(jax_ops, scores, mask, alpha, self.n_iter)
        return entmax(jax_ops, scores, mask, self.alpha, self.n_iter)

    def prior(self, scores, mask, keys, values, params=None):
        return None

    def posterior(self, scores, mask, values, scale=None):
        return None


class Categorical(Family):
    """z_t ∈ {0..S−1}, p(z_t = s) = softmax(scores_t)_s; context ``one_hot(z) @ values`` so
    enumerated dims broadcast; the weights are the index z."""

    spec = FAMILY_SPECS["categorical"]

    def prior(self, scores, mask, keys, values, params=None):
        return dist.Categorical(logits=masked_log_softmax(scores, mask))

    def posterior(self, scores, mask, values, scale=None):
        return dist.Categorical(logits=masked_log_softmax(scores, mask))

    def context(self, value, values):
        return jax.nn.one_hot(value, values.shape[-2], dtype=values.dtype) @ values


class SparseCategorical(Categorical):
    """As :class:`ppl_attention.pyro.families.SparseCategorical`: prior softmax(scores), guide
    q = sparsemax(scores), enumerated exactly (positions of probability 0 add 0)."""

    spec = FAMILY_SPECS["sparse-categorical"]

    def posterior(self, scores, mask, values, scale=None):
        return SparsemaxCategorical(sparsemax(jax_ops, scores, mask))


class RelaxedCategorical(Family):
    spec = FAMILY_SPECS["relaxed-categorical"]

    def __init__(self, temperature: float = 0.5):
        self.temperature = self._configure(temperature=temperature)["temperature"]

    def prior(self, scores, mask, keys, values, params=None):
        return MaskedRelaxedCategorical(self.temperature, scores, mask)

    def posterior(self, scores, mask, values, scale=None):
        return MaskedRelaxedCategorical(self.temperature, scores, mask)


class Dirichlet(Family):
    """Prior Dirichlet(α₀·softmax(scores) + ε); posterior Dirichlet(softplus(q-scores) + ε)."""

    spec = FAMILY_SPECS["dirichlet"]

    def __init__(self, concentration: float = 1.0, eps: float = 1e-3):
        cfg = self._configure(concentration=concentration, eps=eps)
        self.concentration, self.eps = cfg["concentration"], cfg["eps"]

    def prior(self, scores, mask, keys, values, params=None):
        return MaskedDirichlet(self.concentration * masked_softmax(scores, mask) + self.eps, mask)

    def posterior(self, scores, mask, values, scale=None):
        return MaskedDirichlet(jax.nn.softplus(scores) + self.eps, mask)


class _BayesianAttention(Family):
    """Contextual prior mean m = softmax_keys(f(k)), f = Linear(dk, d_mid)–ReLU–Linear(d_mid, 1)
    (Fan et al. 2020, §3.3), or uniform (``prior="constant"``)."""

    def _init_prior(self, cfg: dict, key_dim: int | None) -> None:
        self.prior_kind, self.d_mid, self.key_dim = cfg["prior"], cfg["d_mid"], key_dim

    def has_parameters(self) -> bool:
        return self.prior_kind == "contextual"

    def init(self, key) -> Params:
        if self.prior_kind == "constant":
            return {}
        if self.key_dim is None:
            raise UserError("init needs key_dim (the size of the keys the prior network reads)")
        k1, k2 = jax.random.split(key)
        return {**init_linear(k1, "prior_net.0", self.key_dim, self.d_mid),
                **init_linear(k2, "prior_net.2", self.d_mid, 1)}

    def prior_mean(self, keys, mask, params: Params | None = None):
        """Prior mean weights ``[..., 1, S]``, 0 where masked."""
        if self.prior_kind == "constant":
            key_scores = jnp.zeros(keys.shape[:-1], keys.dtype)
        else:
            if not params:
                raise UserError(f"{type(self).__name__}(prior='contextual') needs its "
                                 "prior-network params= (family.init(key) makes them)")
            hidden = jax.nn.relu(linear(params, "prior_net.0", keys))
            key_scores = linear(params, "prior_net.2", hidden)[..., 0]
        return masked_softmax(key_scores[..., None, :], mask)

    def weights(self, value, scores, mask):
        return _normalize(value, mask)


class Weibull(_BayesianAttention):
    """BAM-W: S ~ Weibull(k, λ = softmax(scores)/Γ(1 + 1/k)); prior Gamma(β·m, β)."""

    spec = FAMILY_SPECS["weibull"]

    def __init__(self, k: float = 10.0, beta: float = 1.0, prior: str = "contextual",
                 d_mid: int = 10, key_dim: int | None = None):
        cfg = self._configure(k=k, beta=beta, prior=prior, d_mid=d_mid)
        self.k, self.beta = cfg["k"], cfg["beta"]
        self._init_prior(cfg, key_dim)

    def prior(self, scores, mask, keys, values, params=None):
        m = jnp.broadcast_to(self.prior_mean(keys, mask, params), scores.shape)
        alpha = jnp.maximum(jnp.where(mask, self.beta * m, 1.0), 1e-6)
        return dist.Gamma(alpha, jnp.full_like(alpha, self.beta)).mask(mask).to_event(1)

    def posterior(self, scores, mask, values, scale=None):
        p = masked_softmax(scores, mask)
        lam = jnp.maximum(jnp.where(mask, p, 1.0), 1e-30) / math.exp(math.lgamma(1 + 1 / self.k))
        return dist.Weibull(lam, jnp.full_like(lam, self.k)).mask(mask).to_event(1)


class LogNormal(_BayesianAttention):
    """BAM-L: S ~ LogNormal(log softmax(scores) − σ²/2, σ); prior LogNormal(log m − σ_p²/2, σ_p)."""

    spec = FAMILY_SPECS["lognormal"]

    def __init__(self, sigma: float = 0.5, prior_sigma: float = 1.0, prior: str = "contextual",
                 d_mid: int = 10, key_dim: int | None = None):
        cfg = self._configure(sigma=sigma, prior_sigma=prior_sigma, prior=prior, d_mid=d_mid)
        self.sigma, self.prior_sigma = cfg["sigma"], cfg["prior_sigma"]
        self._init_prior(cfg, key_dim)

    @staticmethod
    def _lognormal(mean_weights, mask, sigma):
        log_m = jnp.where(mask, jnp.log(jnp.maximum(mean_weights, 1e-30)), 0.0)
        loc = log_m - sigma**2 / 2
        return dist.LogNormal(loc, jnp.full_like(loc, sigma)).mask(mask).to_event(1)

    def prior(self, scores, mask, keys, values, params=None):
        m = jnp.broadcast_to(self.prior_mean(keys, mask, params), scores.shape)
        return self._lognormal(m, mask, self.prior_sigma)

    def posterior(self, scores, mask, values, scale=None):
        return self._lognormal(masked_softmax(scores, mask), mask, self.sigma)


class GaussianContext(Family):
    """Bahuleyan et al. (2018): the context c_t is latent. Prior N(μ₀, prior_scale²) with μ₀ 0,
    the values' mean or the soft context; posterior N(soft context of q-scores, scale²)."""

    spec = FAMILY_SPECS["gaussian-context"]

    def __init__(self, prior: str = "values-mean", prior_scale: float = 1.0,
                 posterior_scale: float = 0.1):
        cfg = self._configure(prior=prior, prior_scale=prior_scale,
                              posterior_scale=posterior_scale)
        self.prior_kind = cfg["prior"]
        self.prior_scale, self.posterior_scale = cfg["prior_scale"], cfg["posterior_scale"]

    def prior(self, scores, mask, keys, values, params=None):
        shape = scores.shape[:-1] + values.shape[-1:]
        if self.prior_kind == "zero":
            loc = jnp.zeros(shape, values.dtype)
        elif self.prior_kind == "values-mean":
            loc = jnp.broadcast_to(masked_softmax(jnp.zeros_like(scores), mask) @ values, shape)
        else:
            loc = masked_softmax(scores, mask) @ values
        return dist.Normal(loc, jnp.full_like(loc, self.prior_scale)).to_event(1)

    def posterior(self, scores, mask, values, scale=None):
        loc = masked_softmax(scores, mask) @ values
        scale = jnp.full_like(loc, self.posterior_scale) if scale is None else scale
        return dist.Normal(loc, jnp.broadcast_to(scale, loc.shape)).to_event(1)

    def weights(self, value, scores, mask):
        return masked_softmax(scores, mask)

    def context(self, value, values):
        return value


class MarkovCategorical(Family):
    """Hard monotonic (HMM) attention, as :class:`ppl_attention.pyro.families.MarkovCategorical`:

        p(z_t = j | z_{t−1} = i, x, y<t) ∝ exp(e_tj + w_{j−i}),  −max_back ≤ j − i ≤ max_jump,

    z_{−1} = −1. Its one parameter, the jump logits w (key ``"jump_logits"``, zero-initialized),
    comes as ``params``. The exact chain is :meth:`alignment_distribution` (the structure
    library's banded chain recursion, :mod:`ppl_attention.structures.monotonic`); the NumPyro model
    enumerates z_t under ``numpyro.contrib.control_flow.scan``
    (:class:`~ppl_attention.numpyro.models.Seq2SeqAlignment`)."""

    spec = FAMILY_SPECS["markov-categorical"]

    def __init__(self, max_jump: int = 3, max_back: int = 0):
        cfg = self._configure(max_jump=max_jump, max_back=max_back)
        self.max_jump, self.max_back = cfg["max_jump"], cfg["max_back"]

    def has_parameters(self) -> bool:
        return True

    def init(self, key) -> Params:
        return {"jump_logits": jnp.zeros(self.max_back + self.max_jump + 1)}

    def transition_log_probs(self, scores_t, mask, prev, params: Params):
        """log p(z_t = j | z_{t−1} = prev): ``scores_t [B, S]``, ``mask [B, S]``, ``prev`` int
        ``[..., B]`` (−1 before the start; may carry enumeration dims) → ``[..., B, S]``; an
        impossible ``prev`` (or a fully padded row) gets the dummy row z_t = 0, as on the torch
        side."""
        w_all = params["jump_logits"]
        S = scores_t.shape[-1]
        j = jnp.arange(S)
        d = j - prev[..., None]
        ok = (d >= -self.max_back) & (d <= self.max_jump) & mask
        ok = jnp.where(ok.any(-1, keepdims=True), ok, j == 0)
        w = w_all[jnp.clip(d + self.max_back, 0, w_all.shape[0] - 1)]
        # −1e30 rather than −inf: the same probabilities (exp(−1e30) = 0), no NaN gradients
        return masked_log_softmax(scores_t + w, ok)

    def transition_matrix(self, scores_t, mask, params: Params):
        """log T_t[b, i, j] = log p(z_t = j | z_{t−1} = i), ``[B, S, S]``."""
        B, S = scores_t.shape
        prev = jnp.broadcast_to(jnp.arange(S)[:, None], (S, B))
        return jnp.swapaxes(self.transition_log_probs(scores_t, mask, prev, params), 0, 1)

    def start_log_probs(self, scores_t, mask, params: Params):
        """log p(z_0 = j) ``[B, S]``."""
        prev = jnp.full(scores_t.shape[:1], -1)
        return self.transition_log_probs(scores_t, mask, prev, params)

    @property
    def width(self) -> int:
        return self.max_back + self.max_jump + 1

    def banded_transitions(self, scores, mask, params: Params):
        """log p(z_t = i + d − max_back | z_{t−1} = i), ``[B, T, S, W]`` (torch side's
        docstring)."""
        B, T, S = scores.shape
        j = jnp.arange(S)[:, None] + jnp.arange(self.width) - self.max_back  # [S, W]
        jc = jnp.clip(j, 0, S - 1)
        ok = (j >= 0) & (j < S) & mask[:, jc]  # [B, S, W]
        e = scores[:, :, jc]  # [B, T, S, W]
        logits = jnp.where(ok[:, None], e + params["jump_logits"], -jnp.inf)
        any_ok = ok.any(-1, keepdims=True)[:, None]
        logp = jax.nn.log_softmax(jnp.where(any_ok, logits, 0.0), -1)
        return jnp.where(ok[:, None] & any_ok, logp, FLOOR)

    def alignment_distribution(self, scores, mask, emissions, target_mask, params: Params,
                               method: str = "auto"):
        """The chain as a :class:`~ppl_attention.numpyro.structured.MonotonicAlignment`."""
        emis = jnp.where(mask[:, None, :], emissions, FLOOR)
        return MonotonicAlignment(self.start_log_probs(scores[:, 0], mask, params),
                                  self.banded_transitions(scores, mask, params), emis,
                                  target_mask, self.max_back, method)

    def dense_chain(self, scores, mask, emissions, target_mask, params: Params):
        """The same chain over dense S × S transitions, as a
        :class:`~ppl_attention.numpyro.crfs.LinearChainCRF` (torch side's docstring)."""
        T = scores.shape[1]
        trans = jnp.stack([self.transition_matrix(scores[:, t], mask, params)
                           for t in range(T)], 1)
        emis = jnp.where(mask[:, None, :], emissions, -jnp.inf)
        pots = hmm_potentials(jax_ops, self.start_log_probs(scores[:, 0], mask, params), trans,
                              emis)
        return LinearChainCRF(pots, jnp.maximum(target_mask.sum(-1), 1))

    def prior(self, scores, mask, keys, values, params=None):
        raise UserError("MarkovCategorical has no vectorized prior: each z_t depends on "
                         "z_{t-1}; draw it with transition_log_probs in a scan")

    def posterior(self, scores, mask, values, scale=None):
        raise UserError("MarkovCategorical is marginalized exactly; it has no guide family")

    def context(self, value, values):
        return jax.nn.one_hot(value, values.shape[-2], dtype=values.dtype) @ values


class SegmentCRF(Family):
    """Segmentation attention, as :class:`ppl_attention.pyro.families.SegmentCRF`: weights are the
    marginals p(s_j = 1) of a binary linear-chain CRF (unary e_tj, pairwise ``transitions``
    A[s_{j−1}, s_j], key ``"transitions"``), the gradient of the structure library's
    linear-chain log Z (:func:`~ppl_attention.structures.linear_chain.segment_marginals`);
    masked positions leave the chain and get weight 0."""

    spec = FAMILY_SPECS["segment-crf"]

    def has_parameters(self) -> bool:
        return True

    def init(self, key) -> Params:
        return {"transitions": jnp.zeros((2, 2))}

    def log_partition(self, scores, mask, params: Params):
        """log Z ``[...]``."""
        mask = jnp.broadcast_to(mask, scores.shape)
        return segment_log_partition(jax_ops, scores, mask, params["transitions"])

    def marginals(self, scores, mask, params: Params):
        """p(s_j = 1) ``[..., S]`` (0 where masked): the structure library's linear chain."""
        mask = jnp.broadcast_to(mask, scores.shape)
        return segment_marginals(jax_ops, scores, mask, params["transitions"])

    def deterministic_weights(self, scores, mask, params: Params | None = None):
        if mask is None:
            mask = jnp.ones(scores.shape, bool)
        return self.marginals(scores, mask, params)

    def prior(self, scores, mask, keys, values, params=None):
        return None

    def posterior(self, scores, mask, values, scale=None):
        return None


class _SegmentAttention(Family):
    """Attention over segments, as :class:`ppl_attention.pyro.families._SegmentAttention`: a
    :class:`~ppl_attention.numpyro.crfs.SemiMarkovCRF` per query over the source's selected
    segments (:mod:`ppl_attention.structures.segment_selection`); weights the coverage."""

    def __init__(self, max_len: int = 3):
        self.max_len = self._configure(max_len=max_len)["max_len"]

    def selection(self, scores, mask) -> SemiMarkovCRF:
        """p(z | e) for word ``scores [..., T, S]`` and the source ``mask``."""
        mask = jnp.broadcast_to(mask, scores.shape)
        return SemiMarkovCRF(selection_potentials(jax_ops, scores, self.max_len),
                             source_lengths(mask))

    def deterministic_weights(self, scores, mask, params: Params | None = None):
        """The exact coverage marginals (the sampled family's soft baseline and input
        feeding; the marginal family's weights)."""
        if mask is None:
            mask = jnp.ones(scores.shape, bool)
        return self.marginal_weights(scores, mask)

    def marginal_weights(self, scores, mask):
        """The exact coverage marginals p(c_k = 1 | e) ``[..., T, S]`` (0 where masked)."""
        return coverage(jax_ops, self.selection(scores, mask).marginals)

    def map_weights(self, scores, mask):
        """The coverage ``[..., T, S]`` of the MAP selection (the max-semiring's argmax)."""
        return coverage(jax_ops, self.selection(scores, mask).argmax())

    def weights(self, value, scores, mask):
        """The coverage ``[..., T, S]`` of a selection ``value [..., T, S, m, 2, 2]``."""
        return coverage(jax_ops, jnp.asarray(value, scores.dtype))

    def context(self, value, values):
        return coverage(jax_ops, jnp.asarray(value, values.dtype)) @ values

    #: a part is a source position (selected or not): parts ``[..., T, S]``
    part_dims = 1

    def read_positions(self, weights):
        """The positions a selection's weights read (its alignment links), bool."""
        return selected_positions(weights)

    def part_marginals(self, scores, mask):
        """q's exact probability that each part is selected, ``[..., T, S]``."""
        return self.marginal_weights(scores, mask)

    def parts(self, value, dtype):
        """The parts of a selection ``value`` (0/1), ``[..., T, S]``."""
        return coverage(jax_ops, jnp.asarray(value, dtype))

    def part_mask(self, mask):
        """The real parts of a source ``mask [..., S]``: ``[..., S]``."""
        return mask


class _SparseMAPPosterior:
    """As :class:`ppl_attention.pyro.families._SparseMAPPosterior`: q the exact structure, or
    SparseMAP's sparse distribution over at most ``max_active`` of its structures."""

    def _init_sparsemap(self, cfg: dict) -> None:
        self.sparsemap, self.max_active = cfg["sparsemap"], cfg["max_active"]
        self.sparse = self.sparsemap

    def sparsemap_statistics(self):
        """As the Pyro family's: ``None`` (the event itself) unless a family overrides it."""
        return None

    def _posterior_of(self, structure):
        if not self.sparsemap:
            return structure
        return structure.sparsemap(self.max_active, statistics=self.sparsemap_statistics())


class Segments(_SparseMAPPosterior, _SegmentAttention):
    """A sampled selection of source segments per query (``segments-sample``, and SparseMAP
    or a relaxation: :class:`ppl_attention.pyro.families.Segments`)."""

    spec = FAMILY_SPECS["segments"]

    def __init__(self, max_len: int = 3, sparsemap: bool = False, max_active: int | None = None):
        cfg = self._configure(max_len=max_len, sparsemap=sparsemap, max_active=max_active)
        self.max_len = cfg["max_len"]
        self._init_sparsemap(cfg)

    def sparsemap_statistics(self):
        """The coverage, as the Pyro family's."""
        return coverage_statistics(jax_ops)

    def prior(self, scores, mask, keys, values, params=None):
        return self.selection(scores, mask)

    def posterior(self, scores, mask, values, scale=None):
        return self._posterior_of(self.selection(scores, mask))

    def part_marginals(self, scores, mask):
        if self.sparsemap:
            return coverage(jax_ops, self.posterior(scores, mask, None).marginals)
        return self.marginal_weights(scores, mask)


class SegmentMarginals(_SegmentAttention):
    """The exact coverage marginals as weights (``segments-marginals``)."""

    spec = FAMILY_SPECS["segment-marginals"]

    def prior(self, scores, mask, keys, values, params=None):
        return None

    def posterior(self, scores, mask, values, scale=None):
        return None


class _SpanAttention(Family):
    """Attention over spans, as :class:`ppl_attention.pyro.families._SpanAttention`: a
    :class:`~ppl_attention.numpyro.crfs.TreeCRF` per query over labelled binary trees of the
    source, each span read or not (:mod:`ppl_attention.structures.span_selection`); weights the
    sum of the read spans' averages."""

    #: a part is a span [i, j] (read or not): parts ``[..., T, S, S]``
    part_dims = 2

    def __init__(self):
        self._configure()

    def selection(self, scores, mask) -> TreeCRF:
        """p(z | e) for word ``scores [..., T, S]`` and the source ``mask``."""
        mask = jnp.broadcast_to(mask, scores.shape)
        return TreeCRF(span_potentials(jax_ops, scores), source_lengths(mask))

    def deterministic_weights(self, scores, mask, params: Params | None = None):
        """The exact marginal weights (the sampled family's soft baseline and input feeding;
        the marginal family's weights)."""
        if mask is None:
            mask = jnp.ones(scores.shape, bool)
        return self.marginal_weights(scores, mask)

    def marginal_weights(self, scores, mask):
        """E[w(z) | e] ``[..., T, S]`` (0 where masked), from the exact span marginals."""
        return span_weights(jax_ops, self.selection(scores, mask).marginals)

    def map_weights(self, scores, mask):
        """The weights ``[..., T, S]`` of the MAP labelled tree (the max-semiring's argmax)."""
        return span_weights(jax_ops, self.selection(scores, mask).argmax())

    def weights(self, value, scores, mask):
        """The weights ``[..., T, S]`` of labelled trees ``value [..., T, S, S, 2]``."""
        return span_weights(jax_ops, jnp.asarray(value, scores.dtype))

    def context(self, value, values):
        return span_weights(jax_ops, jnp.asarray(value, values.dtype)) @ values

    def read_positions(self, weights):
        """The positions a labelled tree's weights read (its alignment links), bool."""
        return read_positions(weights)

    def part_marginals(self, scores, mask):
        """q's exact probability that each span is read, ``[..., T, S, S]``."""
        return span_parts(self.selection(scores, mask).marginals)

    def parts(self, value, dtype):
        """The read-span indicators of labelled trees ``value``, ``[..., T, S, S]``."""
        return span_parts(jnp.asarray(value, dtype))

    def part_mask(self, mask):
        """The spans [i, j] (i ≤ j) within a source ``mask [..., S]``: ``[..., S, S]``."""
        return span_part_mask(jax_ops, mask)


class Spans(_SparseMAPPosterior, _SpanAttention):
    """A sampled labelled tree per query (``spans-sample``, and SparseMAP or a relaxation:
    :class:`ppl_attention.pyro.families.Spans`)."""

    spec = FAMILY_SPECS["spans"]

    def __init__(self, sparsemap: bool = False, max_active: int | None = None):
        self._init_sparsemap(self._configure(sparsemap=sparsemap, max_active=max_active))

    def prior(self, scores, mask, keys, values, params=None):
        return self.selection(scores, mask)

    def posterior(self, scores, mask, values, scale=None):
        return self._posterior_of(self.selection(scores, mask))

    def part_marginals(self, scores, mask):
        if self.sparsemap:
            return span_parts(self.posterior(scores, mask, None).marginals)
        return span_parts(self.selection(scores, mask).marginals)


class SpanMarginals(_SpanAttention):
    """The exact marginal weights as weights (``spans-marginals``)."""

    spec = FAMILY_SPECS["span-marginals"]

    def prior(self, scores, mask, keys, values, params=None):
        return None

    def posterior(self, scores, mask, values, scale=None):
        return None


def source_lengths(mask):
    """Real source positions of a padding ``mask [..., S]`` (a prefix; checked when concrete)."""
    lengths = mask.sum(-1)
    if not isinstance(mask, jax.core.Tracer):  # checked in NumPy: under jit jnp ops are traced
        m = np.asarray(mask).astype(bool)
        if not np.array_equal(np.arange(m.shape[-1]) < m.sum(-1, keepdims=True), m):
            raise UserError("a structured family (tree, segments, spans) needs the source mask "
                            "to be a prefix of each row (padding at the end)")
    return lengths


class _TreeAttention(Family):
    """As :class:`ppl_attention.pyro.families._TreeAttention`: a dependency tree over the source,
    c_t = Σ_m α_tm [v_m ; Σ_h z_hm v_h ; Σ_c z_mc v_c] (``[..., T, 3·dv]``)."""

    def __init__(self, projective: bool = True, single_root: bool = True):
        cfg = self._configure(projective=projective, single_root=single_root)
        self.projective, self.single_root = cfg["projective"], cfg["single_root"]

    def context_size(self, value_dim: int) -> int:
        return 3 * value_dim

    def tree_distribution(self, scores, mask) -> DependencyTree:
        lengths = source_lengths(mask)
        lengths = lengths.reshape(lengths.shape + (1,) * (scores.ndim - 2 - lengths.ndim))
        return DependencyTree(scores, lengths, projective=self.projective,
                              single_root=self.single_root)

    def prior(self, scores, mask, keys=None, values=None, params=None):
        return self.tree_distribution(scores, mask)

    def posterior(self, scores, mask, values=None, scale=None):
        return self.tree_distribution(scores, mask)

    def arcs(self, value, dtype):
        """Arc indicators of trees ``heads`` (a relaxed draw — arcs already — as it is)."""
        value = jnp.asarray(value)
        if jnp.issubdtype(value.dtype, jnp.floating):
            return value.astype(dtype)
        return heads_to_arcs(value, dtype)

    def tree_context(self, arcs, values, attention_weights):
        S = arcs.shape[-1]
        off = jnp.where(jnp.eye(S, dtype=bool), 0.0, arcs)
        v = values[..., None, :, :] if values.ndim < arcs.ndim else values
        v = jnp.broadcast_to(v, off.shape[:-2] + v.shape[-2:])
        words = jnp.concatenate([v, jnp.swapaxes(off, -1, -2) @ v, off @ v], -1)
        return (attention_weights[..., None, :] @ words)[..., 0, :]


class Tree(_SparseMAPPosterior, _TreeAttention):
    """A latent dependency tree (:class:`ppl_attention.pyro.families.Tree`)."""

    spec = FAMILY_SPECS["tree"]

    def __init__(self, projective: bool = True, single_root: bool = True,
                 sparsemap: bool = False, max_active: int | None = None):
        cfg = self._configure(projective=projective, single_root=single_root,
                              sparsemap=sparsemap, max_active=max_active)
        self.projective, self.single_root = cfg["projective"], cfg["single_root"]
        self._init_sparsemap(cfg)

    def posterior(self, scores, mask, values=None, scale=None):
        return self._posterior_of(self.tree_distribution(scores, mask))


class TreeMarginals(_TreeAttention):
    """Structured attention from exact arc marginals (:class:`ppl_attention.pyro.families.
    TreeMarginals`)."""

    spec = FAMILY_SPECS["tree-marginals"]

    def prior(self, scores, mask, keys=None, values=None, params=None):
        return None

    def posterior(self, scores, mask, values=None, scale=None):
        return None


#: every family of this backend, by name: derived from core/family_specs.py's table
FAMILIES: dict[str, type[Family]] = family_registry(Family, __name__)


def make_family(family=None, *, key_dim: int | None = None, **options) -> Family:
    """A family from an instance (returned as is), a class or a registry name with
    ``options`` (its parameters), or the torch-side instance (its configuration copied); None
    gives Soft — the signature of :func:`ppl_attention.make_family`. ``key_dim``: the key size a
    BAM family's contextual prior network reads (an instance without one gets it now; without
    any, :func:`~ppl_attention.numpyro.attend` takes it from the keys it is given)."""
    if isinstance(family, Family):
        if options:
            raise UserError(f"family options {sorted(options)} given with a family instance; "
                            f"pass the family's name or class instead")
        if key_dim is not None and getattr(family, "key_dim", 0) is None:
            family.key_dim = key_dim
        return family
    if hasattr(family, "_config") and getattr(family, "name", None) in FAMILIES:
        if options:
            raise UserError(f"family options {sorted(options)} given with a family instance")
        return from_torch_family(family)  # the torch-side instance: same name and parameters
    if family is None:
        family = "soft"
    if isinstance(family, str):
        if family not in FAMILIES:
            raise UserError(f"unknown family {family!r}; valid: a Family instance or one of "
                            f"{', '.join(FAMILIES)}")
        family = FAMILIES[family]
    if not (isinstance(family, type) and issubclass(family, Family)):
        raise UserError(f"unknown family {family!r}; valid: a Family instance or one of "
                        f"{', '.join(FAMILIES)}")
    if family.spec is not None:  # an unknown option named before anything is built
        family.spec.validate(**options)
    if key_dim is not None and "key_dim" in inspect.signature(family).parameters:
        options["key_dim"] = key_dim
    return family(**options)


def from_torch_family(family) -> Family:
    """The NumPyro twin of a torch-side family, with the same configuration."""
    cfg = dict(family._config())
    prior_net = getattr(family, "prior_net", None)
    if prior_net is not None:
        cfg["key_dim"] = prior_net[0].in_features
    return FAMILIES[family.name](**cfg)
