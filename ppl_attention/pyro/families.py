"""Alignment families: what is random when a model attends, its prior, its posterior, and how a
draw becomes a context vector — the four questions every family answers.

What a family can do (``enumerable``, ``deterministic``, ``reparameterized``, ``normalizes``,
``markov``) and its parameters are declared once, for both backends, in
:mod:`ppl_attention.core.family_specs`; each class here takes them from its ``spec``.

Shapes throughout: ``scores [..., T, S]`` (logits of query t over source position s),
``values [..., S, dv]``, ``mask [..., T, S]`` bool (True = a real source position; already
broadcast by :func:`ppl_attention.attend`), ``keys [..., S, dk]``.

=====================  ==========================  ==========================================
family                 site value                  weights returned by ``attend``
=====================  ==========================  ==========================================
``Soft``               none (deterministic)        softmax(scores)
``Sparsemax``          none (deterministic)        sparsemax(scores) (exact zeros)
``Entmax``             none (deterministic)        α-entmax(scores) (exact zeros)
``Categorical``        index z ∈ [0, S), ``[..., T]``  the index z
``SparseCategorical``  index z (q: sparsemax)      the index z
``RelaxedCategorical`` simplex point ``[..., T, S]``   the point
``Dirichlet``          simplex point ``[..., T, S]``   the point
``Weibull``            unnormalized S ≥ 0          S / Σ S (Fan et al. 2020, eq. 5)
``LogNormal``          unnormalized S ≥ 0          S / Σ S
``GaussianContext``    context c ``[..., T, dv]``   softmax(scores) of the mean
``Segments``           selected source segments    their coverage ``[..., T, S]`` (0/1)
                       ``[..., T, S, m, 2, 2]``
=====================  ==========================  ==========================================

A masked source position has weight exactly 0 in every family.

Families with parameters (the contextual prior network of ``Weibull``/``LogNormal``) are
``nn.Module`` s: make them a submodule of a model registered with ``pyro.module``, or register
them yourself (``pyro.module("prior", family)``), or their parameters will not train.
"""

from __future__ import annotations

import inspect
import math

import pyro
import pyro.distributions as dist
import pyro.infer.util
import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import UserError
from ..core.family_specs import FAMILY_SPECS, Configured, FamilySpec, family_registry
from ..core.numerics import LOG_ZERO
from ..structures import torch_ops
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
from . import kl as _kl  # noqa: F401  (registers the closed-form KLs the families rely on)
from .crfs import LinearChainCRF, SemiMarkovCRF, TreeCRF
from .distributions import MaskedDirichlet, MaskedRelaxedCategorical
from .sparse import SparsemaxCategorical
from .structured import FLOOR, MonotonicAlignment
from .trees import DependencyTree, heads_to_arcs

