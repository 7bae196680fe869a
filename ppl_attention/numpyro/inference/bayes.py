"""The methods for global latent variables (:mod:`ppl_attention.core.method_specs`) under
NumPyro: NUTS / HMC with several chains, or SVI with an autoguide over the globals, on the
whole training set at once, the alignment summed out by enumeration inside the model
(``enumerate_z=True``; NumPyro's funsor enumeration). A run holds the posterior draws of the
globals (``samples.npz``: ``[chain, draw, …]`` per site) and, for SVI, the guide's parameters.

Evaluation is Bayesian: the posterior predictive per token,
log p(y_t | x, y<t, D) ≈ log (1/S) Σ_s p(y_t | x, y<t, θ_s), alignments from the posterior
marginals averaged over draws; MCMC's diagnostics (R-hat, bulk and tail ESS, divergences,
through ArviZ); :func:`discrepancy` puts a posterior against the NUTS reference per global
parameter (mean error in reference sds, sd ratio, 1-Wasserstein distance of the marginals).
"""

from __future__ import annotations

import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import optax
from numpyro import handlers
from numpyro.infer import HMC, MCMC, NUTS, SVI, Predictive, TraceEnum_ELBO, autoguide

from ...common import arviz_api
from ...common.contract import declared, global_latents
from ...common.runs import Run
from ...core.errors import UserError
from ...core.method_specs import METHOD_OPTIONS, global_method
from ...core.training import training_options
from ...data.batching import as_numpy
from ..jax_batches import JaxBatch, to_jax
from ..models.base import posterior_given, token_log_likelihood_given
from .cache import enable_compilation_cache

__all__ = ["fit_global", "global_report", "global_inference_data", "discrepancy",
           "global_alignment_links",
           "one_batch", "posterior_draws", "SVI_OPTIONS", "mcmc_diagnostics", "convergence_note",
           "RHAT_MAX", "ESS_MIN"]

#: training options an SVI method takes; MCMC takes none of them
SVI_OPTIONS = ("steps", "lr")
MAX_EVAL_DRAWS = 200  # posterior draws the predictive averages over (thinned evenly)


def one_batch(batches) -> JaxBatch:
    """Every pair of ``batches`` (torch) in one padded :class:`JaxBatch`."""
    S = max(b.src.shape[1] for b in batches)
    T = max(b.tgt_out.shape[1] for b in batches)
    parts = [to_jax(b) for b in batches]

    def pad(a, width, fill):
        return np.pad(np.asarray(a), ((0, 0), (0, width - a.shape[1])), constant_values=fill)

    fields = []
    for name, width, fill in (("src", S, 0), ("src_mask", S, False), ("tgt_in", T, 0),
                              ("tgt_out", T, 0), ("tgt_mask", T, False)):
        fields.append(jnp.asarray(np.concatenate([pad(getattr(p, name), width, fill)
                                                  for p in parts])))
    if any(p.features is not None for p in parts):  # bags: their instances' features
        fields.append(jnp.asarray(np.concatenate([
            np.pad(np.asarray(p.features), ((0, 0), (0, S - p.features.shape[1]), (0, 0)))
            for p in parts])))
    return JaxBatch(*fields)


def _program(model):
    return functools.partial(model.model, enumerate_z=True, kl_scale=1.0)


def check_options(method: str, given: dict, method_options: dict | None = None) -> dict:
    """Refuse a training option the global method does not take (SVI: steps and lr) and a
    method option it does not take under ``train``; returns its method options, given ones over
    the registry's defaults (:data:`~ppl_attention.core.method_specs.GLOBAL_METHODS`)."""
    spec = global_method(method, "train")
    allowed = SVI_OPTIONS if spec.kind == "svi" else ()
    extra = sorted(k for k, v in given.items() if v is not None and k not in allowed)
    if extra:
        flag = "--" + extra[0].replace("_", "-")
        takes = ", ".join(METHOD_OPTIONS[k].flag for k in spec.options["train"])
        what = ("SVI takes --steps and --lr" if spec.kind == "svi" else
                f"{method} takes no training option")
        raise UserError(f"{flag} does not apply to {method}: {what} (its method options: "
                        f"{takes})")
    return spec.resolve("train", method_options or {})


