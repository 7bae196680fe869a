"""The methods registry for NumPyro, built from the same specs as the Pyro one
(:mod:`ppl_attention.core.method_specs`): the same names, families, guides, enumeration and KL
annealing; the ELBO class is mapped to NumPyro's.

Two gaps of NumPyro are filled here with the same maths as Pyro computes:

- its ``TraceGraph_ELBO`` has no baselines and its ``Trace_ELBO`` gives a silently biased
  gradient for a categorical guide site (measured against the exact gradient), so the REINFORCE
  methods (``hard-sample``, ``vae-sample``) use :func:`score_function_loss`: the per-token
  surrogate of Pyro's TraceGraph_ELBO with the same soft-attention baseline;
- its ``TraceEnum_ELBO`` enumerates model sites only, so the methods that enumerate the
  *guide* (``hard-enum``, ``vae-enum``) use :func:`enumerated_guide_loss`, the exact
  Σ_z q(z)[log p(y, z) − log q(z)] that Pyro's TraceEnum_ELBO computes for them.

A model with latents beside the alignment that its guide draws (``latents``: the sequence VAE's
z) takes the enumerated losses at the guide's draw of them, as Pyro's TraceEnum_ELBO does:
:func:`enumerated_guide_loss` adds their terms once (not per alignment value), and ``exact``
takes :func:`latent_enumerated_loss` — the alignment summed out given them — in place of the
exact marginal; the score-function losses refuse such a model.

``hmm-exact`` (the Markov family) is the model of
:meth:`~ppl_attention.numpyro.models.Seq2SeqAlignment.model`, z_t enumerated under
``numpyro.contrib.control_flow.scan``; ``numpyro.contrib.funsor.log_density`` of it equals the
forward algorithm (tested). NumPyro's ``TraceEnum_ELBO`` does not contract a scan's time
dimension (it returns a wrong value for this model), and the gradient of ``log_density`` is NaN
wherever a monotonic transition is structurally impossible (funsor's log-space einsum takes
log 0 and its backward multiplies 0 by ∞), so this method differentiates the same quantity,
−log p(y | x), computed by the hand-written forward scan
(:class:`~ppl_attention.numpyro.structured.MonotonicAlignment`, the chain of the family):
loss kind ``"exact-marginal"``. ``exact`` (a categorical site enumerated in the model) takes the
same loss kind: the enumerated marginal −Σ_t log Σ_j p(z_t = j) p(y_t | z_t = j) read off the
model's ``[B, T, S]`` emission table, which is what TraceEnum_ELBO contracts to (tested equal),
at the cost of a hand-written step.

``vae-rws`` has no NumPyro counterpart (NumPyro has no reweighted wake-sleep) and is refused
with a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

import jax
import jax.numpy as jnp
from numpyro import handlers
from numpyro.distributions.kl import kl_divergence
from numpyro.infer import Trace_ELBO, TraceEnum_ELBO, TraceMeanField_ELBO

from ...core.errors import UserError
from ...core.method_specs import METHOD_SPECS, MethodSpec, method_spec
from ...core.schedules import kl_annealing
from ..families import Family, make_family
from ..traces import replay, site_log_prob
from .relaxation import relax

PLATES = 2

_ELBOS = {"TraceEnum_ELBO": TraceEnum_ELBO, "Trace_ELBO": Trace_ELBO,
          "TraceMeanField_ELBO": TraceMeanField_ELBO, "TraceGraph_ELBO": None,
          "ScoreFunctionKL_ELBO": None}

#: methods NumPyro cannot run, and why
NOT_MIRRORED = {"ReweightedWakeSleep": "NumPyro has no reweighted wake-sleep"}


@dataclass(frozen=True)
class Method:
    """A :class:`~ppl_attention.core.method_specs.MethodSpec` seen from NumPyro (every spec field
    readable here)."""

    spec: MethodSpec
    options: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))

    def __getattr__(self, item):  # name, posterior, enumerate_*, baseline …
        return getattr(self.spec, item)

    @property
    def elbo_name(self) -> str:
        return self.spec.objective

    def family(self, key_dim: int | None = None) -> Family:
        return make_family(self.spec.family, key_dim=key_dim,
                           **self.spec.family_kwargs(dict(self.options)))

    def guide_program(self, guide, rng_key=None, perturbation: dict | None = None):
        """The guide as the method runs it: its structured draws relaxed (``rng_key``: their
        noise; ``perturbation``: ``{site: ε}``, the noise given) for a relaxed method, as the
        Pyro side's."""
        if self.spec.relaxation is None:
            return guide
        return relax(guide, self.spec.relaxation, rng_key=rng_key, perturbation=perturbation,
                     **self.spec.relaxation_kwargs(dict(self.options)))

    def kl_scale(self, step: int, weight: float = 1.0, rho: float | None = None) -> float:
        """As the Pyro side's: η·λ(t), λ ≡ 1 unless the method anneals."""
        if self.spec.anneal_rho is None:
            return weight
        return kl_annealing(step, rho if rho is not None else self.spec.anneal_rho, weight)

    @property
    def loss_kind(self) -> str:
        """``"score-function"``, ``"score-function-kl"`` (:func:`score_function_kl_loss`),
        ``"enumerated-guide"``, ``"exact-marginal"`` (an alignment
        enumerated in the model: −log p(y | x) from the model's emission table, the number
        TraceEnum_ELBO computes, without its funsor contraction — and for the Markov family the
        only way NumPyro gets it right) or ``"elbo"`` (a NumPyro ELBO object)."""
        if self.spec.enumerate_model and self.spec.family_spec.enumerable:
            return "exact-marginal"
        if self.spec.objective == "TraceGraph_ELBO":
            return "score-function"
        if self.spec.objective == "ScoreFunctionKL_ELBO":
            return "score-function-kl"
        if self.spec.enumerate_guide:
            return "enumerated-guide"
        return "elbo"

    def elbo(self):
        """NumPyro's ELBO object of the method's objective (``TraceMeanField_ELBO``, …); for
        ``Trace_ELBO`` the equivalent :class:`TraceELBO`, which replays the guide's draws into
        the model with their intermediates."""
        if self.loss_kind != "elbo":
            raise UserError(f"{self.name} trains with {self.loss_kind} loss, not an ELBO object")
        return make_elbo(self.elbo_name)