__all__ = [
    "Family",
    "Soft",
    "Sparsemax",
    "Entmax",
    "Categorical",
    "SparseCategorical",
    "RelaxedCategorical",
    "Dirichlet",
    "Weibull",
    "LogNormal",
    "GaussianContext",
    "MarkovCategorical",
    "SegmentCRF",
    "Segments",
    "SegmentMarginals",
    "Spans",
    "SpanMarginals",
    "Tree",
    "TreeMarginals",
    "FAMILIES",
    "make_family",
    "copy_family",
    "masked_softmax",
]


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax over the last dim with exactly 0 where ``mask`` is False."""
    if mask is None:
        return scores.softmax(-1)
    return torch.where(mask, scores, torch.full_like(scores, -torch.inf)).softmax(-1)


def masked_log_softmax(scores: torch.Tensor, mask: torch.Tensor | None,
                       floor: float = LOG_ZERO) -> torch.Tensor:
    """log softmax over the last dim with a finite ``floor`` where ``mask`` is False: probability
    exactly 0 there (exp(−1e30) = 0), yet no −inf to turn enumeration or gradients into NaN."""
    if mask is None:
        return scores.log_softmax(-1)
    logp = torch.where(mask, scores, torch.full_like(scores, -torch.inf)).log_softmax(-1)
    return torch.where(mask, logp, torch.full_like(logp, floor))


def _normalize(s: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    s = s * mask
    return s / s.sum(-1, keepdim=True).clamp(min=torch.finfo(s.dtype).tiny)


class Family(Configured, nn.Module):
    """Base contract. Subclasses declare their traits (a ``spec`` from
    :data:`~ppl_attention.core.family_specs.FAMILY_SPECS`, or the class attributes below) and
    implement the four methods.

    ``prior(scores, mask, keys, values)`` → the distribution p(z | ·) sampled in a model (None:
    deterministic). ``posterior(scores, mask, values, scale)`` → q(z | ·) sampled in a guide, from
    the guide's own scores. ``weights(z, scores, mask)`` and ``context(z, values)`` turn a draw
    into the returned attention weights and the context vector ``[..., T, dv]``.
    """

    spec: FamilySpec | None = None
    name: str = ""
    reparameterized: bool = False
    enumerable: bool = False
    deterministic: bool = False  # no latent variable: the weights are a function of the scores
    normalizes: bool = False  # the value is unnormalized S ≥ 0; attention = S / Σ_unmasked S
    markov: bool = False  # z_t depends on z_{t-1}: sequential sites, not one attend call
    tree: bool = False  # the site is a dependency tree over the source (arc scores, attention=)
    segments: bool = False  # the site selects source segments per query (their coverage)
    spans: bool = False  # the site reads constituents of a tree over the source per query
    selects: bool = False  # a selection of parts per query (segments, spans): module docstring
    sparse: bool = False  # weights or q with exact zeros (core/family_specs.py)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("spec")
        if spec is not None:
            cls.name = spec.name
            for trait, value in spec.traits.items():
                setattr(cls, trait, value)

    def deterministic_weights(self, scores, mask):
        """The weights when nothing is sampled (Soft, SegmentCRF), and the "soft" weights a
        model feeds back (input feeding): masked softmax by default."""
        return masked_softmax(scores, mask)

    def prior(self, scores, mask, keys, values):  # pragma: no cover - abstract
        raise NotImplementedError

    def posterior(self, scores, mask, values, scale=None):  # pragma: no cover - abstract
        raise NotImplementedError

    def weights(self, value, scores, mask):
        return value

    def context(self, value, values):
        """Σ_s w_s v_s: ``[..., T, S] @ [..., S, dv]`` → ``[..., T, dv]``."""
        return value @ values

    def context_size(self, value_dim: int) -> int:
        """The size of the context ``attend`` returns for values of size ``value_dim``."""
        return value_dim

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self._config().items())


class Soft(Family):
    """Deterministic soft attention: w = softmax(scores), c = Σ_s w_s v_s. Recorded with
    ``pyro.deterministic`` in a model; no latent variable."""

    spec = FAMILY_SPECS["soft"]

    def prior(self, scores, mask, keys, values):
        return None

    def posterior(self, scores, mask, values, scale=None):
        return None


class Sparsemax(Family):
    """Deterministic sparse attention (Martins & Astudillo 2016): w = sparsemax(scores), the
    Euclidean projection of the scores onto the simplex — exact zeros wherever a score falls
    below the threshold τ, masked positions exactly 0; c = Σ_s w_s v_s. Trained by maximum
    likelihood, as ``Soft`` is (method ``sparsemax``); its Jacobian is the exact one
    (:mod:`ppl_attention.structures.entmax`)."""

    spec = FAMILY_SPECS["sparsemax"]

    def deterministic_weights(self, scores, mask):
        return sparsemax(torch_ops, scores, mask)

    def prior(self, scores, mask, keys, values):
        return None

    def posterior(self, scores, mask, values, scale=None):
        return None


class Entmax(Family):
    """Deterministic α-entmax attention (Peters, Niculae & Martins 2019, eq. 9): w_j = [(α − 1)
    e_j − τ]_+^{1/(α−1)}, between softmax (α → 1) and sparsemax (α = 2) — exact zeros for α > 1.
    α = 1.5 (the default) and 2 are exact by sorting; any other α, or ``learn_alpha=True`` (α
    a parameter of the family, α = 1 + softplus(ρ) from the given start), by bisection with the
    exact implicit Jacobian in the scores and in α. ``n_iter``: the bisection's steps."""

    spec = FAMILY_SPECS["entmax"]

    def __init__(self, alpha: float = 1.5, learn_alpha: bool = False, n_iter: int = 50):
        super().__init__()
        cfg = self._configure(alpha=alpha, learn_alpha=learn_alpha, n_iter=n_iter)
        self.alpha, self.learn_alpha, self.n_iter = cfg["alpha"], cfg["learn_alpha"], cfg["n_iter"]
        if self.learn_alpha:  # ρ with 1 + softplus(ρ) = α
            self.alpha_raw = nn.Parameter(torch.tensor(math.log(math.expm1(self.alpha - 1.0))))

    def current_alpha(self):
        """α: the given number, or 1 + softplus(ρ) when learned (a 0-d tensor)."""
        if self.learn_alpha:
            return 1.0 + F.softplus(self.alpha_raw)
        return self.alpha

    def deterministic_weights(self, scores, mask):
        if self.learn_alpha:
            alpha = self.current_alpha().to(scores.dtype)
            return entmax_bisect(torch_ops, scores, mask, alpha, self.n_iter)
        return entmax(torch_ops, scores, mask, self.alpha, self.n_iter)

    def prior(self, scores, mask, keys, values):
        return None

    def posterior(self, scores, mask, values, scale=None):
        return None


class Categorical(Family):
    """Hard alignment z_t ∈ {0..S−1}: p(z_t = s) = softmax(scores_t)_s (Deng et al. 2018, §3).

    The context is ``one_hot(z) @ values`` so that, under parallel enumeration, the enumerated
    dimension (left of all plates) broadcasts: z of shape ``[S, 1, ..., 1]`` gives a context of
    shape ``[S, ..., 1, dv]``. The returned weights are the index z itself.
    """

    spec = FAMILY_SPECS["categorical"]

    def prior(self, scores, mask, keys, values):
        return dist.Categorical(logits=masked_log_softmax(scores, mask))

    def posterior(self, scores, mask, values, scale=None):
        return dist.Categorical(logits=masked_log_softmax(scores, mask))

    def context(self, value, values):
        one_hot = F.one_hot(value, values.shape[-2]).to(values.dtype)
        return one_hot @ values


class SparseCategorical(Categorical):
    """A categorical alignment whose posterior is sparse (Correia, Niculae, Aziz & Martins 2020,
    §3.1): the model's prior p(z_t | ·) = softmax(e_t), as :class:`Categorical`; the guide's
    q(z_t | x, y) = sparsemax of its scores, exactly 0 outside a small support, so the ELBO
    E_q[log p(y, z | x) − log q(z)] is summed exactly over that support — enumeration at the
    cost of the support (methods ``sparse-marginal``, ``hard-sparse``; a guide enumerates its
    site with ``infer={"enumerate": "parallel"}`` as for ``vae-enum``)."""

    spec = FAMILY_SPECS["sparse-categorical"]

    def posterior(self, scores, mask, values, scale=None):
        return SparsemaxCategorical(sparsemax(torch_ops, scores, mask))


class RelaxedCategorical(Family):
    """Concrete relaxation of the categorical alignment with temperature τ (Jang et al. 2017;
    Maddison et al. 2017). Prior Concrete(τ, scores), posterior Concrete(τ, guide scores)."""

    spec = FAMILY_SPECS["relaxed-categorical"]

    def __init__(self, temperature: float = 0.5):
        super().__init__()
        self.temperature = self._configure(temperature=temperature)["temperature"]

    def prior(self, scores, mask, keys, values):
        return MaskedRelaxedCategorical(self.temperature, scores, mask)

    def posterior(self, scores, mask, values, scale=None):
        return MaskedRelaxedCategorical(self.temperature, scores, mask)