def fit_global(model, train, method: str, steps: int | None = None, seed: int = 0, *,
               src_vocab=None, tgt_vocab=None, lr: float | None = None, progress: bool = True,
               out=None, config: dict | None = None, model_spec: str | None = None,
               method_options: dict | None = None, **given) -> Run:
    """Infer the global latents of ``model`` (a NumPyro model declaring ``latents``) from
    every pair of ``train`` by ``method``; returns a run whose ``samples`` are the posterior
    draws (module docstring). ``method_options``: the method's own (``chains``, ``warmup``,
    ``samples``, …; the registry's defaults where not given). Options that do not apply are
    refused."""
    spec = global_method(method, "train")
    if not global_latents(model):
        raise UserError(f"method {method!r} infers global latent variables; "
                        f"{type(model).__name__} declares none (`latents`)")
    if spec.requires and not declared(model, spec.requires):
        raise UserError(f"method {method!r} takes a model that declares `{spec.requires}`; "
                        f"{type(model).__name__} does not")
    mo = check_options(method, {"steps": steps, "lr": lr, **given}, method_options)
    enable_compilation_cache()
    data = one_batch(train)
    key = jax.random.PRNGKey(seed)
    run = Run(model, method, src_vocab, tgt_vocab, dict(config or {}), model_spec=model_spec,
              params={})
    t0 = time.perf_counter()
    if spec.requires == "conjugate":
        samples = _fit_conjugate(model, data, spec, mo, key, run, progress)
    elif spec.kind == "mcmc":
        kernel = {"NUTS": NUTS, "HMC": HMC}[spec.kernel](_program(model))
        mcmc = MCMC(kernel, num_warmup=mo["warmup"], num_samples=mo["samples"],
                    num_chains=mo["chains"], chain_method="sequential", progress_bar=progress)
        mcmc.run(key, data, extra_fields=("diverging",))
        samples = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
        diverging = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["diverging"])
        run.extra["sample_stats"] = {"diverging": diverging}
        run.config.update(mo)
    else:
        opts = training_options(type(model), steps=steps, lr=lr)
        site = declared(model, "site")
        guide = getattr(autoguide, spec.autoguide)(
            handlers.block(_program(model), hide=[site]))
        svi = SVI(_program(model), guide, numpyro.optim.optax_to_numpyro(optax.adam(opts["lr"])),
                  TraceEnum_ELBO(max_plate_nesting=declared(model, "max_plate_nesting")))
        result = svi.run(key, opts["steps"], data, progress_bar=progress)
        draws = Predictive(guide, params=result.params, num_samples=mo["samples"])(
            jax.random.fold_in(key, 1), data)
        samples = {k: np.asarray(v)[None] for k, v in draws.items()
                   if k in declared(model, "latents")}
        run.params = {k: np.asarray(v) for k, v in result.params.items()}
        losses = np.asarray(result.losses) / max(1, int(np.asarray(data.tgt_mask).sum()))
        run.history = [{"step": i + 1, "train_loss": float(v)} for i, v in enumerate(losses)]
        run.config.update(steps=opts["steps"], lr=opts["lr"], **mo)
    seconds = time.perf_counter() - t0
    run.samples = samples
    run.extra.update(train_seconds=seconds, inference=spec.kind)
    note = convergence_note(method, mcmc_diagnostics(run)) if spec.kind == "mcmc" else None
    if note:
        print(note, file=sys.stderr)
    run.step = len(run.history)
    run.config.update(dict(config or {}), seed=seed, backend="numpyro")
    if spec.kind == "vb":
        run.extra["elbo"] = [h["elbo"] for h in run.history]
    if out is not None:
        run.save(out)
    return run


