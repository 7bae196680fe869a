"""The model contract: what a model provides so that every inference method trains it and every
tool — ``fit``, ``evaluate``, ``align``, ``analyze``, ``diagnose``, ``decode``, ``compare``,
``sweep`` — works on it. Built-in models and a researcher's own model meet the same contract;
``--model path/to/file.py:MyModel`` (or ``package.module:MyModel``) loads one by its location.

A model is a ``torch.nn.Module``; subclass :class:`AlignmentModel` to get the defaults below.
Shapes are those of the data the model reads; for ``data = "pairs"`` (the default) a batch is a
:class:`~ppl_attention.data.Batch` of B pairs: ``src [B, S]`` ids, ``src_mask [B, S]`` (False on
padding), ``tgt_in [B, T]`` (``<bos> y_1 … y_n``), ``tgt_out [B, T]`` (``y_1 … y_n <eos>``),
``tgt_mask [B, T]``.

Required members
----------------
``__init__(self, src_vocab, tgt_vocab, *, family, **options)``
    The data's dimensions (for ``"pairs"``: source and target vocabulary sizes, the special
    tokens ``<unk> <pad> <bos> <eos>`` included, ids 0–3 in that order), ``family`` — the family a
    method chooses (a :class:`~ppl_attention.pyro.families.Family`; sample it with ``pa.attend``) —
    and the model's own options as keyword arguments with defaults (int, float, str or bool).
    The command line offers every option as ``--name`` (``train --model X --help`` lists them)
    and refuses options the model does not have. :class:`AlignmentModel` records the arguments
    in ``self.config`` so that a run directory rebuilds the model as ``cls(**config,
    family=…)``; they must be JSON values.
``model(batch, *, enumerate_z=False, kl_scale=1.0)``
    The generative program p(y, z | x). Write each alignment with ``pa.attend(site, scores,
    values, self.family, mask=src_mask, …)`` inside ``pyro.plate("batch", B, dim=-2)`` and
    ``pyro.plate("target", T, dim=-1)``, so the site has batch shape ``[B, T]`` and ranges over
    the S source positions. ``enumerate_z=True`` asks for parallel enumeration of the site
    (``infer={"enumerate": "parallel"}``, and no ``target_mask`` on it); ``kl_scale`` multiplies
    the log-density of the alignment site (``poutine.scale``; BAM's KL annealing). Observe the
    targets with ``pyro.sample("y", dist.Categorical(logits=…).mask(tgt_mask), obs=tgt_out)`` or
    ``pyro.factor`` of a ``[B, T]`` log-likelihood that is 0 on padding.
``guide(batch, *, posterior="inference", enumerate_z=False, kl_scale=1.0, baseline=None)``
    The guide of the alignment site: ``posterior="none"`` — nothing (exact methods); ``"prior"``
    — the prior's distribution again, from the model's own scores (hard attention, BAM);
    ``"inference"`` — an amortized q(z | x, y) from scores the guide computes (it may read the
    target). Sample it with ``pa.attend(site, q_scores, values, self.family, mask=…,
    guide=True, target_mask=tgt_mask, infer=…)`` under the same plates; ``enumerate_z`` asks for
    an enumerated guide site, ``baseline`` (``[B, T]``) is a REINFORCE baseline value to pass as
    ``infer={"baseline": {"baseline_value": baseline}}``, and ``kl_scale`` scales the site as in
    the model. Other latent variables of the model (a global z) are the guide's business.

Declarations (class attributes, defaults in :class:`AlignmentModel`)
--------------------------------------------------------------------
``data = "pairs"``: which data feeds the model (:data:`~ppl_attention.data.kinds.DATA_KINDS`).
``latents = ()``: the names of latent sites other than the alignment (a global z); with any, the
generic exact capabilities below do not apply (the likelihood then needs z integrated out).
``posteriors = ("none", "prior", "inference")``: the ``posterior`` values the guide offers; a
method needing another is refused. ``families = None``: the family names the model supports
(None: every family ``attend`` can sample, i.e. not ``markov``). ``site = "align"``: the
alignment site's name. ``max_plate_nesting = 2``. ``training_defaults = {}``: the model's own
defaults for training options (``lr``, ``steps``, ``batch_size``, ``clip``, ``weight_decay``,
``kl_weight``, ``anneal_rho``, ``valid_every``). ``numpyro_twin = None``: ``"module:Class"`` of
a NumPyro twin (same names and maths, see ``ppl_attention.numpyro.models.Seq2SeqAlignment``);
without one, ``--backend numpyro`` is refused for the model.

Capabilities (optional members that unlock tools)
-------------------------------------------------
=====================  ===========================================  =========================
capability             member (shapes)                              unlocks
=====================  ===========================================  =========================
``alignment``          ``data = "pairs"`` and the site layout above  ``align``, AER, ``analyze``,
                                                                     ``diagnose``
``exact-likelihood``   ``exact_token_log_likelihood(batch)``         exact NLL in ``evaluate``
                       → log p(y_t | x, y<t) ``[B, T]``, 0 on pad    (else an IWAE-K bound)
``exact-posterior``    ``exact_posterior(batch)`` → p(z_t = j | x,   exact MAP alignments,
                       y) ``[B, T, S]``                              ``exact_posterior`` group,
                                                                     KL(exact ‖ q)
``posterior-samples``  ``posterior_samples(batch, num_samples,       exact posterior draws in
                       generator)`` → source positions ``[K, B, T]``  ``analyze``
``prior``              ``prior_probs(batch)`` → p(z_t = j | x, y<t)   prior heatmaps
                       ``[B, T, S]``
``soft-likelihood``    ``soft_token_log_likelihood(batch)`` ``[B,    the REINFORCE baseline of
                       T]``: the soft-attention model's                ``hard-sample``,
                       log-likelihood                                ``vae-sample``
``predictive``         ``start_decoding(src_ids)``,                  ``decode``, WER/PER
                       ``decoding_step(state, prev)``,
                       ``keep_hypotheses(state, rows, tokens)``
=====================  ===========================================  =========================

Without the member, ``exact-likelihood``, ``exact-posterior``, ``posterior-samples`` and
``prior`` come generically from the program itself whenever the family is ``enumerable`` (or
``deterministic``, for the likelihood): the model is run with ``enumerate_z=True`` under
``poutine.enum`` and its one enumerated site summed out (:func:`exact_token_log_likelihood`
…). A Markov alignment (sequential sites) needs its own members. A tool asked for a capability
the model lacks stops before any work with :class:`~ppl_attention.core.errors.MissingCapability`
naming it. :func:`capabilities` lists what a model instance has.
"""

