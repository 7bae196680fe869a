"""Importance-corrected posteriors, the part both backends share (NumPy and the ArviZ adapter):
the guide q(z | x, y) as a proposal, checked by Pareto-smoothed importance sampling.

For K draws z_k ~ q(z | x, y) of a sentence's whole alignment and their log weights

    log w_k = log p(y, z_k | x) − log q(z_k | x, y)

(the model's own densities — categorical, relaxed, Dirichlet, Weibull, LogNormal, Gaussian
context and tree sites alike), PSIS (Vehtari, Simpson, Gelman, Yao & Gabry 2024) replaces the
largest weights by the order statistics of a generalized Pareto fit to the tail and normalizes:
w̄_k, Σ_k w̄_k = 1. The corrected posterior is the weighted particle set {(z_k, w̄_k)}: its link
marginals are Σ_k w̄_k a(z_k) (a(z) the alignment's attention weights, one-hot for a categorical
alignment), draws are resampled in proportion to w̄ (for ArviZ), credible sets are taken from
the marginals. The fitted shape k̂ says whether to trust it, per sentence (Yao, Vehtari, Simpson
& Gelman 2018): k̂ < 0.7 — the corrected estimates are reliable; above, the proposal misses
posterior mass that K draws cannot recover. The same draws give the importance-weighted bound
log p(y | x) ≥ log (1/K) Σ_k w_k (IWAE-K) beside the ELBO, mean_k log w_k.

Backends produce ``log_w [K, B]`` and the draws' values; everything here is arrays.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.errors import UserError
from . import arviz_api

__all__ = ["DEFAULT_SAMPLES", "KHAT_THRESHOLD", "MIN_DISTINCT", "MEMORY_BUDGET", "POSTERIORS",
           "check_samples", "smooth", "corrected_marginals", "resample", "bounds",
           "unreliable_note", "refusal", "correct", "khat_summary", "evaluate_importance",
           "check_importance", "corrected_alignments"]

#: draws per sentence when the user gives none, and the k̂ above which a sentence's corrected
#: posterior is flagged (Vehtari et al. 2024, §3)
DEFAULT_SAMPLES = 100
KHAT_THRESHOLD = 0.7
#: bytes the K draws of one batch may take (the values' float32 arrays), before any work
MEMORY_BUDGET = 4 * 2**30
#: the fewest distinct weights a sentence's k̂ is fitted to: fewer (a discrete guide drawing
#: the same few alignments again) makes the Pareto fit noise — those weights take finitely many
#: values, so they are bounded and their variance finite; k̂ is then not estimated (NaN)
MIN_DISTINCT = 20
#: what ``--posterior`` may name: the tool's own (the exact posterior where the model has one,
#: else the guide) or the importance-corrected guide
POSTERIORS = ("default", "importance")


def check_samples(k, per_draw_bytes: int = 0, budget: int = MEMORY_BUDGET) -> int:
    """Refuse, before any work, a K that is not a positive int or whose draws of one batch would
    not fit ``budget`` bytes (``per_draw_bytes``: one draw's values)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise UserError(f"--importance-samples must be an int ≥ 2 (draws per sentence), got "
                        f"{k!r}")
    if per_draw_bytes and k * per_draw_bytes > budget:
        most = budget // per_draw_bytes
        raise UserError(f"--importance-samples {k}: the draws of one batch would take "
                        f"{k * per_draw_bytes / 2**30:.1f} GiB, more than the "
                        f"{budget / 2**30:.0f} GiB allowed; at most {most} here (or a smaller "
                        f"batch)")
    return k