def _fit_conjugate(model, data, spec, mo, key, run, progress) -> dict:
    """``gibbs`` / ``vb`` on a model declaring ``conjugate`` (its ``aligner_spec``,
    ``conjugate_data`` and ``latent_values``): the posterior draws of its sites."""
    from .. import aligners as al
    from . import word_alignment as wa

    aspec = model.aligner_spec()
    sizes, arrays = model.conjugate_data(data)
    seed = int(jax.random.randint(key, (), 0, 2 ** 31 - 1))
    if spec.kind == "mcmc":
        mcmc = wa.gibbs_chains(aspec, sizes, arrays, [jnp.zeros((0,), jnp.int32)],
                               chains=mo["chains"], warmup=mo["warmup"], samples=mo["samples"],
                               seed=seed, progress=progress, record_tables=True)
        z = mcmc.get_samples(group_by_chain=True)
        wa.release(mcmc)  # NumPyro's cache would keep the run's states and the data alive
        run.extra["sample_stats"] = {"lp": np.asarray(z["loglik"])}
        run.config.update(mo)
        return {k: np.asarray(v) for k, v in
                model.latent_values(z["log_theta"], z["log_dist"]).items()}
    res = wa.vb_sweeps(aspec, sizes, arrays, iterations=mo["iterations"], tol=mo["tol"],
                       progress=progress)
    counts_c, counts_b = (jnp.asarray(c) for c in res["counts"])
    keys = jax.random.split(jax.random.fold_in(key, 1), mo["samples"])

    def draw(k):
        k1, k2 = jax.random.split(k)
        return (al.sample_translation(k1, aspec, counts_c, arrays["cell_src"], sizes["n_src"],
                                      sizes["n_tgt"]), al.sample_buckets(k2, aspec, counts_b))

    log_theta, log_dist = jax.jit(jax.vmap(draw))(keys)
    tokens = max(1, int(np.asarray(data.tgt_mask).sum()))
    run.history = [{"step": i + 1, "train_loss": -e / tokens, "elbo": e}
                   for i, e in enumerate(res["elbo"])]
    run.config.update(sweeps=len(res["elbo"]), **mo)
    return {k: np.asarray(v)[None] for k, v in model.latent_values(log_theta, log_dist).items()}


def posterior_draws(run, limit: int = MAX_EVAL_DRAWS) -> dict:
    """The run's posterior draws flattened over chains, thinned evenly to at most ``limit``:
    ``{site: [S, …]}``."""
    flat = {k: np.asarray(v).reshape(-1, *np.shape(v)[2:]) for k, v in run.samples.items()}
    n = len(next(iter(flat.values())))
    keep = np.unique(np.linspace(0, n - 1, min(n, limit)).round().astype(int))
    return {k: jnp.asarray(v[keep]) for k, v in flat.items()}


def _per_draw(model, params, fn):
    return jax.jit(jax.vmap(lambda g, b: fn(model, params, b, g), in_axes=(0, None)))


def _predictive(run, batches):
    """Per batch: (posterior-predictive log p(y_t | …) ``[B, T]``, averaged posterior
    marginals ``[B, T, S]``)."""
    model = run.model
    params = run.params or {}
    draws = posterior_draws(run)
    ll_fn = _per_draw(model, params, token_log_likelihood_given)
    post_fn = _per_draw(model, params, posterior_given)
    out = []
    S = len(next(iter(draws.values())))
    for b in batches:
        jb = to_jax(b, None, "bucket")
        ll = jax.nn.logsumexp(ll_fn(draws, jb), 0) - np.log(S)
        post = post_fn(draws, jb).mean(0)
        B, T = b.tgt_out.shape
        out.append((np.asarray(ll)[:B, :T], np.asarray(post)[:B, :T, :b.src.shape[1]]))
    return out