from __future__ import annotations

import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample
from torch import nn

from ...common.contract import (
    CAPABILITIES,
    ContractBase,
    capabilities,
    check_method,
    check_model_class,
    declared,
    require,
)
from ...core.errors import MissingCapability
from ..distributions import categorical_draws, position_log_probs

__all__ = ["AlignmentModel", "CAPABILITIES", "capabilities", "require", "check_model_class",
           "check_method", "exact_token_log_likelihood", "exact_posterior",
           "posterior_samples", "prior_probs", "declared", "simulate", "with_targets"]


class AlignmentModel(ContractBase, nn.Module):
    """Base class of the contract (module docstring): the declarations' defaults, ``config``
    recorded from the constructor's arguments, and :attr:`capabilities`
    (:class:`~ppl_attention.common.contract.ContractBase`)."""

    backend = "pyro"


def _own(model, name: str) -> bool:
    """Does the model define ``name`` itself (not only the generic implementation)?"""
    return callable(getattr(model, name, None))


# --- generic implementations ------------------------------------------------------------------

def _enumerated_joint(model, batch):
    """log p(y_t, z_t = j | x, y<t) ``[S, B, T]`` (the model run with its alignment site
    enumerated), or ``[B, T]`` when nothing is enumerated (a deterministic family: the program
    as it stands, run with ``enumerate_z=False`` — what its methods train)."""
    nest = declared(model, "max_plate_nesting")
    enum = poutine.enum(model.model, first_available_dim=-1 - nest)
    deterministic = bool(getattr(model.family, "deterministic", False))
    trace = poutine.trace(enum).get_trace(batch, enumerate_z=not deterministic)
    trace.compute_log_prob()
    B, T = batch.tgt_out.shape
    enumerated = [n for n, s in trace.nodes.items()
                  if s["type"] == "sample" and s["infer"].get("_enumerate_dim") is not None]
    if len(enumerated) > 1:
        raise MissingCapability(
            f"{type(model).__name__}: the generic exact likelihood sums out one enumerated "
            f"alignment site; this model enumerates {len(enumerated)} ({', '.join(enumerated)}) "
            f"— implement exact_token_log_likelihood / exact_posterior (docs/architecture.md)")
    total = None
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site_is_subsample(site):
            continue
        if not site["is_observed"] and name not in enumerated:
            raise MissingCapability(
                f"{type(model).__name__}: the latent site {name!r} is neither observed nor "
                f"enumerated, so the generic exact likelihood does not apply (declare it in "
                f"`latents`, or implement exact_token_log_likelihood)")
        lp = site["log_prob"]
        if lp.dim() < 2 or tuple(lp.shape[-2:]) != (B, T):
            raise MissingCapability(
                f"{type(model).__name__}: site {name!r} has log-density of shape "
                f"{list(lp.shape)}; the generic exact likelihood needs every site under the "
                f"[batch, target] = [{B}, {T}] plates — implement exact_token_log_likelihood")
        total = lp if total is None else total + lp
    if enumerated:
        S = batch.src.shape[-1]
        total = total.reshape(-1, B, T)
        if total.shape[0] != S:
            raise MissingCapability(
                f"{type(model).__name__}: the enumerated site {enumerated[0]!r} has "
                f"{total.shape[0]} values, not the {S} source positions")
    return total, bool(enumerated)