def make_elbo(name: str):
    """A NumPyro ELBO by its class name (only TraceEnum_ELBO takes ``max_plate_nesting``);
    ``Trace_ELBO`` is :class:`TraceELBO`."""
    cls = _ELBOS[name]
    if cls is Trace_ELBO:
        return TraceELBO()
    return cls(max_plate_nesting=PLATES) if cls is TraceEnum_ELBO else cls()


class TraceELBO:
    """NumPyro's ``Trace_ELBO`` with one particle — log p(y, z | x) − log q(z | x, y) at one
    draw z ~ q, every site's log-density summed (scaled) —, the draw replayed into the model
    with its intermediates (:func:`ppl_attention.numpyro.traces.replay`): a relaxed draw is
    scored by its exact logarithm on both sides, where NumPyro's replay would score its
    underflowed value in the model."""

    def loss(self, rng_key, params, model, guide, *args, **kwargs):
        model_key, guide_key = jax.random.split(rng_key)
        g = handlers.trace(handlers.seed(handlers.substitute(guide, data=params), guide_key)
                           ).get_trace(*args, **kwargs)
        m = handlers.trace(handlers.seed(replay(handlers.substitute(model, data=params), g),
                                         model_key)).get_trace(*args, **kwargs)
        log_p = sum((site_log_prob(s).sum() for s in m.values() if s["type"] == "sample"),
                    jnp.zeros(()))
        log_q = sum((site_log_prob(s).sum() for s in g.values() if s["type"] == "sample"),
                    jnp.zeros(()))  # a guide's factors too, as in Pyro's and NumPyro's
        return -(log_p - log_q)


METHODS: dict[str, Method] = {name: Method(spec, MappingProxyType(spec.resolve_options()))
                              for name, spec in METHOD_SPECS.items()
                              if spec.objective not in NOT_MIRRORED}


def get_method(name: str, options: dict | None = None) -> Method:
    """The method ``name`` with its method ``options`` resolved (the Pyro side's
    :func:`~ppl_attention.pyro.inference.methods.get_method`)."""
    spec = method_spec(name)
    if spec.objective in NOT_MIRRORED:
        raise UserError(f"method {name!r} has no NumPyro counterpart "
                        f"({NOT_MIRRORED[spec.objective]}); use --backend pyro, or one of "
                        f"{', '.join(METHODS)}")
    if not options:
        return METHODS[name]
    return Method(spec, MappingProxyType(spec.resolve_options(options)))


def _site_terms(trace, name):
    return site_log_prob(trace[name])


def _token_terms(trace, batch, skip=()):
    """Σ of the log-densities of ``trace``'s sample sites (all but those named in ``skip``),
    each of which must broadcast to the tokens ``[..., B, T]`` — the per-token cost the
    score-function and enumerated-guide losses take (the z_t of one site under the target plate
    are conditionally independent given x and y)."""
    B, T = batch.tgt_out.shape
    skip = (skip,) if isinstance(skip, str) else tuple(skip)
    total = 0.0
    for name, site in trace.items():
        if site["type"] != "sample" or name in skip:
            continue
        lp = _site_terms(trace, name)
        if lp.ndim < 2 or tuple(lp.shape[-2:]) not in ((B, T), (1, T), (B, 1), (1, 1)):
            raise UserError(f"site {name!r} has log-density of shape {list(lp.shape)}; this "
                            f"loss needs every site of the model under the [batch, target] = "
                            f"[{B}, {T}] plates")
        total = total + lp
    return total