#: a chain set is called converged when every element of every global has R-hat at most this
#: and a bulk ESS at least that, with no divergence (Vehtari, Gelman, Simpson, Carpenter &
#: Bürkner 2021: R-hat < 1.01, ESS > 100 per chain for 4 chains)
RHAT_MAX, ESS_MIN = 1.01, 400


def mcmc_diagnostics(run) -> dict:
    """max R-hat, min bulk and tail ESS over every element of every global, divergences, and
    ``converged``: all within :data:`RHAT_MAX` / :data:`ESS_MIN`, no divergence."""
    if run.extra.get("inference") != "mcmc":
        return {}
    idata = arviz_api.from_dict(posterior={k: np.asarray(v) for k, v in run.samples.items()})
    summary = arviz_api.summary(idata, kind="diagnostics")
    div = run.extra.get("sample_stats", {}).get("diverging")
    out = {"rhat_max": float(summary["r_hat"].max()),
           "ess_bulk_min": float(summary["ess_bulk"].min()),
           "ess_tail_min": float(summary["ess_tail"].min()),
           "divergences": int(np.asarray(div).sum()) if div is not None else None}
    out["converged"] = bool(out["rhat_max"] <= RHAT_MAX and out["ess_bulk_min"] >= ESS_MIN
                            and not out["divergences"])
    return out


def convergence_note(method: str, diag: dict) -> str | None:
    """A one-line warning when the chains of ``method`` have not converged (None if they
    have, or for SVI)."""
    if not diag or diag["converged"]:
        return None
    why = [f"max R-hat {diag['rhat_max']:.3f} > {RHAT_MAX}"] if diag["rhat_max"] > RHAT_MAX \
        else []
    if diag["ess_bulk_min"] < ESS_MIN:
        why.append(f"min bulk ESS {diag['ess_bulk_min']:.0f} < {ESS_MIN}")
    if diag["divergences"]:
        why.append(f"{diag['divergences']} divergent transitions")
    return (f"warning: {method}: the chains have not converged ({', '.join(why)}); do not "
            f"trust this posterior (nuts is the reference)")


def global_report(run, batches, gold=None) -> dict:
    """The report of a global-latent run on ``batches``: the posterior-predictive NLL/token,
    AER of the posterior-averaged marginals' argmax (with gold), MCMC's diagnostics, seconds."""
    from ...common.metrics import aer

    preds = _predictive(run, batches)
    n_tokens = sum(b.n_tokens for b in batches)
    nll = -sum(float(ll.sum()) for ll, _ in preds) / n_tokens
    rep = {"method": run.method, "nll_per_token": nll, "ppl": float(np.exp(nll)),
           "exact": True, "predictive": "posterior", "n_pairs": sum(b.size for b in batches),
           "n_tokens": n_tokens, "backend": "numpyro",
           "seconds": run.extra.get("train_seconds"), **mcmc_diagnostics(run)}
    if gold is not None:
        links = _links(batches, preds)
        idx = sorted(links)
        rep["aer"] = aer([links[i] for i in idx], [gold[i] for i in idx])
    return rep


def _links(batches, preds) -> dict[int, set[tuple[int, int]]]:
    """Each target word (``<eos>`` left out) to its most probable source position — unless the
    mass the posterior leaves off the positions (a NULL word's, 1 − Σ_i) outweighs it."""
    links = {}
    for b, (_, post) in zip(batches, preds):
        a = post.argmax(-1)
        linked = post.max(-1) >= 1 - post.sum(-1)
        lengths = (b.tgt_mask.sum(-1) - 1).tolist()
        for r, idx in enumerate(b.index.tolist()):
            links[idx] = {(int(a[r, j]), j) for j in range(int(lengths[r])) if linked[r, j]}
    return links