def _summed_out_tree(model, batch) -> torch.Tensor:
    """A latent tree whose emission factors over arcs, summed out by the model itself
    (``enumerate_z=True``: log Z(θ + φ) − log Z(θ), the method ``tree-exact``): the sentence's
    log p(y | x) on its first target token, 0 elsewhere ``[B, T]`` — the tree couples the
    tokens, so no token has a likelihood of its own; their sum is the sentence's."""
    trace = poutine.trace(model.model).get_trace(batch, enumerate_z=True)
    trace.compute_log_prob()
    B, T = batch.tgt_out.shape
    total = 0.0
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site_is_subsample(site):
            continue
        if not site["is_observed"]:
            raise MissingCapability(
                f"{type(model).__name__}: with enumerate_z=True its model samples the site "
                f"{name!r}; a model with arc emissions sums the tree out itself there "
                f"(pa.trees.tree_log_likelihood) — or implement exact_token_log_likelihood")
        lp = site["log_prob"]
        dim = next((f.dim for f in site["cond_indep_stack"] if f.name == "batch"), None)
        if dim is None or lp.dim() < -dim or lp.shape[dim] != B:
            raise MissingCapability(
                f"{type(model).__name__}: site {name!r} (log-density shape {list(lp.shape)}) "
                f"is not under pyro.plate('batch', {B}); the summed-out tree's likelihood is "
                f"read per pair")
        right = tuple(range(dim + 1, 0))
        lp = lp.sum(right) if right else lp
        total = total + lp.reshape(-1, B).sum(0)
    if not torch.is_tensor(total):
        raise MissingCapability(f"{type(model).__name__}: with enumerate_z=True its model "
                                f"scores nothing (no observed site or factor)")
    out = torch.zeros(B, T, dtype=total.dtype, device=total.device)
    out[:, 0] = total
    return out


def exact_token_log_likelihood(model, batch) -> torch.Tensor:
    """log p(y_t | x, y<t) ``[B, T]``: the model's own member, or its one enumerated site summed
    out (a deterministic family: the log-likelihood as it stands; a tree with arc emissions:
    the model's own sum over trees, the sentence's log p(y | x) on its first token)."""
    if _own(model, "exact_token_log_likelihood"):
        return model.exact_token_log_likelihood(batch)
    require(model, "exact-likelihood", tool="the exact likelihood")
    fam = model.family
    if getattr(fam, "tree", False) and not getattr(fam, "deterministic", False):
        return _summed_out_tree(model, batch)
    joint, enumerated = _enumerated_joint(model, batch)
    return joint.logsumexp(0) if enumerated else joint


def exact_posterior(model, batch) -> torch.Tensor:
    """p(z_t = j | x, y) ``[B, T, S]``: the model's own member, or Bayes' rule on the
    enumerated joint."""
    if _own(model, "exact_posterior"):
        return model.exact_posterior(batch)
    require(model, "exact-posterior", tool="the exact posterior")
    joint, _ = _enumerated_joint(model, batch)
    return joint.softmax(0).permute(1, 2, 0)


def posterior_samples(model, batch, num_samples: int, generator=None) -> torch.Tensor:
    """Exact posterior draws of the alignment, source positions ``[K, B, T]``: the model's own
    member, or independent draws from the marginals (exact when the z_t are conditionally
    independent given x and y, as for one site under the target plate)."""
    if _own(model, "posterior_samples"):
        return model.posterior_samples(batch, num_samples, generator)
    require(model, "posterior-samples", tool="exact posterior sampling")
    post = exact_posterior(model, batch)
    B, T, S = post.shape
    idx = categorical_draws(post.reshape(-1, S).clamp_min(0), num_samples, generator)
    return idx.T.reshape(num_samples, B, T)


