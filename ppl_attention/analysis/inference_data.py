"""Alignments as ArviZ ``InferenceData``.

ArviZ's ``from_pyro`` / ``from_numpyro`` take MCMC objects only and fail on enumerated models
(DESIGN.md §5), so the groups are built here with ``az.from_dict`` and xarray:

- ``posterior``: ``alignment`` (chain, draw, pair, target_pos, source_pos) — one-hot draws of
  the exact posterior p(z_t | x, y) for categorical models, the guide's weight draws for
  continuous families, the deterministic weights for soft attention; for categorical models
  with an inference network also ``alignment_q``, draws from the trained guide q(z_t | x, y).
- ``exact_posterior`` (categorical models): the marginals p(z_t = j | x, y), (pair, target_pos,
  source_pos).
- ``prior``: ``alignment`` draws from p(z_t | x, y<t).
- ``log_likelihood``: ``y`` (chain, draw, token): log p(y_t | x, y<t, z_t) at each posterior draw,
  one entry per real target token (``<eos>`` included), so ``az.loo`` / ``az.waic`` run.
- ``observed_data``: ``y`` (token), the target token ids.

Padded target/source positions are NaN (weights) so every array is rectangular. Coordinates:
``pair`` (corpus index), ``target_pos``, ``source_pos``; ``source_token`` (pair, source_pos) and
``target_token`` (pair, target_pos) name the tokens, ``token_pair``/``token_pos``/``token_text``
name each log-likelihood entry.
"""

from __future__ import annotations

import numpy as np
import pyro
import torch
from pyro import poutine

from ..data.batching import make_batches
from ..families import masked_softmax
from ..inference.methods import get_method

__all__ = ["to_inference_data", "alignment_arrays"]


def _guide_trace(run, batch):
    m = get_method(run.method)
    posterior = m.posterior if m.posterior != "none" else "inference"
    return poutine.trace(run.model.guide).get_trace(batch, posterior=posterior)


@torch.no_grad()
def alignment_arrays(run, batch, num_samples: int, generator: torch.Generator) -> dict:
    """Per batch, as numpy: ``prior`` [B, T, S] probabilities (or None), ``exact`` [B, T, S]
    (categorical) or None, ``posterior`` draws [K, B, T, S], ``q`` draws [K, B, T, S] or None,
    ``log_lik`` [K, B, T] (log p(y_t | ·, z_t) at the posterior draws), ``prior_draws``
    [K, B, T, S]."""
    model = run.model
    kind = model.family.name
    H = model.encode(batch.src, batch.src_mask)
    h, e, c = model.decode(H, batch.src_mask, batch.tgt_in)
    smask = batch.src_mask[:, None].expand(e.shape)
    prior = masked_softmax(e, smask)
    B, T, S = e.shape
    K = num_samples

    def one_hot_draws(probs):
        idx = torch.multinomial(probs.reshape(-1, S), K, replacement=True, generator=generator)
        idx = idx.T.reshape(K, B, T)
        return torch.nn.functional.one_hot(idx, S).to(probs.dtype), idx

    out = {"prior": prior, "exact": None, "q": None}
    if kind == "soft":
        out["posterior"] = prior.expand(K, B, T, S)
        ll = model.emission_log_prob(h, c, batch.tgt_out)
        out["log_lik"] = ll.expand(K, B, T)
        out["prior_draws"] = prior.expand(K, B, T, S)
    elif kind == "categorical":
        log_prior, emis = model.prior_and_emissions(batch)
        exact = (log_prior + emis).softmax(-1)
        out["exact"] = exact
        out["posterior"], idx = one_hot_draws(exact)
        out["log_lik"] = emis.gather(-1, idx.permute(1, 2, 0)).permute(2, 0, 1)
        out["prior_draws"], _ = one_hot_draws(prior)
        if get_method(run.method).posterior == "inference":
            q = masked_softmax(model.inference_scores(batch, H), smask)
            out["q"], _ = one_hot_draws(q)
    else:
        draws, lls, priors = [], [], []
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        pyro.set_rng_seed(seed)
        for _ in range(K):
            tr = _guide_trace(run, batch)
            value = tr.nodes["align"]["value"]
            draws.append(model.family.weights(value, None, smask))
            v = model.family.context(value, H)
            lls.append(model.emission_log_prob(h, v, batch.tgt_out))
            prior_tr = poutine.trace(model.model).get_trace(batch)
            priors.append(model.family.weights(prior_tr.nodes["align"]["value"], None, smask))
        out["posterior"], out["log_lik"] = torch.stack(draws), torch.stack(lls)
        out["prior_draws"] = torch.stack(priors)
    return {k: (None if v is None else v.float().numpy()) for k, v in out.items()}


