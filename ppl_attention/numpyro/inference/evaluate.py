"""Evaluation under NumPyro: the quantities of :mod:`ppl_attention.pyro.inference.evaluate` — exact
NLL/token where the model has the ``exact-likelihood`` capability, an IWAE-K bound otherwise,
ELBO/token, MAP alignments — computed through the NumPyro contract alone, jitted, for a NumPyro
model's run (its param map) or a Pyro model's run through its NumPyro twin (the weights moved by
name). ``evaluate(run, …, backend="numpyro")`` assembles the same report from these.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers

from ...common.contract import capabilities, declared
from ...core.errors import UserError
from ...core.links import links_from_positions
from ...core.method_specs import guide_posterior as _guide_posterior
from ...core.records import recording
from ..jax_batches import Shapes, to_jax
from ..models.base import exact_posterior, exact_token_log_likelihood, is_numpyro_model
from ..traces import replay, site_log_prob
from .cache import enable_compilation_cache
from .methods import enumerated_guide_loss, get_method, make_elbo
from .twins import parameter_pairs, params_from_torch, twin_of

__all__ = ["MULTIPLE", "run_shapes", "run_batch", "model_and_params", "nll_per_token",
           "elbo_per_token", "mean_support",
           "map_alignments", "alignment_links", "map_trees", "map_trees_by_index", "tree_scores",
           "log_importance_weights", "jitted", "jax_batches"]

MULTIPLE = "bucket"  # S and T padded up to a few bucket lengths: few shapes, few compilations


def model_and_params(run, batch=None, params=None):
    """(NumPyro model, param map) of a run: a NumPyro model's own, or the twin of a Pyro model
    with the run's current weights (``params``: other weights, e.g. mid-training)."""
    enable_compilation_cache()  # evaluation compiles too: keep it for the next command
    if is_numpyro_model(run.model):
        return run.model, (run.params if params is None else params)
    cache = run.__dict__.setdefault("_numpyro_twin", {})
    if "twin" not in cache:
        if batch is None:
            raise UserError("the NumPyro twin is built on a batch")
        twin, p = twin_of(run.model, batch)
        cache.update(twin=twin, template=p, pairs=parameter_pairs(twin, p, run.model))
    if params is None:
        params = params_from_torch(cache["twin"], cache["template"], run.model, cache["pairs"])
    return cache["twin"], params


def jitted(model, name: str, build):
    """``build()`` jitted once per model object and name."""
    store = model.__dict__.setdefault("_jitted", {})
    if name not in store:
        store[name] = jax.jit(build())
    return store[name]


def run_shapes(run):
    """The shapes ``run`` compiled (:class:`~ppl_attention.numpyro.jax_batches.Shapes`, from its
    record), or :data:`MULTIPLE` for a run that recorded none."""
    return Shapes.from_record(getattr(run, "extra", {}).get("shapes")) or MULTIPLE


def run_batch(run, batch):
    """One batch of a tool padded to the run's shapes (its own rows)."""
    return to_jax(batch, None, run_shapes(run))


def jax_batches(batches, run=None):
    """``batches`` padded to one row count and to ``run``'s shapes (buckets without a run)."""
    shapes = MULTIPLE if run is None else run_shapes(run)
    rows = max(b.size for b in batches)
    if isinstance(shapes, Shapes):
        rows = max(rows, shapes.rows)
    return [to_jax(b, rows, shapes) for b in batches]


def _batch_dim(trace) -> int | None:
    for site in trace.values():
        for frame in site.get("cond_indep_stack", ()):
            if frame.name == "batch":
                return frame.dim
    return None


def _per_pair(trace, B: int):
    """Σ of the log-densities of ``trace``'s sample sites per pair ``[B]`` (every dim right of
    the ``batch`` plate summed)."""
    dim = _batch_dim(trace)
    total = jnp.zeros(B)
    for name, site in trace.items():
        if site["type"] != "sample":
            continue
        lp = site_log_prob(site, scaled=False)
        if dim is None or lp.ndim < -dim or lp.shape[dim] != B:
            raise UserError(f"site {name!r} is not under the plate 'batch' of size {B} "
                            f"(log-density shape {list(lp.shape)}); per-pair importance weights "
                            f"need every site inside numpyro.plate('batch', B)")
        right = tuple(range(lp.ndim + dim + 1, lp.ndim))
        lp = lp.sum(right) if right else lp
        total = total + lp.reshape(-1, B).sum(0)
    return total


def log_importance_weights(model, posterior: str):
    """(params, batch, key) → log p(y, z | x) − log q(z | x, y) per pair ``[B]`` for one draw
    z ~ q (KL weight 1)."""
    def log_weight(params, b, key):
        guide = functools.partial(model.guide, posterior=posterior)
        g = handlers.trace(handlers.seed(handlers.substitute(guide, data=params), key)
                           ).get_trace(b)
        mt = handlers.trace(handlers.seed(replay(
            handlers.substitute(model.model, data=params), g), key)).get_trace(b)
        B = b.tgt_out.shape[0]
        return _per_pair(mt, B) - _per_pair(g, B)
    return log_weight