def prior_probs(model, batch) -> torch.Tensor:
    """p(z_t = j | x, y<t) ``[B, T, S]``: the model's own member, or the enumerated site's
    prior distribution evaluated on its support."""
    if _own(model, "prior_probs"):
        return model.prior_probs(batch)
    require(model, "prior", tool="the alignment prior")
    site = declared(model, "site")
    trace = poutine.trace(model.model).get_trace(batch, enumerate_z=True)
    if site not in trace.nodes:
        raise MissingCapability(f"{type(model).__name__}: no site {site!r} in the model "
                                f"(declare `site = …` with the alignment site's name)")
    fn = trace.nodes[site]["fn"]
    return position_log_probs(fn, tuple(fn.batch_shape)).exp()


def with_targets(batch, tgt_out: torch.Tensor):
    """``batch`` with its targets replaced by ``tgt_out [B, T]`` (the decoder's input shifted
    from it: ``<bos> y_1 … y_{T−1}``), lengths and masks kept."""
    import dataclasses

    tgt_in = torch.cat([batch.tgt_in[:, :1], tgt_out[:, :-1]], 1)
    tgt_in = torch.where(batch.tgt_mask, tgt_in, batch.tgt_in)
    return dataclasses.replace(batch, tgt_in=tgt_in, tgt_out=torch.where(
        batch.tgt_mask, tgt_out, batch.tgt_out))


def _observed_target(trace, site: str, B: int, T: int):
    """The model's one observed target site as a distribution one can sample ``[B, T]``."""
    obs = [(n, s) for n, s in trace.nodes.items() if s["type"] == "sample" and s["is_observed"]
           and n != site and not site_is_subsample(s)]
    fns = [(n, s["fn"]) for n, s in obs if tuple(s["fn"].batch_shape[-2:]) == (B, T)
           and hasattr(s["fn"], "support") and getattr(s["fn"].support, "is_discrete", False)]
    if len(obs) != 1 or len(fns) != 1:
        raise MissingCapability(
            "simulating targets from the model needs its one observed site to be a discrete "
            "distribution under the [batch, target] plates (a factor cannot be sampled); "
            f"found {', '.join(n for n, _ in obs) or 'none'} — implement simulate(batch, "
            "generator) (docs/architecture.md)")
    return fns[0][1]


@torch.no_grad()
def simulate(model, batch, generator=None):
    """A draw from p(z, y | x) with the batch's target lengths: ``(batch with the simulated
    targets, alignment value [B, T, …] — for a site outside the target plate, one tree per
    sentence, its value [B, 1, …] drawn once —, attention weights [B, T, S] or None for a site
    that records none)`` — the model's own
    ``simulate(batch, generator)``, or its program run once per target position t (z_t from
    the prior at t given the simulated y<t, then y_t from the observed site's distribution
    given z_t; the program must be causal in y, as a decoder is). Draws use Pyro's RNG."""
    from ..attend import recording

    if _own(model, "simulate"):
        return model.simulate(batch, generator)
    site = declared(model, "site")
    B, T = batch.tgt_out.shape
    sim = batch
    values, weights = [], []
    program, whole = model.model, None
    for t in range(T):
        with recording() as calls, poutine.block():
            trace = poutine.trace(program).get_trace(sim)
        if site not in trace.nodes:
            raise MissingCapability(f"{type(model).__name__}: no site {site!r} in the model")
        node = trace.nodes[site]
        if t == 0 and not any(f.name == "target" for f in node["cond_indep_stack"]):
            # one value per sentence (a tree outside the target plate): drawn once, kept for
            # every position — not drawn again at each
            whole = node["value"]
            program = poutine.condition(model.model, data={site: whole})
        y_t = _observed_target(trace, site, B, T).sample()[:, t]
        out = sim.tgt_out.clone()
        out[:, t] = y_t
        sim = with_targets(sim, out)
        if whole is None:
            values.append(node["value"][:, t])
        call = next(c for c in calls if c.name == site)
        weights.append(None if call.weights is None else call.weights[:, t])
    value = whole if whole is not None else torch.stack(values, 1)
    return sim, value, None if weights[0] is None else torch.stack(weights, 1)


# --- checks -----------------------------------------------------------------------------------

