"""Alignments as ArviZ ``InferenceData``, for any model with the ``alignment`` capability.

ArviZ's ``from_pyro`` / ``from_numpyro`` take MCMC objects only and fail on enumerated models,
so the groups are built here with ``az.from_dict`` and xarray:

- ``posterior``: ``alignment`` (chain, draw, pair, target_pos, source_pos) — one-hot exact
  posterior draws where the model has them (``posterior-samples``: independent per position for
  one site under the target plate, forward filtering–backward sampling for a Markov chain), the
  guide's weight draws for continuous families, the deterministic weights for a deterministic
  one; for enumerable models trained with an inference network also ``alignment_q``, draws from
  the trained guide q(z_t | x, y).
- ``exact_posterior`` (``exact-posterior``): the marginals p(z_t = j | x, y), (pair,
  target_pos, source_pos).
- ``prior``: ``alignment`` draws from p(z_t | x, y<t) (per position from its marginals where the
  model gives them — for a Markov chain these are the chain's marginals, not joint paths).
- ``log_likelihood``: ``y`` (chain, draw, token): log p(y_t | x, y<t, z_t) at each posterior draw,
  one entry per real target token (``<eos>`` included), so ``az.loo`` / ``az.waic`` run.
- ``observed_data``: ``y`` (token), the target token ids.
- a tree family (``tree``, ``tree-marginals``): ``posterior.heads`` / ``prior.heads`` (chain,
  draw, pair, source_pos) — trees of each source drawn from the guide q(tree | x, y) (exact
  draws of the prior tree for ``tree-marginals``) and from the prior p(tree | x), the head of
  each word (0-based, the root's child its own index); ``tree_marginals.arcs`` (pair, head_pos,
  source_pos): p(head of word m is h) of the tree the posterior heads are drawn from (diagonal:
  the root). ``alignment`` is then the query's word attention.

Padded target/source positions are NaN (weights) so every array is rectangular. Coordinates:
``pair`` (corpus index), ``target_pos``, ``source_pos``; ``source_token`` (pair, source_pos) and
``target_token`` (pair, target_pos) name the tokens, ``token_pair``/``token_pos``/``token_text``
name each log-likelihood entry.
"""

from __future__ import annotations

import numpy as np

from ..common import arviz_api
from ..common.backends import get_backend
from ..common.contract import require
from ..core.errors import UserError
from ..core.progress import progress_bar
from ..data.batching import array_kind, make_batches, pair_sides

__all__ = ["to_inference_data"]


