"""How close a trained guide q(z | x, y) is to the exact posterior p(z | x, y), per method.

For each pair, K alignments z_k ~ q and their log importance weights
log w_k = log p(y, z_k | x) − log q(z_k | x, y) (:func:`~ppl_attention.pyro.inference.evaluate.
log_importance_weights`). Reported, per token or as shares of pairs:

- ``kl_exact_q``: mean over tokens of KL(p(z_t | x, y) ‖ q(z_t | x, y)) — models with an exact
  posterior and an enumerable guide; None otherwise;
- ``expected_aer``: the AER of q's draws against gold, averaged over draws (a draw of a
  continuous family aligns each target token to its largest weight, a segments family to every
  position it selects); None without gold (bags,
  a corpus without ``.align``);
- ``khat_share``: share of pairs whose PSIS k̂ (``az.psislw`` on the K weights) exceeds 0.7 —
  importance sampling from q is unreliable there (Vehtari et al. 2015). The Pareto fit needs a
  continuous tail: a categorical q concentrated on a few alignments repeats draws, the weights
  then take a handful of values and k̂ is noise (it came out > 0.7 on most pairs of a guide with
  KL(exact ‖ q) < 0.001 and ESS/K ≈ 0.98). So k̂ is computed only for pairs whose K weights take
  at least ``MIN_DISTINCT`` distinct values; ``khat_pairs`` counts them (such weights are
  bounded, since q's support is finite, so a pair left out has finite-variance weights);
- ``expected_uas`` (a tree family, with gold trees): the attachment score of q's draws of each
  source's tree, averaged over draws; ``expected_aer`` is then that of the word attention;
- ``rel_ess``: the mean over pairs of the importance-sampling ESS / K = 1 / (K Σ_k w̄_k²);
- ``elbo``: mean log w per token; ``log_lik``: exact log p(y | x) per token where enumerable,
  else the IWAE-K estimate; ``iwae_gap``: ``log_lik − iwae_K``, and ``elbo_gap``:
  ``log_lik − elbo`` (both ≥ 0 in expectation where log_lik is exact).
"""

from __future__ import annotations

import math

import numpy as np

from ..common import arviz_api
from ..common.backends import get_backend
from ..common.contract import capabilities, require
from ..common.importance_weights import KHAT_THRESHOLD, MIN_DISTINCT
from ..common.metrics import aer
from ..core.errors import UserError
from ..core.progress import progress_bar
from ..data.batching import array_kind, make_batches

__all__ = ["guide_diagnostics", "KHAT_THRESHOLD", "MIN_DISTINCT"]


def _logsumexp(a: np.ndarray, axis: int) -> np.ndarray:
    m = a.max(axis, keepdims=True)
    return (m + np.log(np.exp(a - m).sum(axis, keepdims=True))).squeeze(axis)