def _iwae(model, posterior):
    lw = log_importance_weights(model, posterior)

    def build():
        def iwae(params, b, keys):
            w = jax.vmap(lambda k: lw(params, b, k))(keys)
            return jax.nn.logsumexp(w, 0) - math.log(keys.shape[0])
        return iwae
    return jitted(model, f"iwae-{posterior}", build)


def _exact_ll(model):
    return jitted(model, "exact_ll",
                  lambda: functools.partial(exact_token_log_likelihood, model))


def nll_per_token(run, batches, iwae_k: int = 10, seed: int = 0, params=None) -> float:
    jb = jax_batches(batches, run)
    model, p = model_and_params(run, jb[0], params)
    exact = "exact-likelihood" in capabilities(model)
    post = _guide_posterior(run.method, run.model)
    total, n = 0.0, 0
    key = jax.random.PRNGKey(seed)
    for b, j in zip(batches, jb):
        if exact:
            total -= float(_exact_ll(model)(p, j).sum())
        else:
            key, k = jax.random.split(key)
            total -= float(_iwae(model, post)(p, j, jax.random.split(k, iwae_k))[: b.size].sum())
        n += b.n_tokens
    return total / n


def _elbo_loss(model, posterior: str, analytic: bool):
    fam = model.family
    site = declared(model, "site")

    def build():
        guide = functools.partial(model.guide, posterior=posterior)
        if fam.enumerable:
            def loss(params, b, key):
                return enumerated_guide_loss(key, params, model.model, guide, b, site)
        else:
            elbo = make_elbo("TraceMeanField_ELBO" if analytic else "Trace_ELBO")

            def loss(params, b, key):
                return elbo.loss(key, params, model.model, guide, b)
        return loss
    return jitted(model, f"elbo-{posterior}-{analytic}", build)


def elbo_per_token(run, batches, samples: int = 5, seed: int = 0) -> float:
    """The ELBO of the trained (model, guide) pair with KL weight 1: exact (enumerated) for
    categorical guides, a mean of ``samples`` estimates otherwise; exact methods (no guide)
    report log p itself."""
    m = get_method(run.method)
    jb = jax_batches(batches, run)
    model, p = model_and_params(run, jb[0])
    if model.family.deterministic or m.posterior == "none":
        return -nll_per_token(run, batches, seed=seed)
    loss = _elbo_loss(model, m.posterior, m.elbo_name == "TraceMeanField_ELBO")
    reps = 1 if model.family.enumerable else samples
    key = jax.random.PRNGKey(seed)
    total, n = 0.0, 0
    for b, j in zip(batches, jb):
        for _ in range(reps):
            key, k = jax.random.split(key)
            total += float(loss(p, j, k)) / reps
        n += b.n_tokens
    return -total / n


def _recorded(model, program: str, posterior: str | None, what: str):
    """Jitted (params, batch) → the ``what`` of the alignment site's ``attend`` call when
    ``program`` runs (the scores and mask, or the weights)."""
    site = declared(model, "site")

    def build():
        def fn(params, b):
            prog = model.model if program == "model" else \
                functools.partial(model.guide, posterior=posterior)
            with recording() as calls:
                handlers.seed(handlers.substitute(prog, data=params), 0)(b)
            call = next((c for c in calls if c.name == site), None)
            if call is None:
                raise UserError(f"no pa.numpyro.attend call wrote the site {site!r} (declare "
                                f"the model's `site`)")
            if what == "weights":
                return call.weights
            if what == "arcs":  # a tree family's arc scores, as given
                return call.scores
            if what == "selection":  # a selection family: the MAP selection's coverage
                return call.family.map_weights(call.scores, call.mask)
            return jnp.where(call.mask, call.scores, -jnp.inf)
        return fn
    return jitted(model, f"recorded-{program}-{posterior}-{what}", build)


def _support_sizes(fn):
    while not hasattr(fn, "support_size") and not hasattr(fn, "active") and \
            hasattr(fn, "base_dist"):
        fn = fn.base_dist
    if hasattr(fn, "support_size"):
        return fn.support_size
    if hasattr(fn, "active"):
        return fn.active
    raise UserError(f"{type(fn).__name__} has no sparse support to count")


def _support_fn(model, site, posterior):
    def fn(params, b):
        prog = functools.partial(model.guide, posterior=posterior)
        tr = handlers.trace(handlers.seed(handlers.substitute(prog, data=params), 0)
                            ).get_trace(b)
        fn = tr[site]["fn"]
        sizes = _support_sizes(fn)
        while not hasattr(fn, "converged") and hasattr(fn, "base_dist"):
            fn = fn.base_dist
        return sizes, getattr(fn, "converged", jnp.ones(sizes.shape, bool))
    return fn