def smooth(log_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PSIS of ``log_w [K, B]``: normalized weights ``w̄ [K, B]`` (each column sums to 1) and
    k̂ ``[B]``. Weights all equal (log weights within 1e-4: a proposal equal to the posterior)
    give k̂ = 0; fewer than
    :data:`MIN_DISTINCT` distinct ones, or too few draws for the tail fit (ArviZ needs about
    25), give NaN — not estimated."""
    log_w = np.asarray(log_w, dtype=np.float64)
    if log_w.ndim != 2 or log_w.shape[0] < 2:
        raise UserError(f"importance weights must be [K ≥ 2, B], got shape {list(log_w.shape)}")
    finite = np.isfinite(log_w)
    if not finite.any(0).all():
        bad = int(np.flatnonzero(~finite.any(0))[0])
        raise UserError(f"sentence {bad}: every importance weight is −inf (no draw of the guide "
                        f"has positive probability under the model)")
    spread = np.ptp(np.where(finite, log_w, np.nan), axis=0) if finite.all() else None
    smoothed, khat = arviz_api.psislw(log_w.T)
    w = np.exp(smoothed.T)
    w = w / w.sum(0, keepdims=True)
    khat = np.where(np.isfinite(khat), khat, np.nan).astype(np.float64)
    distinct = np.array([len(np.unique(np.round(col[np.isfinite(col)], 9))) for col in log_w.T])
    khat = np.where(distinct < MIN_DISTINCT, np.nan, khat)
    if spread is not None:  # equal to float precision: the proposal is the posterior
        khat = np.where(spread < 1e-4, 0.0, khat)
    return w, khat


def corrected_marginals(values: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Σ_k w̄_k values_k: ``values [K, B, …]`` (each draw's attention weights), ``w [K, B]`` →
    ``[B, …]``."""
    return np.einsum("kb,kb...->b...", np.asarray(w), np.asarray(values, dtype=np.float64))


def resample(w: np.ndarray, M: int, rng: np.random.Generator) -> np.ndarray:
    """``M`` indices per sentence drawn with replacement in proportion to ``w [K, B]`` →
    ``[M, B]``."""
    K, B = w.shape
    cum = np.cumsum(w, 0)
    u = rng.random((M, B)) * cum[-1]
    return np.minimum((u[:, None, :] > cum[None]).sum(1), K - 1)


def bounds(log_w: np.ndarray) -> dict:
    """The ELBO (mean of log w) and the IWAE-K bound log (1/K) Σ w of each sentence ``[B]``."""
    log_w = np.asarray(log_w, dtype=np.float64)
    K = log_w.shape[0]
    m = log_w.max(0)
    return {"elbo": log_w.mean(0),
            "iwae": m + np.log(np.exp(log_w - m).sum(0)) - math.log(K)}


def unreliable_note(bad: list, total: int, threshold: float = KHAT_THRESHOLD,
                    show: int = 8, numbering: str = "") -> str | None:
    """A one-line warning naming the sentences ``bad`` (their names) whose k̂ exceeds
    ``threshold``, out of ``total``; ``numbering`` says how they are counted (pairs from 0,
    as every JSON and ArviZ coordinate counts them; lines of an input file from 1). None when
    there are none."""
    if not bad:
        return None
    listed = ", ".join(str(n) for n in bad[:show]) + (" …" if len(bad) > show else "")
    return (f"warning: the importance-corrected posterior is unreliable (Pareto k̂ > "
            f"{threshold:g}) for {len(bad)} of {total} sentences"
            + (f" ({numbering})" if numbering else "") + f": {listed}")


def refusal(method_spec, family) -> str | None:
    """Why a run's posterior cannot be importance-corrected (None: it can): a deterministic or
    Markov family has no guide to correct (nothing sampled, or the chain is exact), and an exact
    method (no guide) has the exact posterior already."""
    if family.deterministic or family.markov:
        return (f"the {family.name} family has no sampled posterior to correct (nothing is "
                f"sampled, or the chain is summed out exactly)")
    if method_spec.posterior == "none":
        return (f"{method_spec.name} trains no guide: its posterior is the model's exact one "
                f"(leave out --posterior importance)")
    return None


def check_importance(run, k: int, batch_shape: tuple[int, int, int] | None = None) -> None:
    """Refuse, before any work, a run whose posterior cannot be corrected (:func:`refusal`) or
    a K that does not fit (``batch_shape`` = (B, T, S) of the largest batch)."""
    from ..core.method_specs import method_spec

    reason = refusal(method_spec(run.method), run.model.family)
    if reason:
        raise UserError(f"--posterior importance: {reason}")
    B, T, S = batch_shape or (1, 1, 1)
    per = B * (S * S if getattr(run.model.family, "tree", False) else T * S) * 4
    check_samples(k, per)


def correct(log_w: np.ndarray, values: np.ndarray, rng: np.random.Generator,
            resamples: int = 0) -> dict:
    """The corrected posterior of one batch from its draws: ``weights`` w̄ [K, B], ``khat`` [B],
    ``marginals`` [B, …] (Σ_k w̄_k values_k), ``elbo`` / ``iwae`` [B] and, with ``resamples``,
    ``resampled`` indices [M, B] into the K draws."""
    w, khat = smooth(log_w)
    out = {"weights": w, "khat": khat, "marginals": corrected_marginals(values, w),
           **bounds(log_w)}
    if resamples:
        out["resampled"] = resample(w, resamples, rng)
    return out


def khat_summary(khat: np.ndarray, threshold: float = KHAT_THRESHOLD) -> dict:
    """``khat_share`` — the share of sentences whose k̂ exceeds ``threshold`` among those where
    it was estimated —, ``khat_estimated`` (how many), ``khat_median``."""
    k = np.asarray(khat, dtype=np.float64)
    est = k[np.isfinite(k)]
    return {"khat_share": float(np.mean(est > threshold)) if est.size else None,
            "khat_estimated": int(est.size), "khat_median": float(np.median(est))
            if est.size else None, "khat_threshold": threshold}


def evaluate_importance(arrays_fn, batches, k: int, threshold: float = KHAT_THRESHOLD,
                        gold=None, tree: bool = False, seed: int = 0) -> dict:
    """Evaluation by the corrected posterior of every batch: ``arrays_fn(batch, k, seed)``
    gives a batch's draws (a backend's ``importance_arrays``). Reported per token: the
    IWAE-K bound and the ELBO of the same draws; the k̂ summary (:func:`khat_summary`) and
    ``khat_unreliable`` (corpus indices above the threshold); with ``gold`` links the AER of
    the corrected posterior's MAP links (each target token's largest marginal)."""
    rng = np.random.default_rng(seed)
    khat, links, elbo, iwae, n_tok = {}, {}, 0.0, 0.0, 0
    for i, b in enumerate(batches):
        arr = arrays_fn(b, k, seed * 1_000_003 + i)
        c = correct(arr["log_w"], arr["values"], rng)
        elbo, iwae, n_tok = elbo + float(c["elbo"].sum()), iwae + float(c["iwae"].sum()), \
            n_tok + b.n_tokens
        idx = b.index.tolist()
        for r, j in enumerate(idx):
            khat[j] = float(c["khat"][r])
        if not tree:
            best = c["marginals"].argmax(-1)  # [B, T]
            lengths = (b.tgt_mask.sum(-1) - 1).tolist()  # drop <eos>
            for r, j in enumerate(idx):
                links[j] = {(int(best[r, t]), t) for t in range(int(lengths[r]))}
    order = sorted(khat)
    ks = np.array([khat[j] for j in order])
    out = {"importance_samples": k, "importance_iwae_per_token": iwae / n_tok,
           "importance_elbo_per_token": elbo / n_tok, **khat_summary(ks, threshold),
           "khat_unreliable": [j for j in order if khat[j] > threshold]}
    if gold is not None and links:
        from .metrics import aer

        out["importance_aer"] = aer([links[j] for j in order], [gold[j] for j in order])
    return out


def corrected_alignments(arrays_fn, batches, k: int, seed: int = 0, tree_map=None) -> dict:
    """Per corpus index, from the corrected posterior of every batch: ``khat`` and the MAP —
    ``links`` (each real target token's largest corrected marginal, ``<eos>`` left out) or, with
    ``tree_map(marginals [B, S, S], lengths [B]) -> heads``, ``trees`` (the tree of most
    expected correct arcs: the best tree under the corrected arc marginals)."""
    rng = np.random.default_rng(seed)
    out = {"khat": {}, "links": {}, "trees": {}}
    for i, b in enumerate(batches):
        arr = arrays_fn(b, k, seed * 1_000_003 + i)
        c = correct(arr["log_w"], arr["values"], rng)
        idx = b.index.tolist()
        for r, j in enumerate(idx):
            out["khat"][j] = float(c["khat"][r])
        if tree_map is not None:
            lengths = b.src_mask.sum(-1).tolist()
            for j, heads in zip(idx, tree_map(c["marginals"], lengths)):
                out["trees"][j] = heads
        else:
            best = c["marginals"].argmax(-1)
            lengths = (b.tgt_mask.sum(-1) - 1).tolist()
            for r, j in enumerate(idx):
                out["links"][j] = {(int(best[r, t]), t) for t in range(int(lengths[r]))}
    return out