class Dirichlet(Family):
    """Dirichlet alignment (Deng et al. 2018, "relaxed attention").

    Prior: Dirichlet(α₀ · softmax(scores) + ε) — mean the soft attention, total concentration α₀.
    Posterior: Dirichlet(softplus(guide scores) + ε): the inference network sets each
    concentration freely, so it can express both where and how sure.
    """

    spec = FAMILY_SPECS["dirichlet"]

    def __init__(self, concentration: float = 1.0, eps: float = 1e-3):
        super().__init__()
        cfg = self._configure(concentration=concentration, eps=eps)
        self.concentration, self.eps = cfg["concentration"], cfg["eps"]

    def prior(self, scores, mask, keys, values):
        alpha = self.concentration * masked_softmax(scores, mask) + self.eps
        return MaskedDirichlet(alpha, mask)

    def posterior(self, scores, mask, values, scale=None):
        return MaskedDirichlet(F.softplus(scores) + self.eps, mask)


class _BayesianAttention(Family):
    """Shared by the BAM families: a key-dependent contextual prior (Fan et al. 2020, §3.3).

    ``prior="contextual"``: prior mean weights m = softmax_keys(f(k)) with f a key MLP
    ``dk → d_mid → 1``, shared by every query. ``prior="constant"``: m = uniform over the
    unmasked keys (f ≡ 0). ``key_dim`` may be left None; the MLP is then built on first use.
    """

    def _init_prior(self, cfg: dict, key_dim: int | None) -> None:
        self.prior_kind, self.d_mid = cfg["prior"], cfg["d_mid"]
        self.prior_net: nn.Module | None = None
        if self.prior_kind == "contextual" and key_dim is not None:
            self._build_prior_net(key_dim)

    def _build_prior_net(self, key_dim: int, device=None, dtype=None) -> None:
        where = {"device": device, "dtype": dtype}
        self.prior_net = nn.Sequential(
            nn.Linear(key_dim, self.d_mid, **where), nn.ReLU(), nn.Linear(self.d_mid, 1, **where)
        )

    def prior_mean(self, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Prior mean weights ``[..., 1, S]`` (broadcast over queries), 0 where masked."""
        if self.prior_kind == "constant":
            key_scores = torch.zeros(keys.shape[:-1], dtype=keys.dtype, device=keys.device)
        else:
            if self.prior_net is None:  # built on first use, where the keys are
                self._build_prior_net(keys.shape[-1], keys.device, keys.dtype)
            key_scores = self.prior_net(keys).squeeze(-1)
        return masked_softmax(key_scores.unsqueeze(-2), mask)

    def weights(self, value, scores, mask):
        return _normalize(value, mask)


class Weibull(_BayesianAttention):
    """BAM-W: unnormalized weights S_ts ~ Weibull(k, λ_ts), attention S / Σ_s S (Fan et al. 2020).

    Posterior: λ = softmax(scores) / Γ(1 + 1/k), so E[S] = softmax(scores) and, as k → ∞,
    the weights → softmax(scores). Prior: Gamma(α = β · m, rate β) with m the contextual prior
    mean (see :class:`_BayesianAttention`), so E_prior[S] = m. KL(Weibull ‖ Gamma) is analytic
    (:mod:`ppl_attention.pyro.kl`). In a model (no guide scores) the site is drawn from the prior.
    """

    spec = FAMILY_SPECS["weibull"]

    def __init__(self, k: float = 10.0, beta: float = 1.0, prior: str = "contextual",
                 d_mid: int = 10, key_dim: int | None = None):
        super().__init__()
        cfg = self._configure(k=k, beta=beta, prior=prior, d_mid=d_mid)
        self.k, self.beta = cfg["k"], cfg["beta"]
        self._init_prior(cfg, key_dim)

    def prior(self, scores, mask, keys, values):
        m = self.prior_mean(keys, mask).expand(scores.shape)
        alpha = torch.where(mask, self.beta * m, torch.ones_like(m)).clamp(min=1e-6)
        rate = torch.full_like(alpha, self.beta)
        return dist.Gamma(alpha, rate).mask(mask).to_event(1)

    def posterior(self, scores, mask, values, scale=None):
        p = masked_softmax(scores, mask)
        lam = torch.where(mask, p, torch.ones_like(p)).clamp(min=1e-30)
        lam = lam / math.exp(math.lgamma(1 + 1 / self.k))
        return dist.Weibull(lam, torch.full_like(lam, self.k)).mask(mask).to_event(1)


class LogNormal(_BayesianAttention):
    """BAM-L: S_ts ~ LogNormal(μ_ts, σ), attention S / Σ_s S (Fan et al. 2020).

    Posterior: μ = log softmax(scores) − σ²/2, so E[S] = softmax(scores); as σ → 0 the weights
    → softmax(scores). Prior: LogNormal(log m − σ_p²/2, σ_p) with m the contextual prior mean.
    KL(LogNormal ‖ LogNormal) is analytic.
    """

    spec = FAMILY_SPECS["lognormal"]

    def __init__(self, sigma: float = 0.5, prior_sigma: float = 1.0, prior: str = "contextual",
                 d_mid: int = 10, key_dim: int | None = None):
        super().__init__()
        cfg = self._configure(sigma=sigma, prior_sigma=prior_sigma, prior=prior, d_mid=d_mid)
        self.sigma, self.prior_sigma = cfg["sigma"], cfg["prior_sigma"]
        self._init_prior(cfg, key_dim)

    @staticmethod
    def _lognormal(mean_weights, mask, sigma):
        log_m = torch.where(mask, torch.log(mean_weights.clamp(min=1e-30)),
                            torch.zeros_like(mean_weights))
        loc = log_m - sigma**2 / 2
        return dist.LogNormal(loc, torch.full_like(loc, sigma)).mask(mask).to_event(1)

    def prior(self, scores, mask, keys, values):
        m = self.prior_mean(keys, mask).expand(scores.shape)
        return self._lognormal(m, mask, self.prior_sigma)

    def posterior(self, scores, mask, values, scale=None):
        return self._lognormal(masked_softmax(scores, mask), mask, self.sigma)


class GaussianContext(Family):
    """Variational attention of Bahuleyan et al. (2018): the context vector c_t itself is latent.

    Prior: N(μ₀, prior_scale² I) with μ₀ = 0 (``prior="zero"``), the masked mean of the values
    (``"values-mean"``, Bahuleyan's better variant) or the soft context of the prior scores
    (``"soft"``). Posterior: N(Σ_s softmax(q-scores)_s v_s, diag σ²) with σ the ``scale`` passed
    to ``attend`` (e.g. from the inference network) or ``posterior_scale``. The site value is c;
    the returned weights are the soft weights behind the mean.
    """

    spec = FAMILY_SPECS["gaussian-context"]

    def __init__(self, prior: str = "values-mean", prior_scale: float = 1.0,
                 posterior_scale: float = 0.1):
        super().__init__()
        cfg = self._configure(prior=prior, prior_scale=prior_scale,
                              posterior_scale=posterior_scale)
        self.prior_kind = cfg["prior"]
        self.prior_scale, self.posterior_scale = cfg["prior_scale"], cfg["posterior_scale"]

    def prior(self, scores, mask, keys, values):
        shape = scores.shape[:-1] + values.shape[-1:]
        if self.prior_kind == "zero":
            loc = values.new_zeros(shape)
        elif self.prior_kind == "values-mean":
            uniform = masked_softmax(torch.zeros_like(scores), mask)
            loc = (uniform @ values).expand(shape)
        else:
            loc = masked_softmax(scores, mask) @ values
        return dist.Normal(loc, torch.full_like(loc, self.prior_scale)).to_event(1)

    def posterior(self, scores, mask, values, scale=None):
        loc = masked_softmax(scores, mask) @ values
        if scale is None:
            scale = torch.full_like(loc, self.posterior_scale)
        return dist.Normal(loc, scale.expand(loc.shape)).to_event(1)

    def weights(self, value, scores, mask):
        return masked_softmax(scores, mask)

    def context(self, value, values):
        return value


class MarkovCategorical(Family):
    """Hard monotonic (HMM) attention (Wu & Cotterell 2019): z_t depends on z_{t−1} through a
    learned jump distribution over offsets δ = z_t − z_{t−1} ∈ [−max_back, max_jump]:

        p(z_t = j | z_{t−1} = i, x, y<t) ∝ exp(e_tj + w_{j−i}),
        j unmasked and −max_back ≤ j − i ≤ max_jump,

    with e_t the content scores and w learned (zero-initialized); z_{−1} = −1, so z_0 lies in
    the first ``max_jump`` positions. ``max_back=0`` makes it monotonic.
    Marginalized exactly inside :meth:`alignment_distribution` (a
    :class:`~ppl_attention.pyro.structured.MonotonicAlignment`: banded forward recursion or parallel
    scan); :meth:`dense_chain` is the same chain over dense transitions (the structure
    library's linear chain), and sequential
    sites under ``pyro.markov`` with ``TraceEnum_ELBO``
    (``Seq2SeqAlignment.markov_model_enumerated``) the enumerated one; it has no vectorized
    ``prior`` — every z_t needs z_{t−1}.
    """

    spec = FAMILY_SPECS["markov-categorical"]

    def __init__(self, max_jump: int = 3, max_back: int = 0):
        super().__init__()
        cfg = self._configure(max_jump=max_jump, max_back=max_back)
        self.max_jump, self.max_back = cfg["max_jump"], cfg["max_back"]
        self.jump_logits = nn.Parameter(torch.zeros(self.max_back + self.max_jump + 1))  # w_δ

    def transition_log_probs(self, scores_t, mask, prev):
        """log p(z_t = j | z_{t−1} = prev): ``scores_t [B, S]``, ``mask [B, S]`` bool, ``prev``
        long ``[..., B]`` (−1 before the start; may carry enumeration dims) → ``[..., B, S]``.
        An impossible ``prev`` (a padded position, which enumeration also visits with
        probability 0) gets the dummy row z_t = 0 so that nothing becomes NaN."""
        S = scores_t.shape[-1]
        j = torch.arange(S, device=scores_t.device)
        d = j - prev.unsqueeze(-1)  # [..., B, S]
        ok = (d >= -self.max_back) & (d <= self.max_jump) & mask
        ok = torch.where(ok.any(-1, keepdim=True), ok, j == 0)
        w = self.jump_logits[(d + self.max_back).clamp(0, self.jump_logits.numel() - 1)]
        logits = torch.where(ok, scores_t + w, torch.full_like(w, -torch.inf))
        return logits.log_softmax(-1)

    def transition_matrix(self, scores_t, mask):
        """log T_t[b, i, j] = log p(z_t = j | z_{t−1} = i) for every i, ``[B, S, S]``."""
        B, S = scores_t.shape
        prev = torch.arange(S, device=scores_t.device).view(S, 1).expand(S, B)
        return self.transition_log_probs(scores_t, mask, prev).transpose(0, 1)  # [B, i, j]

    def start_log_probs(self, scores_t, mask):
        """log p(z_0 = j) ``[B, S]`` (z_{−1} = −1: offsets 1 … max_jump reach j < max_jump)."""
        prev = torch.full(scores_t.shape[:1], -1, dtype=torch.long, device=scores_t.device)
        return self.transition_log_probs(scores_t, mask, prev)

    @property
    def width(self) -> int:
        """W = max_back + max_jump + 1: the jumps a step can make."""
        return self.max_back + self.max_jump + 1

    def banded_transitions(self, scores, mask):
        """log p(z_t = i + d − max_back | z_{t−1} = i) for every step, ``[B, T, S, W]``, from
        content scores ``[B, T, S]`` and the source ``mask [B, S]``: the numbers of
        :meth:`transition_log_probs` on the band of allowed jumps (a state no position can
        follow — a padded one — has FLOOR everywhere; it is never reached)."""
        B, T, S = scores.shape
        W = self.width
        j = torch.arange(S, device=scores.device)[:, None] + torch.arange(W, device=scores.device) \
            - self.max_back  # [S(i), W]
        jc = j.clamp(0, S - 1)
        ok = (j >= 0) & (j < S) & mask[:, jc]  # [B, S, W]
        e = scores[:, :, jc]  # [B, T, S, W]
        logits = torch.where(ok[:, None], e + self.jump_logits, torch.full_like(e, -torch.inf))
        any_ok = ok.any(-1, keepdim=True)[:, None]
        logp = torch.where(any_ok, logits, torch.zeros_like(logits)).log_softmax(-1)
        return torch.where(ok[:, None] & any_ok, logp, torch.full_like(logp, FLOOR))

    def alignment_distribution(self, scores, mask, emissions, target_mask,
                               method: str = "auto"):
        """The chain as a :class:`~ppl_attention.pyro.structured.MonotonicAlignment` over paths,
        with
        the evidence ``emissions [B, T, S]`` (log p(y_t | z_t = j, ·)) and the real steps
        ``target_mask [B, T]``."""
        emis = emissions.masked_fill(~mask[:, None, :], FLOOR)
        return MonotonicAlignment(self.start_log_probs(scores[:, 0], mask),
                                  self.banded_transitions(scores, mask), emis, target_mask,
                                  self.max_back, method)

    def dense_chain(self, scores, mask, emissions, target_mask):
        """The same chain over dense S × S transitions, as a
        :class:`~ppl_attention.pyro.crfs.LinearChainCRF` (the structure library's one chain
        recursion, :func:`~ppl_attention.structures.linear_chain.hmm_potentials`): its
        ``log_partition`` is log p(y | x) ``[B]``, its marginals summed over the previous state
        p(z_t = j | x, y). Arguments as :meth:`alignment_distribution`'s; the reference the
        banded recursion is checked against."""
        T = scores.shape[1]
        trans = torch.stack([self.transition_matrix(scores[:, t], mask) for t in range(T)], 1)
        emis = emissions.masked_fill(~mask[:, None, :], -torch.inf)
        pots = hmm_potentials(torch_ops, self.start_log_probs(scores[:, 0], mask), trans, emis)
        return LinearChainCRF(pots, target_mask.sum(-1).clamp(min=1))

    def prior(self, scores, mask, keys, values):
        raise UserError("MarkovCategorical has no vectorized prior: each z_t depends on "
                         "z_{t-1}; draw it with transition_log_probs in a pyro.markov loop")

    def posterior(self, scores, mask, values, scale=None):
        raise UserError("MarkovCategorical is marginalized exactly; it has no guide family")

    def context(self, value, values):
        one_hot = F.one_hot(value, values.shape[-2]).to(values.dtype)
        return one_hot @ values


class SegmentCRF(Family):
    """Segmentation attention (Kim et al. 2017, §3.2): a binary linear-chain CRF over the source
    positions, s_j ∈ {0, 1} (is position j selected?),

        p(s | x, q_t) ∝ exp(Σ_j s_j·e_tj + Σ_j A[s_{j−1}, s_j]),

    unary potentials the attention scores e_tj (0 for s_j = 0), pairwise potentials A (2 × 2,
    learned, zero-initialized). The attention weights are the exact marginals
    w_tj = p(s_j = 1 | x, q_t) — not normalized: several positions (a segment) may be selected
    together — the gradient of the structure library's linear-chain log Z (:meth:`marginals`,
    :func:`~ppl_attention.structures.linear_chain.segment_marginals`); the context is
    Σ_j w_tj v_j (Kim et al. eq. 4). Deterministic, like Soft: no sample site. Masked positions
    are removed from the chain (their neighbours become adjacent) and get weight exactly 0.
    """

    spec = FAMILY_SPECS["segment-crf"]

    def __init__(self):
        super().__init__()
        self.transitions = nn.Parameter(torch.zeros(2, 2))  # A[s_{j−1}, s_j]

    def log_partition(self, scores, mask):
        """log Z ``[...]`` from scores ``[..., S]`` and a bool ``mask [..., S]`` (≥ 1 True)."""
        mask = torch.broadcast_to(mask, scores.shape)
        return segment_log_partition(torch_ops, scores, mask, self.transitions)

    def marginals(self, scores, mask):
        """p(s_j = 1) ``[..., S]`` (0 where masked): the structure library's linear chain
        (:func:`~ppl_attention.structures.linear_chain.segment_potentials`)."""
        mask = torch.broadcast_to(mask, scores.shape)
        return segment_marginals(torch_ops, scores, mask, self.transitions)

    def deterministic_weights(self, scores, mask):
        if mask is None:
            mask = torch.ones_like(scores, dtype=torch.bool)
        return self.marginals(scores, mask)

    def prior(self, scores, mask, keys, values):
        return None

    def posterior(self, scores, mask, values, scale=None):
        return None


class _SegmentAttention(Family):
    """Attention over segments (:mod:`ppl_attention.structures.segment_selection`): each query
    t selects source segments of at most ``max_len`` positions, never two adjacent, with

        p(z_t | e_t) ∝ exp⟨c(z_t), e_t⟩,

    c(z_t) ∈ {0, 1}^S the coverage of the selected segments and e_t the query's word scores —
    a :class:`~ppl_attention.pyro.crfs.SemiMarkovCRF` per query (labels 0 unselected, 1
    selected), batch ``[..., T]``, event ``[S, max_len, 2, 2]``. The weights are the coverage,
    the context Σ_k c_k v_k (not normalized: a phrase is read whole; an empty selection reads
    nothing). Masked positions (padding at the end of each row) are outside every selection:
    weight exactly 0. Shared by :class:`Segments` (sampled) and :class:`SegmentMarginals`
    (the exact marginals)."""

    def __init__(self, max_len: int = 3):
        super().__init__()
        self.max_len = self._configure(max_len=max_len)["max_len"]

    def selection(self, scores, mask) -> SemiMarkovCRF:
        """p(z | e) for word ``scores [..., T, S]`` and the source ``mask`` (broadcast to the
        scores; a prefix of each row)."""
        mask = torch.broadcast_to(mask, scores.shape)
        return SemiMarkovCRF(selection_potentials(torch_ops, scores, self.max_len),
                             source_lengths(mask))

    def deterministic_weights(self, scores, mask):
        """The exact coverage marginals (the sampled family's soft baseline and input
        feeding; the marginal family's weights)."""
        if mask is None:
            mask = torch.ones_like(scores, dtype=torch.bool)
        return self.marginal_weights(scores, mask)

    def marginal_weights(self, scores, mask):
        """The exact coverage marginals p(c_k = 1 | e) ``[..., T, S]`` (0 where masked)."""
        return coverage(torch_ops, self.selection(scores, mask).marginals)

    def map_weights(self, scores, mask):
        """The coverage ``[..., T, S]`` of the MAP selection (the max-semiring's argmax)."""
        return coverage(torch_ops, self.selection(scores, mask).argmax())

    def weights(self, value, scores, mask):
        """The coverage ``[..., T, S]`` of a selection ``value [..., T, S, m, 2, 2]``."""
        return coverage(torch_ops, value.to(scores.dtype))

    def context(self, value, values):
        return coverage(torch_ops, value.to(values.dtype)) @ values

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
        return coverage(torch_ops, value.to(dtype))

    def part_mask(self, mask):
        """The real parts of a source ``mask [..., S]``: ``[..., S]``."""
        return mask


class _SparseMAPPosterior:
    """A sampled structured family's posterior: the exact structure q of the guide's scores, or
    with ``sparsemap=True`` SparseMAP's sparse distribution over a few of its structures (at most
    ``max_active``; :class:`~ppl_attention.pyro.sparse.SparseMAP`), which the ``*-sparsemap``
    methods enumerate exactly."""

    def _init_sparsemap(self, cfg: dict) -> None:
        self.sparsemap, self.max_active = cfg["sparsemap"], cfg["max_active"]
        self.sparse = self.sparsemap

    def sparsemap_statistics(self):
        """SparseMAP's regularized statistic (:mod:`ppl_attention.structures.sparsemap`,
        *Statistics*): ``None``, the event itself; a family whose potentials score a linear
        statistic of the event returns it, ``A(events [n, *event]) → [n, F]``."""
        return None

    def _posterior_of(self, structure):
        if not self.sparsemap:
            return structure
        return structure.sparsemap(self.max_active, statistics=self.sparsemap_statistics())


class Segments(_SparseMAPPosterior, _SegmentAttention):
    """A latent selection of source segments per query (:class:`_SegmentAttention`), sampled:
    prior p(z | e) from the model's scores, posterior q(z | x, y) from the guide's (or
    SparseMAP's, ``sparsemap=True``); trained by the score-function ELBO with the exact
    semi-Markov KL (``segments-sample``), by SparseMAP (``segments-sparsemap``) or by a
    relaxation (``segments-perturbed``, ``segments-st``, ``segments-imle``)."""

    spec = FAMILY_SPECS["segments"]

    def __init__(self, max_len: int = 3, sparsemap: bool = False, max_active: int | None = None):
        Family.__init__(self)
        cfg = self._configure(max_len=max_len, sparsemap=sparsemap, max_active=max_active)
        self.max_len = cfg["max_len"]
        self._init_sparsemap(cfg)

    def sparsemap_statistics(self):
        """The coverage: the selection's potentials score ⟨c(z), e⟩, and the quadratic on the
        event would count segments (the projection of near-zero scores then favours few long
        ones); on the coverage, q's coverage at scores e is e's projection on the coverages'
        polytope."""
        return coverage_statistics(torch_ops)

    def prior(self, scores, mask, keys, values):
        return self.selection(scores, mask)

    def posterior(self, scores, mask, values, scale=None):
        return self._posterior_of(self.selection(scores, mask))

    def part_marginals(self, scores, mask):
        """q's probability that each part is selected, ``[..., T, S]`` (SparseMAP's where q is
        sparse)."""
        if self.sparsemap:
            return coverage(torch_ops, self.posterior(scores, mask, None).marginals)
        return self.marginal_weights(scores, mask)


class SegmentMarginals(_SegmentAttention):
    """Structured attention over segments: no site is sampled; the weights are the exact
    coverage marginals p(c_k = 1 | e) = coverage(∂ log Z / ∂θ), differentiable end to end
    (method ``segments-marginals``); the context is the sampled family's expected context."""

    spec = FAMILY_SPECS["segment-marginals"]

    def prior(self, scores, mask, keys, values):
        return None

    def posterior(self, scores, mask, values, scale=None):
        return None


class _SpanAttention(Family):
    """Attention over spans (:mod:`ppl_attention.structures.span_selection`): each query t
    reads constituents of a latent binary tree over the source, each span read or not, with

        p(z_t | e_t) ∝ exp⟨w(z_t), e_t⟩,   w_k(z) = Σ_{read spans [i, j] ∋ k} 1/(j − i + 1),

    e_t the query's word scores — a :class:`~ppl_attention.pyro.crfs.TreeCRF` per query (labels 0
    not read, 1 read), batch ``[..., T]``, event ``[S, S, 2]``. The weights are w, the context
    Σ_k w_k v_k = Σ_{read spans} mean(v_i … v_j) (not normalized, as the segment selection).
    Masked positions (padding at the end of each row) are outside the tree: weight exactly 0.
    Shared by :class:`Spans` (sampled) and :class:`SpanMarginals` (the exact marginals)."""

    #: a part is a span [i, j] (read or not): parts ``[..., T, S, S]``
    part_dims = 2

    def __init__(self):
        super().__init__()
        self._configure()

    def selection(self, scores, mask) -> TreeCRF:
        """p(z | e) for word ``scores [..., T, S]`` and the source ``mask`` (broadcast to the
        scores; a prefix of each row)."""
        mask = torch.broadcast_to(mask, scores.shape)
        return TreeCRF(span_potentials(torch_ops, scores), source_lengths(mask))

    def deterministic_weights(self, scores, mask):
        """The exact marginal weights (the sampled family's soft baseline and input feeding;
        the marginal family's weights)."""
        if mask is None:
            mask = torch.ones_like(scores, dtype=torch.bool)
        return self.marginal_weights(scores, mask)

    def marginal_weights(self, scores, mask):
        """E[w(z) | e] ``[..., T, S]`` (0 where masked), from the exact span marginals."""
        return span_weights(torch_ops, self.selection(scores, mask).marginals)

    def map_weights(self, scores, mask):
        """The weights ``[..., T, S]`` of the MAP labelled tree (the max-semiring's argmax)."""
        return span_weights(torch_ops, self.selection(scores, mask).argmax())

    def weights(self, value, scores, mask):
        """The weights ``[..., T, S]`` of labelled trees ``value [..., T, S, S, 2]``."""
        return span_weights(torch_ops, value.to(scores.dtype))

    def context(self, value, values):
        return span_weights(torch_ops, value.to(values.dtype)) @ values

    def read_positions(self, weights):
        """The positions a labelled tree's weights read (its alignment links), bool."""
        return read_positions(weights)

    def part_marginals(self, scores, mask):
        """q's exact probability that each span is read, ``[..., T, S, S]``."""
        return span_parts(self.selection(scores, mask).marginals)

    def parts(self, value, dtype):
        """The read-span indicators of labelled trees ``value``, ``[..., T, S, S]``."""
        return span_parts(value.to(dtype))

    def part_mask(self, mask):
        """The spans [i, j] (i ≤ j) within a source ``mask [..., S]``: ``[..., S, S]``."""
        return span_part_mask(torch_ops, mask)


class Spans(_SparseMAPPosterior, _SpanAttention):
    """A latent labelled tree per query (:class:`_SpanAttention`), sampled: prior p(z | e) from
    the model's scores, posterior q(z | x, y) from the guide's (or SparseMAP's,
    ``sparsemap=True``); trained by the score-function ELBO with the exact constituency KL
    (``spans-sample``), by SparseMAP or by a relaxation (``spans-sparsemap``,
    ``spans-perturbed``, ``spans-st``, ``spans-imle``)."""

    spec = FAMILY_SPECS["spans"]

    def __init__(self, sparsemap: bool = False, max_active: int | None = None):
        Family.__init__(self)
        self._init_sparsemap(self._configure(sparsemap=sparsemap, max_active=max_active))

    def prior(self, scores, mask, keys, values):
        return self.selection(scores, mask)

    def posterior(self, scores, mask, values, scale=None):
        return self._posterior_of(self.selection(scores, mask))

    def part_marginals(self, scores, mask):
        """q's probability that each span is read, ``[..., T, S, S]`` (SparseMAP's where q is
        sparse)."""
        if self.sparsemap:
            return span_parts(self.posterior(scores, mask, None).marginals)
        return span_parts(self.selection(scores, mask).marginals)


class SpanMarginals(_SpanAttention):
    """Structured attention over spans: no site is sampled; the weights are the exact marginal
    weights E[w(z) | e] (inside–outside), differentiable end to end (method
    ``spans-marginals``); the context is the sampled family's expected context."""

    spec = FAMILY_SPECS["span-marginals"]

    def prior(self, scores, mask, keys, values):
        return None

    def posterior(self, scores, mask, values, scale=None):
        return None


def source_lengths(mask: torch.Tensor) -> torch.Tensor:
    """The number of real source positions of a padding ``mask [..., S]`` (a prefix of each row;
    checked while Pyro's validation is on), ``[...]``."""
    lengths = mask.sum(-1)
    if mask.device.type != "meta" and pyro.infer.util.is_validation_enabled():
        prefix = torch.arange(mask.shape[-1], device=mask.device) < lengths.unsqueeze(-1)
        if not torch.equal(prefix, mask.bool()):
            raise UserError("a structured family (tree, segments, spans) needs the source mask "
                            "to be a prefix of each row (padding at the end)")
    return lengths


class _TreeAttention(Family):
    """Attention through a dependency tree over the source (Kim et al. 2017, §3.3: syntactic
    attention), shared by :class:`Tree` and :class:`TreeMarginals`.

    The site is a tree z (``heads``; a :class:`~ppl_attention.pyro.trees.DependencyTree` of the arc
    scores, one per sentence — scores ``[..., 1, S, S]`` — or one per query ``[..., T, S, S]``).
    Each source word m is read with its parent and its children in z,

        u_m(z) = [v_m ; Σ_h z_hm v_h ; Σ_c z_mc v_c]      (z_hm = 1 when h heads m, h ≠ m),

    and the query attends over the words, α_t = softmax(e_t) (``attention=``, masked), giving
    c_t = Σ_m α_tm u_m(z) ``[..., T, 3·dv]``. u is linear in the arc indicators, so the context
    of the arc marginals μ (:class:`TreeMarginals`) is E_z[c_t(z)], exactly. The returned weights
    are α.
    """

    def __init__(self, projective: bool = True, single_root: bool = True):
        super().__init__()
        cfg = self._configure(projective=projective, single_root=single_root)
        self.projective, self.single_root = cfg["projective"], cfg["single_root"]

    def context_size(self, value_dim: int) -> int:
        """The size of the context vector for values of size ``value_dim``: 3·dv."""
        return 3 * value_dim

    def tree_distribution(self, scores, mask) -> DependencyTree:
        """p(z | scores) for arc ``scores [..., S, S]`` and the source ``mask [..., S]``."""
        lengths = source_lengths(mask)
        lengths = lengths.reshape(lengths.shape + (1,) * (scores.dim() - 2 - lengths.dim()))
        return DependencyTree(scores, lengths, projective=self.projective,
                              single_root=self.single_root)

    def prior(self, scores, mask, keys=None, values=None):
        return self.tree_distribution(scores, mask)

    def posterior(self, scores, mask, values=None, scale=None):
        return self.tree_distribution(scores, mask)

    def arcs(self, value, dtype) -> torch.Tensor:
        """Arc indicators ``[..., S, S]`` of trees ``heads [..., S]`` (a relaxed draw — arcs
        already, floating point — as it is)."""
        if value.is_floating_point():
            return value.to(dtype)
        return heads_to_arcs(value, dtype)

    def tree_context(self, arcs, values, attention_weights):
        """c_t = Σ_m α_tm [v_m ; parent_m ; children_m] from arc weights ``arcs [..., 1|T, S, S]``
        (indicators or marginals), ``values [..., S, dv]`` and ``attention_weights [..., T, S]``
        → ``[..., T, 3·dv]``."""
        S = arcs.shape[-1]
        off = arcs.masked_fill(torch.eye(S, dtype=torch.bool, device=arcs.device), 0.0)
        v = values.unsqueeze(-3) if values.dim() < arcs.dim() else values
        v = v.expand(*off.shape[:-2], *v.shape[-2:])
        words = torch.cat([v, off.transpose(-1, -2) @ v, off @ v], -1)  # [..., 1|T, S, 3dv]
        return (attention_weights.unsqueeze(-2) @ words).squeeze(-2)


class Tree(_SparseMAPPosterior, _TreeAttention):
    """A latent dependency tree (the module docstring of :class:`_TreeAttention`): the site is
    sampled — prior p(z | x) from the model's arc scores, posterior q(z | x, y) from the guide's
    (or SparseMAP's over trees, ``sparsemap=True``) — and trained by the score-function ELBO
    with the exact tree KL (``tree-sample``), by SparseMAP or a relaxation (``tree-sparsemap``,
    ``tree-perturbed``, ``tree-st``, ``tree-imle``), or summed out exactly when the emission
    factors over arcs (``tree-exact``)."""

    spec = FAMILY_SPECS["tree"]

    def __init__(self, projective: bool = True, single_root: bool = True,
                 sparsemap: bool = False, max_active: int | None = None):
        Family.__init__(self)
        cfg = self._configure(projective=projective, single_root=single_root,
                              sparsemap=sparsemap, max_active=max_active)
        self.projective, self.single_root = cfg["projective"], cfg["single_root"]
        self._init_sparsemap(cfg)

    def posterior(self, scores, mask, values=None, scale=None):
        return self._posterior_of(self.tree_distribution(scores, mask))


class TreeMarginals(_TreeAttention):
    """Structured (syntactic) attention of Kim et al. (2017): no site is sampled; the context
    is built from the exact arc marginals μ = ∂ log Z / ∂θ, differentiable end to end (method
    ``tree-marginals``)."""

    spec = FAMILY_SPECS["tree-marginals"]

    def prior(self, scores, mask, keys=None, values=None):
        return None

    def posterior(self, scores, mask, values=None, scale=None):
        return None


#: every family of this backend, by name: derived from core/family_specs.py's table
FAMILIES: dict[str, type[Family]] = family_registry(Family, __name__)


def make_family(family=None, *, key_dim: int | None = None, **options) -> Family:
    """A :class:`Family` from an instance (returned as is), a class or a registry name
    (``"categorical"`` …) with ``options`` (its parameters); None gives Soft. ``key_dim``: the key
    size a BAM family's contextual prior network needs (ignored by families without one; an
    instance whose network is not built yet gets it built now, so that a model calling
    ``make_family(family, key_dim=…)`` in its constructor owns the network's parameters)."""
    if isinstance(family, Family):
        if options:
            raise UserError(f"family options {sorted(options)} given with a family instance; "
                            f"pass the family's name or class instead")
        if key_dim is not None and getattr(family, "prior_kind", None) == "contextual" \
                and getattr(family, "prior_net", 1) is None:
            family._build_prior_net(key_dim)  # the model knows the key size: build it now
        return family
    if family is None:
        family = "soft"
    if isinstance(family, str):
        if family not in FAMILIES:
            raise UserError(f"unknown family {family!r}; valid: a ppl_attention Family instance "
                            f"or one of {', '.join(FAMILIES)}")
        family = FAMILIES[family]
    if not (isinstance(family, type) and issubclass(family, Family)):
        raise UserError(f"unknown family {family!r}; valid: a ppl_attention Family instance or "
                        f"one of {', '.join(FAMILIES)}")
    if family.spec is not None:  # an unknown option named before anything is built
        family.spec.validate(**options)
    if key_dim is not None and "key_dim" in inspect.signature(family).parameters:
        options["key_dim"] = key_dim
    return family(**options)


def copy_family(family: Family, key_dim: int | None = None) -> Family:
    """A new family of the same class and parameters (own parameters, untrained), e.g. one per
    layer of a network; ``key_dim`` for a BAM family's prior network."""
    return make_family(type(family), key_dim=key_dim, **family._config())
