"""The NumPyro model contract: a model written in NumPyro alone gets every inference method and
every tool — ``train`` (resume included), ``compare``, ``sweep``, ``evaluate``, ``align``,
``analyze``, ``diagnose`` — the sibling of the Pyro contract (:mod:`ppl_attention.pyro.models.base`)
with the same declarations, switches, site layout and capabilities (docs/architecture.md).

A model is a plain Python class; subclass :class:`AlignmentModel` for the defaults. Its programs
read their parameters with ``numpyro.param(name, init)`` — ``init`` an array or a function of a
PRNG key, as NumPyro's own examples write them — or through ``numpyro.contrib.module``
(``flax_module`` …) where a user wants layers. The parameters of a model are therefore the
``param`` sites its programs register: :func:`init_params` finds them by running ``model`` and
``guide`` (every posterior the model offers) once under ``handlers.seed``, as NumPyro's
``SVI.init`` does; a *param map* is the dict ``{site name: value}`` (a value may be a pytree),
and every tool runs a program under ``handlers.substitute(data=params)``.

Shapes are those of the data: a pairs batch (:class:`~ppl_attention.numpyro.jax_batches.JaxBatch`)
has ``src [B, S]`` int32, ``src_mask [B, S]`` bool, ``tgt_in [B, T]``, ``tgt_out [B, T]``,
``tgt_mask [B, T]``; batches are padded to bucket shapes (padded rows have no target tokens and
one unmasked source position), so every number must respect the masks.

Required members
----------------
``__init__(self, src_vocab, tgt_vocab, *, family, **options)``
    Data dimensions, ``family`` (a :class:`ppl_attention.numpyro.Family` chosen by the method;
    keep it as ``self.family``, built with ``pa.numpyro.make_family(family, key_dim=d)`` when
    it may be a BAM family), then options with defaults (int, float, str, bool), recorded in
    ``self.config``.
``model(batch, *, enumerate_z=False, kl_scale=1.0)``
    p(y, z | x): scores ``[B, T, S]`` and values ``[B, S, d]``, then ``ctx, w =
    pa.numpyro.attend("align", scores, values, self.family, mask=batch.src_mask,
    target_mask=None if enumerate_z else batch.tgt_mask, infer={"enumerate": "parallel"} if
    enumerate_z else None)`` inside ``numpyro.plate("batch", B, dim=-2)`` and
    ``numpyro.plate("target", T, dim=-1)``, under ``handlers.scale(scale=kl_scale)``; everything
    after it broadcasts enumeration dims on the left; the targets observed by
    ``numpyro.sample("y", dist.Categorical(logits=…).mask(batch.tgt_mask), obs=batch.tgt_out)``
    or ``numpyro.factor`` of a ``[B, T]`` log-likelihood that is 0 on padding.
``guide(batch, *, posterior="inference", enumerate_z=False, kl_scale=1.0, baseline=None)``
    ``"none"``: return; ``"prior"``: the prior's scores; ``"inference"``: an amortized
    q(z | x, y). Sample with ``pa.numpyro.attend(..., guide=True, target_mask=batch.tgt_mask,
    infer=…)`` under the same plates and scale. (``baseline`` is accepted for the Pyro
    contract's signature; NumPyro's score-function loss applies it itself.)

Declarations and capabilities are the Pyro contract's (``data``, ``posteriors``, ``families``,
``latents``, ``site``, ``max_plate_nesting``, ``training_defaults``); members that provide a
capability take the same arguments as there and read parameters with ``numpyro.param``:
``exact_token_log_likelihood(batch)`` ``[B, T]``, ``exact_posterior(batch)`` ``[B, T, S]``,
``prior_probs(batch)`` ``[B, T, S]``, ``soft_token_log_likelihood(batch)`` ``[B, T]``,
``posterior_samples(batch, num_samples, key)`` ``[K, B, T]``. Where the family is enumerable
and the alignment the only latent, the first four come from the program by NumPyro's
enumeration (:func:`exact_token_log_likelihood` …). ``twin_parameters`` maps a parameter to
its Pyro twin's name where names or layouts differ
(see :mod:`~ppl_attention.numpyro.inference.twins`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from numpyro import handlers
from numpyro.distributions import biject_to, constraints

from ...common.contract import (
    CAPABILITIES,
    ContractBase,
    capabilities,
    check_shape,
    declared,
    require,
)
from ...core.errors import MissingCapability, UserError
from ..distributions import safe_log
from ..traces import site_log_prob

__all__ = ["AlignmentModel", "init_params", "constrain", "unconstrain", "call",
           "exact_token_log_likelihood", "exact_posterior", "posterior_samples", "prior_probs",
           "soft_token_log_likelihood", "substitute_params", "simulate", "is_numpyro_model",
           "token_log_likelihood_given", "posterior_given",
           "CAPABILITIES", "capabilities"]


class AlignmentModel(ContractBase):
    """Base class of the NumPyro contract (module docstring): the declarations' defaults,
    ``config`` recorded from the constructor's arguments, and :attr:`capabilities`
    (:class:`~ppl_attention.common.contract.ContractBase`)."""

    backend = "numpyro"


def is_numpyro_model(model_or_cls) -> bool:
    return declared(model_or_cls, "backend") == "numpyro"


# --- parameters -----------------------------------------------------------------------------

def _program_calls(model) -> list:
    """(program, keyword arguments) of every program whose parameters the model has: the model
    and the guide with each posterior it offers."""
    calls = [(model.model, dict(enumerate_z=False, kl_scale=1.0))]
    if getattr(getattr(model, "family", None), "markov", False):
        return calls  # a Markov chain is marginalized exactly: it has no guide to run
    for post in declared(model, "posteriors"):
        if post != "none":
            calls.append((model.guide, dict(posterior=post, enumerate_z=False, kl_scale=1.0)))
    return calls


def init_params(model, batch, key, step_kwargs: dict | None = None):
    """(param map, constraints): every ``numpyro.param`` site of the model's programs, with its
    initial value (a function of a key is called with one) and its constraint, found by running
    ``model`` and ``guide`` once under ``handlers.seed`` (NumPyro's ``SVI.init`` does the same).
    A parameter two programs share is initialised once."""
    params, cons = {}, {}
    for i, (fn, kw) in enumerate(_program_calls(model)):
        seeded = handlers.seed(handlers.substitute(fn, data=dict(params)),
                               jax.random.fold_in(key, i))
        try:
            trace = handlers.trace(seeded).get_trace(batch, **kw, **(step_kwargs or {}))
        except UserError:
            raise
        except Exception as e:  # a user's program failing on the first batch: say where
            raise UserError(f"{type(model).__name__}.{fn.__name__}({', '.join(kw)}) failed on "
                            f"the first batch: {type(e).__name__}: {e}") from e
        for name, site in trace.items():
            if site["type"] == "mutable":
                raise UserError(f"{type(model).__name__}: mutable state {name!r} (numpyro."
                                f"mutable, e.g. batch norm) is not supported by the training "
                                f"loop; use parameters without state")
            if site["type"] == "param" and name not in params:
                # strongly typed: a weakly typed initial value (jnp.log(4.0)) would compile the
                # training step once more when Adam's update makes it strong
                params[name] = jax.tree.map(lambda x: jnp.asarray(x, dtype=jnp.asarray(x).dtype),
                                            site["value"])
                cons[name] = site["kwargs"].get("constraint", constraints.real)
    if not params:
        raise UserError(f"{type(model).__name__}: its programs register no numpyro.param — "
                        f"nothing to train (docs/architecture.md, the NumPyro contract)")
    return params, cons


def unconstrain(params: dict, cons: dict) -> dict:
    """The optimizer's coordinates: each constrained parameter mapped to the real line."""
    return {k: (v if cons.get(k, constraints.real) is constraints.real
                else jax.tree.map(biject_to(cons[k]).inv, v)) for k, v in params.items()}


def constrain(raw: dict, cons: dict) -> dict:
    """Back from :func:`unconstrain`: the values the programs read."""
    return {k: (v if cons.get(k, constraints.real) is constraints.real
                else jax.tree.map(biject_to(cons[k]), v)) for k, v in raw.items()}


def substitute_params(fn, params: dict):
    """``fn`` with its ``numpyro.param`` sites read from ``params``; a parameter missing from
    ``params`` is an error naming it (plain ``handlers.substitute`` would silently fall back to
    its initial value)."""
    def value(site):
        if site["type"] != "param":
            return None
        if site["name"] not in params:
            raise UserError(f"parameter {site['name']!r} is not in the param map (it has: "
                            f"{', '.join(map(str, params)) or 'nothing'})")
        return params[site["name"]]
    return handlers.substitute(fn, substitute_fn=value)


def call(fn, params: dict, *args, rng_key=None, **kwargs):
    """``fn(*args, **kwargs)`` with the parameters ``params`` substituted (and a seed when a
    key is given): how every tool runs a program or a capability member."""
    fn = substitute_params(fn, params)
    if rng_key is not None:
        fn = handlers.seed(fn, rng_key)
    return fn(*args, **kwargs)


# --- generic capability members -----------------------------------------------------------

def _enumerated_joint(model, params, batch, globals_: dict | None = None):
    """log p(y_t, z_t = j | x, y<t) ``[S, B, T]`` (the model run with its alignment site
    enumerated by ``numpyro.contrib.funsor.enum``), or ``[B, T]`` when nothing is enumerated (a
    deterministic family). ``globals_``: values of the model's global latent sites, fixed (and
    left out of the sum: the joint is then given them)."""
    from numpyro.contrib.funsor import enum

    nest = declared(model, "max_plate_nesting")
    program = substitute_params(model.model, params)
    if globals_:
        program = handlers.block(handlers.condition(program, data=globals_),
                                 hide=list(globals_))
    fn = enum(handlers.seed(program, 0), first_available_dim=-1 - nest)
    deterministic = bool(getattr(model.family, "deterministic", False))  # as it stands
    trace = handlers.trace(fn).get_trace(batch, enumerate_z=not deterministic, kl_scale=1.0)
    B, T = batch.tgt_out.shape
    name = type(model).__name__
    enumerated = [n for n, s in trace.items() if s["type"] == "sample" and not s["is_observed"]
                  and s["infer"].get("enumerate") == "parallel"]
    if len(enumerated) > 1:
        raise MissingCapability(
            f"{name}: the generic exact likelihood sums out one enumerated alignment site; "
            f"this model enumerates {len(enumerated)} ({', '.join(enumerated)}) — implement "
            f"exact_token_log_likelihood / exact_posterior (docs/architecture.md)")
    total = None
    for n, site in trace.items():
        if site["type"] != "sample":
            continue
        if not site["is_observed"] and n not in enumerated:
            raise MissingCapability(
                f"{name}: the latent site {n!r} is neither observed nor enumerated, so the "
                f"generic exact likelihood does not apply (declare it in `latents`, or "
                f"implement exact_token_log_likelihood)")
        lp = site_log_prob(site)
        if lp.ndim < 2 or tuple(lp.shape[-2:]) != (B, T):
            raise MissingCapability(
                f"{name}: site {n!r} has log-density of shape {list(lp.shape)}; the generic "
                f"exact likelihood needs every site under the [batch, target] = [{B}, {T}] "
                f"plates — implement exact_token_log_likelihood")
        total = lp if total is None else total + lp
    if total is None:
        raise MissingCapability(f"{name}: its model has no sample site to score")
    if enumerated:
        S = batch.src.shape[-1]
        total = jnp.broadcast_to(total, (*total.shape[:-2], B, T)).reshape(-1, B, T)
        if total.shape[0] != S:
            raise MissingCapability(f"{name}: the enumerated site {enumerated[0]!r} has "
                                    f"{total.shape[0]} values, not the {S} source positions")
    return total, bool(enumerated)


def _own(model, member: str) -> bool:
    return callable(getattr(model, member, None))


def _given(member, params, globals_: dict):
    """A capability member with the global latents fixed at ``globals_`` (its
    ``numpyro.sample`` sites of them return those values)."""
    fn = handlers.condition(substitute_params(member, params), data=globals_)
    return handlers.seed(handlers.block(fn, hide=list(globals_)), 0)


def token_log_likelihood_given(model, params, batch, globals_: dict):
    """log p(y_t | x, y<t, globals) ``[B, T]`` with the model's global latents fixed at
    ``globals_`` (a draw of their posterior): its own member, or the alignment summed out by
    enumeration."""
    B, T = batch.tgt_out.shape
    if _own(model, "exact_token_log_likelihood"):
        return _given(model.exact_token_log_likelihood, params, globals_)(batch)
    joint, enumerated = _enumerated_joint(model, params, batch, globals_)
    ll = jax.nn.logsumexp(joint, 0) if enumerated else jnp.broadcast_to(joint, (B, T))
    return jnp.where(batch.tgt_mask, ll, 0.0)


def posterior_given(model, params, batch, globals_: dict):
    """p(z_t = j | x, y, globals) ``[B, T, S]`` with the global latents fixed: the model's own
    member, or Bayes' rule on the enumerated joint."""
    if _own(model, "exact_posterior"):
        return _given(model.exact_posterior, params, globals_)(batch)
    joint, _ = _enumerated_joint(model, params, batch, globals_)
    return jnp.transpose(jax.nn.softmax(joint, 0), (1, 2, 0))


def _summed_out_tree(model, params, batch):
    """A latent tree whose emission factors over arcs, summed out by the model itself
    (``enumerate_z=True``, the method ``tree-exact``): the sentence's log p(y | x) on its
    first target token, 0 elsewhere ``[B, T]`` (the Pyro side's ``_summed_out_tree``)."""
    trace = handlers.trace(handlers.seed(substitute_params(model.model, params), 0)
                           ).get_trace(batch, enumerate_z=True, kl_scale=1.0)
    B, T = batch.tgt_out.shape
    name = type(model).__name__
    total = None
    for n, site in trace.items():
        if site["type"] != "sample":
            continue
        if not site["is_observed"]:
            raise MissingCapability(
                f"{name}: with enumerate_z=True its model samples the site {n!r}; a model with "
                f"arc emissions sums the tree out itself there "
                f"(pa.numpyro.trees.tree_log_likelihood) — or implement "
                f"exact_token_log_likelihood")
        lp = site_log_prob(site)
        dim = next((f.dim for f in site["cond_indep_stack"] if f.name == "batch"), None)
        if dim is None or lp.ndim < -dim or lp.shape[dim] != B:
            raise MissingCapability(
                f"{name}: site {n!r} (log-density shape {list(lp.shape)}) is not under "
                f"numpyro.plate('batch', {B}); the summed-out tree's likelihood is read per pair")
        right = tuple(range(lp.ndim + dim + 1, lp.ndim))
        lp = lp.sum(right) if right else lp
        lp = lp.reshape(-1, B).sum(0)
        total = lp if total is None else total + lp
    if total is None:
        raise MissingCapability(f"{name}: with enumerate_z=True its model scores nothing (no "
                                f"observed site or factor)")
    return jnp.zeros((B, T), total.dtype).at[:, 0].set(total)


def exact_token_log_likelihood(model, params, batch):
    """log p(y_t | x, y<t) ``[B, T]``: the model's own member (run with ``params``
    substituted), or its one enumerated site summed out (a deterministic family: the
    log-likelihood as it stands; a tree with arc emissions: the model's own sum over trees,
    the sentence's log p(y | x) on its first token)."""
    B, T = batch.tgt_out.shape
    if _own(model, "exact_token_log_likelihood"):
        out = call(model.exact_token_log_likelihood, params, batch)
        check_shape(model, "exact_token_log_likelihood", out, (B, T))
        return out
    require(model, "exact-likelihood", tool="the exact likelihood")
    fam = model.family
    if getattr(fam, "tree", False) and not getattr(fam, "deterministic", False):
        return _summed_out_tree(model, params, batch)
    joint, enumerated = _enumerated_joint(model, params, batch)
    ll = jax.nn.logsumexp(joint, 0) if enumerated else jnp.broadcast_to(joint, (B, T))
    return jnp.where(batch.tgt_mask, ll, 0.0)


def exact_posterior(model, params, batch):
    """p(z_t = j | x, y) ``[B, T, S]``: the model's own member, or Bayes' rule on the
    enumerated joint."""
    B, T = batch.tgt_out.shape
    S = batch.src.shape[-1]
    if _own(model, "exact_posterior"):
        out = call(model.exact_posterior, params, batch)
        check_shape(model, "exact_posterior", out, (B, T, S))
        return out
    require(model, "exact-posterior", tool="the exact posterior")
    joint, _ = _enumerated_joint(model, params, batch)
    return jnp.transpose(jax.nn.softmax(joint, 0), (1, 2, 0))


def posterior_samples(model, params, batch, num_samples: int, key):
    """Exact posterior draws of the alignment, source positions ``[K, B, T]``: the model's own
    member, or independent draws from the marginals (exact for one site under the target
    plate, whose z_t are conditionally independent given x and y)."""
    B, T = batch.tgt_out.shape
    if _own(model, "posterior_samples"):
        out = call(model.posterior_samples, params, batch, num_samples, key)
        check_shape(model, "posterior_samples", out, (num_samples, B, T))
        return out
    require(model, "posterior-samples", tool="exact posterior sampling")
    post = exact_posterior(model, params, batch)
    logits = safe_log(post)
    return jax.random.categorical(key, logits, axis=-1, shape=(num_samples, B, T))


def prior_probs(model, params, batch):
    """p(z_t = j | x, y<t) ``[B, T, S]``: the model's own member, or the alignment site's
    prior distribution evaluated on its support."""
    B, T = batch.tgt_out.shape
    S = batch.src.shape[-1]
    if _own(model, "prior_probs"):
        out = call(model.prior_probs, params, batch)
        check_shape(model, "prior_probs", out, (B, T, S))
        return out
    require(model, "prior", tool="the alignment prior")
    site = declared(model, "site")
    trace = handlers.trace(handlers.seed(substitute_params(model.model, params), 0)
                           ).get_trace(batch, enumerate_z=True, kl_scale=1.0)
    if site not in trace:
        raise MissingCapability(f"{type(model).__name__}: no site {site!r} in the model "
                                f"(declare `site = …` with the alignment site's name)")
    fn = trace[site]["fn"]
    support = fn.enumerate_support(expand=False)
    probs = jnp.exp(fn.log_prob(support))
    probs = jnp.broadcast_to(probs, (support.shape[0], B, T))
    return jnp.transpose(probs, (1, 2, 0))


def _observed_target(trace, site: str, B: int, T: int):
    """The model's one observed target site as a distribution one can sample ``[B, T]``."""
    obs = [(n, s) for n, s in trace.items() if s["type"] == "sample" and s["is_observed"]
           and n != site]
    fns = [s["fn"] for _, s in obs if tuple(s["fn"].batch_shape[-2:]) == (B, T)
           and getattr(s["fn"].support, "is_discrete", False)]
    if len(obs) != 1 or len(fns) != 1:
        raise MissingCapability(
            "simulating targets from the model needs its one observed site to be a discrete "
            "distribution under the [batch, target] plates (a factor cannot be sampled); "
            f"found {', '.join(n for n, _ in obs) or 'none'} — implement simulate(batch, key) "
            "(docs/architecture.md)")
    return fns[0]


def _simulation_step(model, params, sim, key, t, whole=None):
    """Position ``t`` of :func:`simulate`: the program run on the targets simulated so far,
    z_t from its prior, y_t from its observed site; ``t`` may be traced (one compilation for
    every position). Returns the site's whole value (the caller takes position t of it) and
    the weights at t; ``whole``: the site's value held fixed (one per sentence)."""
    from ..attend import recording

    site = declared(model, "site")
    B, T = sim.tgt_out.shape
    k_model, k_y = jax.random.split(jax.random.fold_in(key, t))
    program = substitute_params(model.model, params)
    if whole is not None:
        program = handlers.condition(program, data={site: whole})
    with recording() as calls:
        trace = handlers.trace(handlers.seed(program, k_model)).get_trace(sim)
    if site not in trace:
        raise MissingCapability(f"{type(model).__name__}: no site {site!r} in the model")
    y_t = _observed_target(trace, site, B, T).sample(k_y)[:, t]
    out = sim.tgt_out.at[:, t].set(jnp.where(sim.tgt_mask[:, t], y_t, sim.tgt_out[:, t]))
    tgt_in = jnp.concatenate([sim.tgt_in[:, :1], out[:, :-1]], 1)
    sim = sim._replace(tgt_out=out, tgt_in=jnp.where(sim.tgt_mask, tgt_in, sim.tgt_in))
    weights = next(c for c in calls if c.name == site).weights
    return sim, trace[site]["value"], None if weights is None else weights[:, t]


def simulate(model, params, batch, key):
    """A draw from p(z, y | x) with the batch's target lengths: ``(batch with the simulated
    targets, alignment value [B, T, …] — for a site outside the target plate, one tree per
    sentence, its value [B, 1, …] drawn once —, attention weights [B, T, S] or None)`` — the
    model's own ``simulate(batch, key)``, or its program run once per target position t (z_t
    from the prior given the simulated y<t, then y_t from the observed site given z_t; the
    program must be causal in y, as a decoder is), each position by one jitted step."""
    if _own(model, "simulate"):
        return call(model.simulate, params, batch, key)
    store = model.__dict__.setdefault("_jitted", {})
    if "simulation-step" not in store:
        store["simulation-step"] = jax.jit(
            lambda p, s, k, t, w: _simulation_step(model, p, s, k, t, w))
    step = store["simulation-step"]
    T = batch.tgt_out.shape[1]
    sim, values, weights, whole = batch, [], [], None
    for t in range(T):
        sim, v, w = step(params, sim, key, jnp.asarray(t), whole)
        if t == 0 and T > 1 and v.shape[1] == 1:  # one value per sentence: kept for every t
            whole = v
        if whole is None:
            values.append(v[:, t])
        weights.append(w)
    value = whole if whole is not None else jnp.stack(values, 1)
    return sim, value, None if weights[0] is None else jnp.stack(weights, 1)


def soft_token_log_likelihood(model, params, batch):
    """The model's own ``soft_token_log_likelihood(batch)`` ``[B, T]`` with ``params``."""
    if not _own(model, "soft_token_log_likelihood"):
        raise MissingCapability(f"{type(model).__name__} has no soft_token_log_likelihood "
                                f"({CAPABILITIES['soft-likelihood']})")
    out = call(model.soft_token_log_likelihood, params, batch)
    check_shape(model, "soft_token_log_likelihood", out, tuple(batch.tgt_out.shape))
    return out