def to_inference_data(run, pairs, num_samples: int = 100, seed: int = 0, batch_size: int = 64,
                      progress: bool = True, importance: dict | None = None):
    """``arviz.InferenceData`` of the alignments of ``pairs`` (a list of (source, target) token
    lists, or a :class:`~ppl_attention.data.tasks.Split`) under a trained ``run``, its arrays
    from the run's backend (``alignment_arrays`` of :mod:`ppl_attention.pyro.inference.posterior` or
    :mod:`ppl_attention.numpyro.inference.posterior`: the same groups either way).

    ``importance`` (``{"samples": K, "threshold": t}``): ``posterior`` holds ``num_samples``
    draws resampled from the guide's importance-corrected posterior (K draws per pair, PSIS;
    :mod:`ppl_attention.common.importance_weights`) and their log-likelihoods, and a group
    ``importance``
    holds each pair's ``khat`` and the K draws' ``log_weights`` and normalized ``weights``."""
    import xarray as xr

    from ..common.importance_weights import check_importance, correct

    if not isinstance(num_samples, int) or num_samples <= 0:
        raise UserError(f"num_samples must be a positive int, got {num_samples!r}")
    require(run.model, "alignment", tool="posterior analysis")
    pairs = getattr(pairs, "pairs", pairs)
    if not pairs:
        raise UserError("no pairs to analyse")
    ops = get_backend(run.backend)
    if importance is not None:
        check_importance(run, importance["samples"])
        imp_rng = np.random.default_rng(seed)
        imp_khat = np.full(len(pairs), np.nan)
        imp_lw = np.full((len(pairs), importance["samples"]), np.nan)
        imp_w = np.full((len(pairs), importance["samples"]), np.nan)
    ops.prepare(run)
    batches = make_batches(pairs, run.src_vocab, run.tgt_vocab, batch_size,
                           array=array_kind(run.model))
    N, K = len(pairs), num_samples
    sides = [pair_sides(p, run.tgt_vocab) for p in pairs]  # source, target (+ <eos>), ids
    T = max(len(t) for _, t, _ in sides)
    S = max(len(s) for s, _, _ in sides)
    nan = np.float32(np.nan)
    post = np.full((K, N, T, S), nan, np.float32)
    prior_draws = np.full((K, N, T, S), nan, np.float32)
    q_draws = None
    exact = None
    trees = None  # heads [K, N, S], prior heads, arc marginals [N, S, S] (a tree family)
    token_ll = [[] for _ in range(N)]
    seeds = np.random.default_rng(seed)
    for b in progress_bar(batches, desc="analyze", unit="batch", leave=False, disable=not progress):
        arr = ops.alignment_arrays(run, b, K, int(seeds.integers(2**31 - 1)))
        if importance is not None:  # the posterior draws: resampled from the corrected one
            imp = ops.importance_arrays(run, b, importance["samples"],
                                        int(seeds.integers(2**31 - 1)))
            c = correct(imp["log_w"], imp["values"], imp_rng, resamples=K)
            cols = np.arange(b.size)[None, :]
            drawn = imp["values"][c["resampled"], cols]
            if arr.get("heads") is not None:  # a tree: heads from the arc indicators
                S_b = b.src.shape[1]
                real = np.arange(S_b) < np.asarray(b.src_mask).sum(-1)[:, None]
                arr["heads"] = np.where(real[None], drawn.argmax(-2), np.arange(S_b))
                arr["arc_marginals"] = c["marginals"]
            else:
                arr["posterior"] = drawn
            arr["log_lik"] = imp["token_ll"][c["resampled"], cols]
            for r, i in enumerate(b.index.tolist()):
                imp_khat[i], imp_lw[i], imp_w[i] = c["khat"][r], imp["log_w"][:, r], \
                    c["weights"][:, r]
        for r, i in enumerate(b.index.tolist()):
            s_len, t_len = int(b.src_mask[r].sum()), int(b.tgt_mask[r].sum())
            post[:, i, :t_len, :s_len] = arr["posterior"][:, r, :t_len, :s_len]
            prior_draws[:, i, :t_len, :s_len] = arr["prior_draws"][:, r, :t_len, :s_len]
            if arr["exact"] is not None:
                if exact is None:
                    exact = np.full((N, T, S), nan, np.float32)
                exact[i, :t_len, :s_len] = arr["exact"][r, :t_len, :s_len]
            if arr["q"] is not None:
                if q_draws is None:
                    q_draws = np.full((K, N, T, S), nan, np.float32)
                q_draws[:, i, :t_len, :s_len] = arr["q"][:, r, :t_len, :s_len]
            token_ll[i] = arr["log_lik"][:, r, :t_len]
            if arr.get("heads") is not None:
                if trees is None:
                    trees = {"heads": np.full((K, N, S), nan, np.float32),
                             "prior_heads": np.full((K, N, S), nan, np.float32),
                             "arc_marginals": np.full((N, S, S), nan, np.float32)}
                trees["heads"][:, i, :s_len] = arr["heads"][:, r, :s_len]
                trees["prior_heads"][:, i, :s_len] = arr["prior_heads"][:, r, :s_len]
                trees["arc_marginals"][i, :s_len, :s_len] = arr["arc_marginals"][r, :s_len,
                                                                                 :s_len]
    log_lik = np.concatenate(token_ll, axis=1)  # [K, n_tokens]
    tgt_ids, tok_pair, tok_pos, tok_text = [], [], [], []
    for i, (_, t, ids) in enumerate(sides):
        for j, (tok, tid) in enumerate(zip(t, ids)):
            tgt_ids.append(tid)
            tok_pair.append(i)
            tok_pos.append(j)
            tok_text.append(tok)

    def tokens(side, width):
        a = np.full((N, width), "", dtype=object)
        for i, names in enumerate(sides):
            seq = names[side]
            a[i, : len(seq)] = seq
        return a.astype(str)

    dims5 = ["pair", "target_pos", "source_pos"]
    coords = {"pair": np.arange(N), "target_pos": np.arange(T), "source_pos": np.arange(S),
              "token": np.arange(len(tgt_ids))}
    posterior = {"alignment": post[None]}
    prior = {"alignment": prior_draws[None]}
    if q_draws is not None:
        posterior["alignment_q"] = q_draws[None]
    if trees is not None:
        posterior["heads"] = trees["heads"][None]
        prior["heads"] = trees["prior_heads"][None]
    idata = arviz_api.from_dict(
        posterior=posterior,
        prior=prior,
        log_likelihood={"y": log_lik[None]},
        observed_data={"y": np.asarray(tgt_ids)},
        coords=coords,
        dims={"alignment": dims5, "alignment_q": dims5, "y": ["token"],
              "heads": ["pair", "source_pos"]},
        attrs={"method": run.method, "family": run.model.family.name,
               "inference_library": run.backend, "num_samples": K},
    )
    extra = {"source_token": (("pair", "source_pos"), tokens(0, S)),
             "target_token": (("pair", "target_pos"), tokens(1, T))}
    tok_coords = {"token_pair": ("token", np.asarray(tok_pair)),
                  "token_pos": ("token", np.asarray(tok_pos)),
                  "token_text": ("token", np.asarray(tok_text, dtype=str))}
    attrs = {"method": run.method, "family": run.model.family.name, "num_samples": K,
             "inference_library": run.backend}
    for group in ("posterior", "prior"):
        ds = arviz_api.group_dataset(idata, group).assign_coords(extra)
        ds.attrs.update(attrs)
        arviz_api.add_group(idata, group, ds)
    for group in ("log_likelihood", "observed_data"):
        arviz_api.add_group(idata, group,
                            arviz_api.group_dataset(idata, group).assign_coords(tok_coords))
    if exact is not None:
        ds = xr.Dataset({"alignment": (dims5, exact)},
                        coords={k: coords[k] for k in dims5} | extra)
        arviz_api.add_group(idata, "exact_posterior", ds)
    if importance is not None:
        ds = xr.Dataset({"khat": (("pair",), imp_khat),
                         "log_weights": (("pair", "particle"), imp_lw),
                         "weights": (("pair", "particle"), imp_w)},
                        coords={"pair": coords["pair"],
                                "particle": np.arange(importance["samples"])},
                        attrs={"khat_threshold": importance["threshold"],
                               "importance_samples": importance["samples"]})
        arviz_api.add_group(idata, "importance", ds)
        ds = arviz_api.group_dataset(idata, "posterior")
        ds.attrs["posterior"] = "importance"
        arviz_api.add_group(idata, "posterior", ds)
    if trees is not None:  # p(head of word m is h): the tree the posterior heads come from
        ds = xr.Dataset({"arcs": (("pair", "head_pos", "source_pos"), trees["arc_marginals"])},
                        coords={"pair": coords["pair"], "head_pos": np.arange(S),
                                "source_pos": coords["source_pos"],
                                "source_token": extra["source_token"]})
        arviz_api.add_group(idata, "tree_marginals", ds)
    return idata