def guide_diagnostics(run, pairs, gold, num_samples: int = 100, seed: int = 0,
                      progress: bool = True, gold_trees: list | None = None) -> dict:
    """Diagnostics of ``run``'s guide on ``pairs`` with ``gold`` alignments (lists of
    (source, target) link sets; None: no E_q[AER]); see the module docstring. A NumPyro
    model's run is read through the NumPyro contract (the same numbers): the arrays come from
    the run's backend (``diagnostic_arrays``)."""
    if not isinstance(num_samples, int) or num_samples < 2:
        raise UserError(f"num_samples must be an int ≥ 2, got {num_samples!r}")
    pairs = getattr(pairs, "pairs", pairs)
    model = run.model
    require(model, "alignment", tool="guide diagnostics")
    ops = get_backend(run.backend)
    ops.prepare(run)
    if model.family.deterministic:
        raise UserError(f"{run.method}: a deterministic family ({model.family.name}) has no "
                        f"latent alignment to diagnose")
    caps = capabilities(model)
    exact = "exact-posterior" in caps and "exact-likelihood" in caps
    batches = make_batches(pairs, run.src_vocab, run.tgt_vocab, 64, gold=gold,
                           array=array_kind(model))
    kl_sum, n_tok, log_lik, elbo, iwae = 0.0, 0, 0.0, 0.0, 0.0
    khat, ess, draw_links = [], [], {k: {} for k in range(num_samples)}
    uas_hit = uas_n = 0  # q's trees against the gold trees (a tree family)
    for i, b in enumerate(progress_bar(batches, desc="diagnose", unit="batch", leave=False,
                               disable=not progress)):
        arr = ops.diagnostic_arrays(run, b, num_samples, seed * 100_003 + i)
        lw64 = arr["lw"].T  # [B, K]
        n_tok += b.n_tokens
        elbo += float(lw64.mean(1).sum())
        iw = _logsumexp(lw64, 1) - math.log(num_samples)
        iwae += float(iw.sum())
        distinct = np.array([len(np.unique(np.round(row, 9))) for row in lw64])
        if (distinct >= MIN_DISTINCT).any():
            _, k = arviz_api.psislw(lw64[distinct >= MIN_DISTINCT])
            khat.extend(np.atleast_1d(k).tolist())
        w = np.exp(lw64 - _logsumexp(lw64, 1)[:, None])
        ess.extend((1.0 / (w**2).sum(1) / num_samples).tolist())
        mask = np.asarray(b.tgt_mask)
        if exact:
            log_lik += float(arr["exact_ll"].sum())
            p_exact = arr["p_exact"]
            with np.errstate(divide="ignore", invalid="ignore"):
                terms = np.where(p_exact > 0, p_exact * (np.log(np.maximum(p_exact, 1e-30))
                                                         - arr["log_q"]), 0.0)
            kl_sum += float(np.where(mask, terms.sum(-1), 0.0).sum())
        else:
            log_lik += float(iw.sum())
        if arr.get("trees") is not None and gold_trees is not None:
            for r, idx in enumerate(b.index.tolist()):
                L = len(gold_trees[idx])
                hit = (arr["trees"][:, r, :L] == np.asarray(gold_trees[idx])[None]).sum()
                uas_hit, uas_n = uas_hit + int(hit), uas_n + L * num_samples
        draws = arr["draws"]
        lengths = (np.asarray(b.tgt_mask).sum(-1) - 1).tolist()
        for r, idx in enumerate(b.index.tolist()):
            for kk in range(num_samples):
                if draws.ndim == 4:  # a selection of positions per token (segments)
                    draw_links[kk][idx] = {(int(i), j) for j in range(lengths[r])
                                           for i in np.flatnonzero(draws[kk, r, j])}
                else:
                    draw_links[kk][idx] = {(int(draws[kk, r, j]), j) for j in range(lengths[r])}
    order = sorted(draw_links[0])
    expected_aer = None if gold is None else float(np.mean([
        aer([d[i] for i in order], [gold[i] for i in order]) for d in draw_links.values()]))
    khat = np.asarray(khat)
    return {
        "method": run.method,
        "kl_exact_q": kl_sum / n_tok if exact else None,
        "expected_aer": expected_aer,
        "khat_share": float(np.mean(khat > KHAT_THRESHOLD)) if len(khat) else None,
        "khat_median": float(np.median(khat)) if len(khat) else None,
        "khat_pairs": int(len(khat)),
        "rel_ess": float(np.mean(ess)),
        "log_lik": log_lik / n_tok,
        "log_lik_exact": exact,
        "elbo": elbo / n_tok,
        "iwae": iwae / n_tok,
        "iwae_gap": (log_lik - iwae) / n_tok,
        "elbo_gap": (log_lik - elbo) / n_tok,
        "expected_uas": uas_hit / uas_n if uas_n else None,
        "num_samples": num_samples,
        "n_pairs": len(pairs),
        "n_tokens": n_tok,
    }