def global_alignment_links(run, batches) -> dict[int, set[tuple[int, int]]]:
    """Corpus index → links {(source i, target j)}: the argmax of the alignment marginals
    averaged over the posterior draws of the globals."""
    return _links(batches, _predictive(run, batches))


def global_inference_data(run, batches, link_pair: int | None = 0):
    """ArviZ InferenceData of a global-latent run: ``posterior`` (every draw of the globals,
    ``[chain, draw, …]``, and ``link [chain, draw, link_target, link_source]`` — p(a_t = i |
    x, y, globals of the draw) of the corpus's pair ``link_pair``, so R-hat and ESS of its link
    marginals come from ``az.summary``), ``sample_stats`` (divergences, for MCMC),
    ``log_likelihood.y`` ``[chain, draw, token]`` — log p(y_t | x, y<t, globals) with the
    alignment summed out, one entry per real target token — and ``observed_data.y``; so
    ``az.summary``, ``az.plot_trace``, ``az.plot_rank``, ``az.loo`` and ``az.compare`` work
    unchanged."""
    model = run.model
    params = run.params or {}
    samples = {k: np.asarray(v) for k, v in run.samples.items()}
    C, D = next(iter(samples.values())).shape[:2]
    flat = {k: jnp.asarray(v.reshape(C * D, *v.shape[2:])) for k, v in samples.items()}
    ll_fn = _per_draw(model, params, token_log_likelihood_given)
    token_ll, observed, link = [], [], None
    for b in batches:
        jb = to_jax(b, None, "bucket")
        B, T = b.tgt_out.shape
        ll = np.asarray(ll_fn(flat, jb))[:, :B, :T]  # [C·D, B, T]
        mask = as_numpy(b.tgt_mask)
        token_ll.append(ll[:, mask])
        observed.append(as_numpy(b.tgt_out)[mask])
        rows = b.index.tolist()
        if link_pair is not None and link_pair in rows:
            r = rows.index(link_pair)
            post = np.asarray(_per_draw(model, params, posterior_given)(flat, jb))[:, r]
            t_len, s_len = int(mask[r].sum()), int(as_numpy(b.src_mask)[r].sum())
            link = post[:, :t_len, :s_len].reshape(C, D, t_len, s_len)
    log_lik = np.concatenate(token_ll, 1).reshape(C, D, -1)
    stats = {k: np.asarray(v) for k, v in run.extra.get("sample_stats", {}).items()}
    posterior = dict(samples)
    dims = {"y": ["token"]}
    if link is not None:
        posterior["link"] = link
        dims["link"] = ["link_target", "link_source"]
    return arviz_api.from_dict(
        posterior=posterior, sample_stats=stats or None, log_likelihood={"y": log_lik},
        observed_data={"y": np.concatenate(observed)}, dims=dims,
        attrs={"method": run.method, "inference_library": "numpyro",
               **({"link_pair": link_pair} if link is not None else {})})


def discrepancy(reference: dict, samples: dict) -> dict:
    """Per global site, a posterior's distance from the reference draws (``{site: [chain,
    draw, …]}`` each): the mean |Δ mean| in reference sds, the median sd ratio and the mean
    1-Wasserstein distance of the elements' marginals (in reference sds)."""
    out = {}
    for site, ref in reference.items():
        if site not in samples:
            continue
        r = np.asarray(ref).reshape(-1, int(np.prod(np.shape(ref)[2:], dtype=int)))
        s = np.asarray(samples[site]).reshape(-1, r.shape[1])
        sd = np.maximum(r.std(0), 1e-12)
        w1 = [arviz_api.wasserstein_1d(r[:, k], s[:, k]) / sd[k] for k in range(r.shape[1])]
        out[site] = {"mean_error_sd": float(np.mean(np.abs(s.mean(0) - r.mean(0)) / sd)),
                     "sd_ratio": float(np.median(s.std(0) / sd)),
                     "w1_sd": float(np.mean(w1))}
    return out