def to_inference_data(run, pairs, num_samples: int = 100, seed: int = 0, batch_size: int = 64):
    """``arviz.InferenceData`` of the alignments of ``pairs`` (a list of (source, target) token
    lists, or a :class:`~ppl_attention.data.tasks.Split`) under a trained ``run``."""
    import arviz as az
    import xarray as xr

    if not isinstance(num_samples, int) or num_samples <= 0:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    if getattr(run.model.family, "markov", False):
        raise ValueError("posterior analysis of MarkovCategorical runs is not supported yet "
                         "(its prior is a chain, not per-position distributions)")
    pairs = getattr(pairs, "pairs", pairs)
    if not pairs:
        raise ValueError("no pairs to analyse")
    run.model.eval()
    pyro.clear_param_store()
    batches = make_batches(pairs, run.src_vocab, run.tgt_vocab, batch_size)
    N, K = len(pairs), num_samples
    T = max(len(t) for _, t in pairs) + 1  # + <eos>
    S = max(len(s) for s, _ in pairs)
    nan = np.float32(np.nan)
    post = np.full((K, N, T, S), nan, np.float32)
    prior_draws = np.full((K, N, T, S), nan, np.float32)
    q_draws = None
    exact = None
    token_ll = [[] for _ in range(N)]
    g = torch.Generator().manual_seed(seed)
    for b in batches:
        arr = alignment_arrays(run, b, K, g)
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
    log_lik = np.concatenate(token_ll, axis=1)  # [K, n_tokens]
    tgt_ids, tok_pair, tok_pos, tok_text = [], [], [], []
    for i, (_, t) in enumerate(pairs):
        ids, _ = run.tgt_vocab.encode(list(t))
        for j, (tok, tid) in enumerate(zip(list(t) + ["<eos>"], ids + [run.tgt_vocab.eos])):
            tgt_ids.append(tid)
            tok_pair.append(i)
            tok_pos.append(j)
            tok_text.append(tok)

    def tokens(side, width):
        a = np.full((N, width), "", dtype=object)
        for i, pair in enumerate(pairs):
            seq = list(pair[0]) if side == 0 else list(pair[1]) + ["<eos>"]
            a[i, : len(seq)] = seq
        return a.astype(str)

    dims5 = ["pair", "target_pos", "source_pos"]
    coords = {"pair": np.arange(N), "target_pos": np.arange(T), "source_pos": np.arange(S),
              "token": np.arange(len(tgt_ids))}
    posterior = {"alignment": post[None]}
    if q_draws is not None:
        posterior["alignment_q"] = q_draws[None]
    idata = az.from_dict(
        posterior=posterior,
        prior={"alignment": prior_draws[None]},
        log_likelihood={"y": log_lik[None]},
        observed_data={"y": np.asarray(tgt_ids)},
        coords=coords,
        dims={"alignment": dims5, "alignment_q": dims5, "y": ["token"]},
        attrs={"method": run.method, "family": run.model.family.name,
               "inference_library": "pyro", "num_samples": K},
    )
    extra = {"source_token": (("pair", "source_pos"), tokens(0, S)),
             "target_token": (("pair", "target_pos"), tokens(1, T))}
    tok_coords = {"token_pair": ("token", np.asarray(tok_pair)),
                  "token_pos": ("token", np.asarray(tok_pos)),
                  "token_text": ("token", np.asarray(tok_text, dtype=str))}
    attrs = {"method": run.method, "family": run.model.family.name, "num_samples": K}
    for group in ("posterior", "prior"):
        idata[group] = idata[group].assign_coords(extra)
        idata[group].attrs.update(attrs)
    for group in ("log_likelihood", "observed_data"):
        idata[group] = idata[group].assign_coords(tok_coords)
    if exact is not None:
        ds = xr.Dataset({"alignment": (dims5, exact)},
                        coords={k: coords[k] for k in dims5} | extra)
        idata.add_groups({"exact_posterior": ds}, warn_on_custom_groups=False)
    return idata