def score_function_loss(rng_key, params, model, guide, batch, baseline, site: str = "align"):
    """(surrogate loss, −ELBO), both summed over the batch, for a sampled categorical guide
    site ``site``; ``params`` the param map, ``model`` / ``guide`` the programs with the
    method's switches bound.

    Per token, ℓ_t = log p(y_t | z_t) + log p(z_t | ·) − log q(z_t | ·) (every model site at
    token t; the z_t are conditionally independent given x, y, so ℓ_t is z_t's whole
    downstream cost, as Pyro's TraceGraph_ELBO computes it under the target plate). The
    surrogate is Pyro's: −Σ_t [log p(y_t, z_t | ·) + stop_grad(ℓ_t − b_t) · log q(z_t)] — the
    REINFORCE gradient with baseline b; like TraceGraph_ELBO it leaves out the term −∇ log
    q(z_t) at the drawn z_t (zero in expectation), so both backends give the same gradient at
    the same draw.
    """
    g = handlers.trace(handlers.seed(handlers.substitute(guide, data=params), rng_key)
                       ).get_trace(batch)
    m = handlers.trace(handlers.seed(replay(handlers.substitute(model, data=params), g),
                                     rng_key)).get_trace(batch)
    log_q = _site_terms(g, site)
    log_p = _token_terms(m, batch)
    elbo_t = log_p - log_q
    mask = batch.tgt_mask
    cost = jax.lax.stop_gradient(jnp.where(mask, elbo_t - baseline, 0.0))
    surrogate = jnp.where(mask, log_p + cost * log_q, 0.0).sum()
    return -surrogate, -jnp.where(mask, elbo_t, 0.0).sum()


def _per_pair(x, B: int):
    """Sum every dim of ``x`` but the batch (the first of ``[B, …]``, broadcast if 1): ``[B]``."""
    x = jnp.asarray(x)
    if x.ndim == 0:
        return jnp.broadcast_to(x / B, (B,))
    return jnp.broadcast_to(x.reshape(x.shape[0], -1).sum(-1), (B,))


def score_function_kl_loss(rng_key, params, model, guide, batch, baseline, site: str = "align"):
    """(surrogate loss, −ELBO) of Pyro's ``ScoreFunctionKL_ELBO``
    (:mod:`ppl_attention.pyro.inference.elbo`, same maths): ELBO = log p(y | z) − KL(q ‖ p) with the
    closed-form KL of the site ``site``; surrogate adds stop_grad(r_b − b_b)·log q(z_b) per pair,
    r_b the pair's log p(y_b | z), b_b its baseline (per token ``[B, T]`` summed, or 0). A
    site the guide drew relaxed (``infer["relaxed"]``: :mod:`.relaxation`) takes no score term:
    the surrogate is the ELBO itself, differentiated through the relaxed draw."""
    g = handlers.trace(handlers.seed(handlers.substitute(guide, data=params), rng_key)
                       ).get_trace(batch)
    m = handlers.trace(handlers.seed(replay(handlers.substitute(model, data=params), g),
                                     rng_key)).get_trace(batch)
    B = batch.tgt_out.shape[0]
    q, p = g[site], m[site]
    kl = kl_divergence(q["fn"], p["fn"])
    if p.get("scale") is not None:
        kl = kl * p["scale"]
    reward = sum(_per_pair(_site_terms(m, n), B) for n, s in m.items()
                 if s["type"] == "sample" and n != site)
    elbo = reward.sum() - kl.sum()
    if q["infer"].get("relaxed"):  # a pathwise gradient through the relaxed draw
        return -elbo, -elbo
    b = _per_pair(baseline, B) if jnp.ndim(baseline) else 0.0
    log_q = _per_pair(site_log_prob(q, scaled=False), B)
    surrogate = elbo + (jax.lax.stop_gradient(reward - b) * log_q).sum()
    return -surrogate, -elbo


def _drawn_latents(guide_trace, site: str) -> dict:
    """The values of the guide's latent sites other than the alignment ``site`` — a global z
    the guide draws (the sequence VAE's), which the model is run at."""
    return {n: s["value"] for n, s in guide_trace.items()
            if s["type"] == "sample" and not s["is_observed"] and n != site}