def mean_support(run, batches) -> tuple[float, float | None]:
    """As :func:`ppl_attention.pyro.inference.evaluate.mean_support`, under NumPyro."""
    site = declared(run.model, "site")
    total, count, stopped = 0.0, 0, None
    for batch in batches:
        jb = run_batch(run, batch)
        model, p = model_and_params(run, jb)
        B, T = batch.tgt_out.shape
        if model.family.deterministic:
            w = _recorded(model, "model", None, "weights")(p, jb)
            sizes = np.asarray((w > 0).sum(-1))
            converged = None
        else:
            posterior = _guide_posterior(run.method, run.model)
            sizes, converged = (np.asarray(x) for x in jitted(
                model, f"support-{posterior}",
                functools.partial(_support_fn, model, site, posterior))(p, jb))
        sizes = sizes.reshape(sizes.shape[0], -1)[:B]
        keep = np.ones(sizes.shape, bool) if sizes.shape[1] == 1 else np.asarray(batch.tgt_mask)
        sizes = sizes[:, :keep.shape[1]]
        total += float(sizes[keep].sum())
        count += int(keep.sum())
        if converged is not None and model.family.sparse and not \
                model.family.enumerable:  # SparseMAP (a sparsemax q always converges)
            missed = ~converged.reshape(converged.shape[0], -1)[:B, :keep.shape[1]][keep]
            stopped = (stopped or 0) + int(missed.sum())
    return total / max(count, 1), None if stopped is None else stopped / max(count, 1)


def map_alignments(run, batch) -> np.ndarray:
    """The alignment of each target token ``[B, T]``, as the Pyro side defines it: argmax of the
    exact posterior where the model has one, of the attention weights for a deterministic
    family, of q's scores (its mean weights' argmax) otherwise; a selection family's MAP
    selection (the positions it reads) ``[B, T, S]`` bool."""
    jb = run_batch(run, batch)
    model, p = model_and_params(run, jb)
    B, T = batch.tgt_out.shape
    if model.family.selects:  # the MAP selection, as the Pyro side
        program = "model" if model.family.deterministic else "guide"
        posterior = None if model.family.deterministic else \
            _guide_posterior(run.method, run.model)
        a = _recorded(model, program, posterior, "selection")(p, jb)
        return np.asarray(model.family.read_positions(a))[:B, :T, :batch.src.shape[1]]
    if "exact-posterior" in capabilities(model):
        a = jitted(model, "exact_posterior",
                   lambda: functools.partial(exact_posterior, model))(p, jb)
    elif model.family.deterministic or model.family.tree:  # a tree: the word attention
        a = _recorded(model, "model", None, "weights")(p, jb)
    else:
        a = _recorded(model, "guide", _guide_posterior(run.method, run.model), "scores")(p, jb)
    return np.asarray(jnp.argmax(a, -1))[:B, :T]


def tree_scores(model, params, jb, posterior: bool = True):
    """The arc scores of the model's tree of each source ``[B, S, S]`` on a padded batch ``jb``
    and the source lengths ``[B]`` (the Pyro side's ``tree_scores``): the prior's, recorded
    from its ``attend`` call with one tree per query pooled by summing their arc scores — and
    where the model has arc emissions (with ``posterior``) the exact posterior's, θ + φ."""
    scores = _recorded(model, "model", None, "arcs")(params, jb)
    scores = scores.reshape(scores.shape[0], -1, *scores.shape[-2:]).sum(1)
    if posterior and "arc-emissions" in capabilities(model):
        from ..models.base import call

        phi = call(model.arc_emission_scores, params, jb, rng_key=jax.random.PRNGKey(0))
        scores = scores + phi.reshape(phi.shape[0], -1, *phi.shape[-2:]).sum(1)
    return scores, jnp.asarray(jb.src_mask.sum(-1))


def map_trees(run, batch) -> list[list[int]]:
    """The MAP tree of each source under :func:`tree_scores` (the exact posterior's where the
    model has arc emissions, else the prior's), heads of the real words per pair."""
    from ..trees import DependencyTree

    jb = run_batch(run, batch)
    model, p = model_and_params(run, jb)
    B = batch.size
    scores, lengths = tree_scores(model, p, jb)
    fam = model.family
    heads = np.asarray(DependencyTree(scores, lengths, projective=fam.projective,
                                      single_root=fam.single_root).argmax())
    lens = np.asarray(lengths)
    return [heads[r, :int(lens[r])].tolist() for r in range(B)]


def map_trees_by_index(run, batches) -> dict[int, list[int]]:
    """Corpus index → the MAP heads of its source."""
    out = {}
    for b in batches:
        for idx, heads in zip(b.index.tolist(), map_trees(run, b)):
            out[idx] = heads
    return out


def alignment_links(run, batches) -> dict[int, set[tuple[int, int]]]:
    """As the Pyro side's, with this module's MAP alignments."""
    return links_from_positions(run, batches, map_alignments)