def _sum_terms(trace, names) -> jnp.ndarray:
    """Σ of the whole log-densities (scaled) of ``trace``'s sample sites named in ``names``."""
    return sum((_site_terms(trace, n).sum() for n in names
                if n in trace and trace[n]["type"] == "sample"), jnp.zeros(()))


def enumerated_guide_loss(rng_key, params, model, guide, batch, site: str = "align"):
    """−Σ_{b,t} Σ_j q(z_t = j)[log p(y_t | z_t = j) + log p(z_t = j) − log q(z_t = j)]: the exact
    ELBO of a categorical guide site ``site``, summed over the batch (Pyro: TraceEnum_ELBO with
    the guide site enumerated) — over q's support where it is sparse (a sparsemax q; SparseMAP's
    slots, ``[K, B, T]``); for one structure per sentence (a tree, ``[K, B, 1]``)
    −Σ_b Σ_k q_k [Σ_t log p(y_t | z_k) + log p(z_k) − log q_k]. The model is run once with
    z = every value of the site's support, broadcast on a new leftmost dim, exactly as parallel
    enumeration does.

    Other latents the guide draws (a global z: the sequence VAE's) are kept at the guide's draw
    (the model runs at it): their model log-densities are added and the guide's other sites
    (theirs, and a factor such as free bits) subtracted once, not per alignment value — a
    one-draw estimate over them, the enumerated sum over the alignment given them."""
    g = handlers.trace(handlers.seed(handlers.substitute(guide, data=params), rng_key)
                       ).get_trace(batch)
    q_site = g[site]
    support = q_site["fn"].enumerate_support(expand=False)  # [K, 1, 1]
    drawn = _drawn_latents(g, site)
    conditioned = handlers.condition(handlers.substitute(model, data=params),
                                     data={site: support, **drawn})
    m = handlers.trace(handlers.seed(conditioned, rng_key)).get_trace(batch)
    log_q = q_site["fn"].log_prob(support)
    q = jnp.exp(log_q)
    if q_site.get("scale") is not None:
        log_q = log_q * q_site["scale"]
    B, T = batch.tgt_out.shape
    if log_q.shape[-1] == 1 and T > 1:  # one structure per sentence (a tree): [K, B, 1]
        site_terms = _site_terms(m, site) - log_q  # log p(z_k) − log q_k, once per sentence
        tokens = jnp.where(batch.tgt_mask, _token_terms(m, batch, skip=(*drawn, site)), 0.0)
        elbo = (q[..., 0] * (tokens.sum(-1) + site_terms[..., 0])).sum()
    else:
        terms = q * (_token_terms(m, batch, skip=drawn) - log_q)
        elbo = jnp.where(batch.tgt_mask, terms.sum(0), 0.0).sum()
    if drawn:
        elbo = elbo + _sum_terms(m, drawn) - _sum_terms(g, [n for n in g if n != site])
    return -elbo


def latent_enumerated_loss(rng_key, params, model, guide, batch, site: str = "align",
                           nest: int = PLATES):
    """−ELBO of a model whose guide draws latents besides the alignment (a global z: the
    sequence VAE's) and whose alignment site ``site`` is enumerated in the model: −[Σ_{b,t}
    log Σ_j p(z_t = j | ·) p(y_t | z_t = j, ·) + log p(latents) − log q(latents)] at the
    guide's draw, summed over the batch (Pyro: TraceEnum_ELBO with the alignment enumerated in
    the model and z from the guide). The alignment is enumerated by
    ``numpyro.contrib.funsor.enum``; every other model site is under the [batch, target]
    plates; the guide's sites (z, a free-bits factor) are subtracted whole."""
    from numpyro.contrib.funsor import enum

    g = handlers.trace(handlers.seed(handlers.substitute(guide, data=params), rng_key)
                       ).get_trace(batch)
    drawn = _drawn_latents(g, site)
    program = handlers.condition(handlers.substitute(model, data=params), data=drawn)
    m = handlers.trace(enum(handlers.seed(program, rng_key), first_available_dim=-1 - nest)
                       ).get_trace(batch)
    enumerated = [n for n, s in m.items() if s["type"] == "sample" and not s["is_observed"]
                  and s["infer"].get("enumerate") == "parallel"]
    if enumerated not in ([site], []):
        raise UserError(f"the enumerated loss sums out one alignment site {site!r}; the model "
                        f"enumerates {', '.join(enumerated) or 'none'}")
    B, T = batch.tgt_out.shape
    joint = _token_terms(m, batch, skip=drawn)
    joint = jnp.broadcast_to(joint, (*jnp.shape(joint)[:-2], B, T)).reshape(-1, B, T)
    ll = jnp.where(batch.tgt_mask, jax.nn.logsumexp(joint, 0), 0.0).sum()
    return -(ll + _sum_terms(m, drawn) - _sum_terms(g, list(g)))
