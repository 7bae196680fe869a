"""Calibration of a trained run's guide by simulation (SBC: Talts et al. 2018; with the
data-dependent test quantity of Modrák et al. 2023), and the coverage of its credible sets.

For N simulated targets from the run's own model given held-out sources — (z*, y) ~ p(z, y | x)
with the sources' target lengths (:func:`ppl_attention.pyro.models.base.simulate`) — draw L
alignments from q(z | x, y) and ask where z* falls among them:

- **per token** (one random real token per pair, so the N ranks are independent): the rank of
  z*_t among the L draws of z_t — a categorical z as a source position, ties broken at random;
  for a simplex-valued z (Dirichlet, Concrete, Weibull, LogNormal) the ranks of three test
  quantities of its weights w instead: the weight on the position z* weighs most, the mean
  attended position Σ_j j·w_j and the entropy; for a context vector (Gaussian context) of two
  fixed random projections;
- **joint**: the rank of log q(z* | x, y) among log q(z_l | x, y) — a test quantity that
  depends on the data, which catches a guide too wide or too narrow as a whole.
- a **tree** family (``tree-sample``): z* is the source's tree drawn from the prior; per
  sentence one random word's head ranks among L draws from q's arc marginals of that word, the
  joint rank takes the exact log q of L trees drawn from q, and the coverage is that of the
  randomized credible sets of each word's head (q's arc marginals).

Under calibration each rank, made continuous as (rank + U)/(L + 1), is uniform on [0, 1]: its
ECDF stays inside the simultaneous band (Säilynoja et al. 2022, through ArviZ) and a
Kolmogorov–Smirnov test keeps a large p-value. **Coverage**: the share of real tokens whose z*
lies in q's credible set at 50/80/90/95 % — randomized highest-probability sets for a categorical
q (exactly the level under calibration), central intervals of the test quantities otherwise.
Where the model has an exact posterior the same is computed for it: the calibrated reference,
which must pass. On data with gold alignments, the coverage of the same sets (of the real
targets' q and exact posterior, the deterministic smallest set of mass ≥ level) against the
gold links says whether the model *and* its guide are honest about the truth.

The simulations and draws come from the run's backend (``calibration_arrays`` of
:mod:`ppl_attention.pyro.inference.calibration` or
:mod:`ppl_attention.numpyro.inference.calibration`);
everything here is NumPy. ``distort`` plants a miscalibration (a power study): a
:func:`planted` distortion (either backend), or a function of the guide site's distribution
(of the run's backend) returning another.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..common import arviz_api
from ..common.backends import get_backend
from ..common.contract import require
from ..core import jsonio
from ..core.errors import UserError
from ..core.method_specs import method_spec
from ..core.progress import progress_bar
from ..data.batching import array_kind, make_batches
from ..data.corpus import atomic_write_text

__all__ = ["LEVELS", "calibrate", "weighted_pit", "uncalibratable", "planted", "Planted",
           "rank_with_ties",
           "pit", "randomized_set_coverage", "interval_coverage", "uniformity", "write_report",
           "ALPHA"]

LEVELS = (0.5, 0.8, 0.9, 0.95)
ALPHA = 0.01  # a row fails when a uniformity test's p-value is below ALPHA / (its tests)


# --- statistics (numpy) -----------------------------------------------------------------------

def rank_with_ties(draws: np.ndarray, truth: np.ndarray, rng) -> np.ndarray:
    """Rank of ``truth [n]`` among ``draws [L, n]``: #{draws < truth} plus a uniform share of
    the ties, an integer in 0..L."""
    below = (draws < truth).sum(0)
    ties = (draws == truth).sum(0)
    return below + rng.integers(0, ties + 1)


def pit(ranks: np.ndarray, L: int, rng) -> np.ndarray:
    """(rank + U) / (L + 1): uniform on [0, 1] exactly when the ranks are uniform on 0..L."""
    return (ranks + rng.random(ranks.shape)) / (L + 1)


def uniformity(values: np.ndarray, prob: float = 0.99) -> dict:
    """KS p-value of ``values`` against U(0, 1) and whether their ECDF stays inside ArviZ's
    simultaneous ``prob`` band."""
    from scipy.stats import kstest

    values = np.sort(np.asarray(values, dtype=float))
    n = len(values)
    grid = np.linspace(0, 1, 101)[1:-1]
    lower, upper = arviz_api.ecdf_confidence_band(n, grid, grid, prob=prob)
    ecdf = np.searchsorted(values, grid, side="right") / n
    return {"p_value": float(kstest(values, "uniform").pvalue),
            "in_band": bool(np.all((ecdf >= lower - 1e-12) & (ecdf <= upper + 1e-12))), "n": n}


def randomized_set_coverage(probs: np.ndarray, truth: np.ndarray, levels, rng) -> np.ndarray:
    """Coverage at each level of the randomized highest-probability sets of ``probs [n, S]``:
    positions in decreasing probability, whole while the mass before them is below the level,
    the boundary one with the probability that makes the set's mass the level exactly — so a
    calibrated q covers its truth at exactly the level. ``truth [n]`` → ``[len(levels)]``."""
    order = np.argsort(-probs, -1)
    sorted_p = np.take_along_axis(probs, order, -1)
    before = np.cumsum(sorted_p, -1) - sorted_p  # mass of the positions ahead of each
    where = np.argmax(order == truth[:, None], -1)
    p_truth = sorted_p[np.arange(len(truth)), where]
    m_before = before[np.arange(len(truth)), where]
    out = []
    for level in levels:
        include = np.clip((level - m_before) / np.maximum(p_truth, 1e-300), 0.0, 1.0)
        out.append(float((rng.random(len(truth)) < include).mean()))
    return np.asarray(out)


def smallest_set(probs: np.ndarray, level: float) -> np.ndarray:
    """The deterministic highest-probability set of mass ≥ ``level`` of each row ``[n, S]`` →
    a boolean ``[n, S]``."""
    order = np.argsort(-probs, -1)
    sorted_p = np.take_along_axis(probs, order, -1)
    keep_sorted = (np.cumsum(sorted_p, -1) - sorted_p) < level
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, -1)
    return keep


def interval_coverage(draws: np.ndarray, truth: np.ndarray, levels) -> np.ndarray:
    """Coverage of the central intervals of ``draws [L, n]`` at each level by ``truth [n]``."""
    out = []
    for level in levels:
        lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2], axis=0)
        out.append(float(((truth >= lo) & (truth <= hi)).mean()))
    return np.asarray(out)


def simplex_quantities(w: np.ndarray, best: np.ndarray) -> np.ndarray:
    """Test quantities of attention weights ``w [..., S]``: the weight at ``best [...]`` (the
    position the simulated alignment weighs most), the mean position Σ_j j·w_j, the entropy
    → ``[..., 3]``."""
    w = np.asarray(w, dtype=np.float64)
    at_best = np.take_along_axis(w, best[..., None], -1)[..., 0]
    mean_pos = (w * np.arange(w.shape[-1])).sum(-1)
    entropy = -(np.where(w > 0, w * np.log(np.maximum(w, 1e-300)), 0.0)).sum(-1)
    return np.stack([at_best, mean_pos, entropy], -1)


QUANTITIES = {"simplex": ("weight at z*'s best", "mean position", "entropy"),
              "context": ("projection 1", "projection 2")}


def test_quantities(family, truth, draws, seed: int = 0):
    """(quantities at the truth ``[B, T, Q]``, at the draws ``[L, B, T, Q]``, names) of a
    continuous family's values: ``truth``/``draws`` are weights ``[…, S]`` for a simplex-valued
    family, context vectors ``[…, D]`` for a latent context."""
    if getattr(family, "latent_context", False):
        u = np.random.default_rng(seed).standard_normal((truth.shape[-1], 2))
        u /= np.linalg.norm(u, axis=0, keepdims=True)
        return truth @ u, draws @ u, QUANTITIES["context"]
    best = truth.argmax(-1)
    return (simplex_quantities(truth, best), simplex_quantities(draws, best[None]),
            QUANTITIES["simplex"])


@dataclass(frozen=True)
class Planted:
    """A planted miscalibration of the guide site, for power studies (either backend):
    ``"logits"`` multiplies a categorical q's logits by ``factor`` (> 1 over-confident, < 1
    under-confident), ``"concentration"`` a Dirichlet q's concentration (> 1 over-confident).
    Each backend turns it into a function of its site's distribution (``distortion``)."""

    kind: str
    factor: float


def planted(kind: str, factor: float) -> Planted:
    """:class:`Planted` ``(kind, factor)``, checked."""
    if kind not in ("logits", "concentration"):
        raise UserError(f"planted: kind must be 'logits' or 'concentration', got {kind!r}")
    if not factor > 0:
        raise UserError(f"planted: factor must be > 0, got {factor!r}")
    return Planted(kind, float(factor))


# --- aggregation ------------------------------------------------------------------------------

def _discrete_rows(probs_list, truth_list, mask_list, L, rng):
    """Per-token PIT values (one token per pair), joint log-probability PIT per pair, and the
    randomized-set coverage over every real token, for a categorical posterior."""
    tok_pit, joint_pit, cov_p, cov_t = [], [], [], []
    for probs, truth, mask in zip(probs_list, truth_list, mask_list):
        B, T, S = probs.shape
        p = np.where(mask[..., None], probs, 0.0).astype(np.float64)  # 1e-300 below
        p = p / np.maximum(p.sum(-1, keepdims=True), 1e-300)
        p[~mask] = 1.0 / S
        cum = np.cumsum(p, -1)
        u = rng.random((L, B, T, 1))
        draws = np.minimum((u > cum[None]).sum(-1), S - 1)  # [L, B, T]
        log_p = np.log(np.maximum(p, 1e-300))
        for b in range(B):
            real = np.flatnonzero(mask[b])
            if len(real) == 0:
                continue
            t = rng.choice(real)
            r = rank_with_ties(draws[:, b, t][:, None], np.array([truth[b, t]]), rng)
            tok_pit.append(pit(r, L, rng)[0])
            lq_draws = log_p[b, real][np.arange(len(real)), draws[:, b, real]].sum(-1)  # [L]
            lq_truth = log_p[b, real, truth[b, real]].sum()
            r = rank_with_ties(lq_draws[:, None], np.array([lq_truth]), rng)
            joint_pit.append(pit(r, L, rng)[0])
        cov_p.append(randomized_set_coverage(p[mask], truth[mask], LEVELS, rng))
        cov_t.append(int(mask.sum()))
    coverage = np.average(np.stack(cov_p), axis=0, weights=cov_t)
    return {"per-token z": np.asarray(tok_pit), "joint log q": np.asarray(joint_pit)}, coverage


def _continuous_rows(family, arrays, L, rng, seed):
    """Per-quantity PIT values (one token per pair), the joint log q PIT, and the interval
    coverage of every quantity over every real token (averaged over quantities)."""
    pits, names = {}, None
    joint, cov, n_tok = [], [], []
    for a in arrays:
        tq, dq, names = test_quantities(family, a["truth"], a["q_values"], seed)
        mask = a["mask"]
        for b in range(mask.shape[0]):
            real = np.flatnonzero(mask[b])
            if len(real) == 0:
                continue
            t = rng.choice(real)
            for k, name in enumerate(names):
                r = rank_with_ties(dq[:, b, t, k][:, None], np.array([tq[b, t, k]]), rng)
                pits.setdefault(name, []).append(pit(r, L, rng)[0])
            r = rank_with_ties(a["logq_draws"][:, b][:, None], np.array([a["logq_truth"][b]]),
                               rng)
            joint.append(pit(r, L, rng)[0])
        cov.append(np.mean([interval_coverage(dq[:, mask, k], tq[mask, k], LEVELS)
                            for k in range(len(names))], 0))
        n_tok.append(int(mask.sum()))
    pits = {k: np.asarray(v) for k, v in pits.items()}
    pits["joint log q"] = np.asarray(joint)
    return pits, np.average(np.stack(cov), axis=0, weights=n_tok)


def weighted_pit(values: np.ndarray, w: np.ndarray, truth: np.ndarray, rng) -> np.ndarray:
    """The weighted particles' CDF at the truth, ties shared at random: Σ_k w_k [v_k < t] +
    U Σ_k w_k [v_k = t] for ``values, w [K, n]`` and ``truth [n]`` — uniform on [0, 1] when
    the weighted particles are the posterior the truth was drawn from."""
    below = (w * (values < truth)).sum(0)
    ties = (w * (values == truth)).sum(0)
    return below + rng.random(below.shape) * ties


def _importance_row(fam, arrays, L, rng, seed, threshold) -> dict:
    """The calibration row of the importance-corrected posterior: the guide's K draws per target
    weighed (PSIS). A categorical (or tree) posterior is read through its corrected marginals —
    per token (per word) L draws of the marginal, randomized credible sets; a continuous one
    through its weighted particles — each test quantity's weighted CDF at the truth (its PIT),
    the central sets being those with |PIT − ½| ≤ level / 2; the joint rank is the weighted CDF
    of log q(z*) among the particles' log q."""
    from ..common.importance_weights import correct, khat_summary

    tree = getattr(fam, "tree", False)
    khat, joint, quantity_pits, cov, n_tok, probs, truths, masks = [], [], {}, [], [], [], [], []
    names = None
    for a in arrays:
        c = correct(a["imp"]["log_w"], a["imp"]["values"], rng)
        w = c["weights"]  # [K, B]
        khat.append(c["khat"])
        joint.append(weighted_pit(a["imp"]["log_q"], w, a["logq_truth"], rng))
        if tree or fam.enumerable:
            probs.append(np.swapaxes(c["marginals"], -1, -2) if tree else c["marginals"])
            truths.append(a["truth"])
            masks.append(a["mask"])
            continue
        tq, dq, names = test_quantities(fam, a["truth"], a["imp"]["values"], seed)
        mask = a["mask"]
        wt = w[:, :, None]  # the pair's weight for each of its tokens
        for k, name in enumerate(names):
            pits = weighted_pit(dq[..., k].reshape(dq.shape[0], -1),
                                np.broadcast_to(wt, dq.shape[:3]).reshape(dq.shape[0], -1),
                                tq[..., k].reshape(-1), rng).reshape(tq.shape[:2])
            for b in range(mask.shape[0]):
                real = np.flatnonzero(mask[b])
                if len(real):
                    quantity_pits.setdefault(name, []).append(pits[b, rng.choice(real)])
            cov.append([float((np.abs(pits[mask] - 0.5) <= level / 2).mean())
                        for level in LEVELS])
            n_tok.append(int(mask.sum()))
    if tree or fam.enumerable:
        pits, coverage = _discrete_rows(probs, truths, masks, L, rng)
        first = "per-word head" if tree else "per-token z"
        pits = {first: pits["per-token z"]}
    else:
        pits = {k: np.asarray(v) for k, v in quantity_pits.items()}
        coverage = np.average(np.asarray(cov), axis=0, weights=n_tok)
    pits["joint log q"] = np.concatenate(joint)
    row = _row("q corrected (importance)", pits, coverage)
    row.update(khat_summary(np.concatenate(khat), threshold))
    return row


def _part_rows(arrays):
    """A selection family's parts as two-way categoricals for :func:`_discrete_rows`: each (token
    t, part: a position, or a span) is selected or not, with q's exact probability
    ``q_part_probs`` — ``([B, T·P, 2] probabilities, [B, T·P] truths, [B, T·P] masks)`` per
    batch."""
    probs, truths, masks = [], [], []
    for a in arrays:
        p = a["q_part_probs"]
        B = p.shape[0]
        probs.append(np.stack([1 - p, p], -1).reshape(B, -1, 2))
        truths.append(np.asarray(a["part_truth"]).round().astype(int).reshape(B, -1))
        masks.append(np.asarray(a["part_mask"]).reshape(B, -1))
    return probs, truths, masks


def _joint_pits(arrays, L, rng, prefix: str = "") -> np.ndarray:
    """PIT of log q(z* | x, y) among log q(z_l | x, y) of L joint draws, one per pair
    (``prefix="exact_"``: of the exact posterior's)."""
    out = []
    for a in arrays:
        truth, draws = a[f"{prefix}logq_truth"], a[f"{prefix}logq_draws"]
        for b in range(truth.shape[0]):
            r = rank_with_ties(draws[:, b][:, None], np.array([truth[b]]), rng)
            out.append(pit(r, L, rng)[0])
    return np.asarray(out)


def _row(name: str, pits: dict, coverage: np.ndarray) -> dict:
    """One posterior's verdict: calibrated when every uniformity test passes at ALPHA / k
    (k tests, Bonferroni) — its KS p-value at least that, *and* its ECDF inside the
    simultaneous band of probability 1 − ALPHA / k."""
    level = ALPHA / len(pits)
    tests = {k: uniformity(v, prob=1 - level) for k, v in pits.items()}
    p_min = min(t["p_value"] for t in tests.values())
    in_band = all(t["in_band"] for t in tests.values())
    return {"posterior": name, "tests": tests, "p_min": p_min, "band_prob": 1 - level,
            "passes": bool(p_min >= level and in_band),
            "coverage": {f"{lv:.2f}": float(c) for lv, c in zip(LEVELS, coverage)},
            "pit": {k: v.tolist() for k, v in pits.items()}}


def _gold_coverage(probs_list, gold_list, mask_list) -> dict:
    out = {}
    for level in LEVELS:
        hit, n = 0, 0
        for probs, gold, mask in zip(probs_list, gold_list, mask_list):
            keep = smallest_set(probs.reshape(-1, probs.shape[-1]), level).reshape(probs.shape)
            for b, links in enumerate(gold):
                for t in range(int(mask[b].sum()) - 1):  # real tokens, <eos> left out
                    sources = [i for i, j in links if j == t]
                    if sources:
                        n += 1
                        hit += bool(keep[b, t, sources].any())
        out[f"{level:.2f}"] = hit / n if n else None
    return out


def uncalibratable(run) -> str | None:
    """Why ``run`` has no posterior to calibrate — its family samples nothing (soft attention, a
    CRF's marginals) or is a Markov chain summed out exactly — or None."""
    from ..core.method_specs import is_global_method

    if is_global_method(run.method):
        return (f"{run.method} infers global latents; their posterior is checked against NUTS "
                f"(compare) and by ppl-attention analyze, not by calibrating an alignment guide")
    fam = run.model.family
    if fam.deterministic or fam.markov:
        return (f"the {fam.name} family of {run.method} has no posterior to calibrate (nothing "
                f"is sampled, or the chain is exact)")
    return None


def calibrate(run, pairs, gold=None, num_sims: int = 200, draws: int = 99, seed: int = 0,
              distort=None, progress: bool = True, importance: dict | None = None) -> dict:
    """Calibration of ``run``'s guide (and of its exact posterior, where the model has one) on
    ``num_sims`` targets simulated from its model given the sources of ``pairs`` (cycled), with
    ``draws`` alignments per target; with ``gold`` (link sets of ``pairs``) also the coverage of
    the gold links. See the module docstring. Returns ``{"rows": [...], "gold_coverage": …}``.
    ``importance`` (``{"samples": K, "threshold": t}``) calibrates the guide's
    importance-corrected posterior instead (K draws of q per simulated target, PSIS; its
    ``draws`` resampled from the weighted particles), with the share of targets whose k̂
    exceeds the threshold in its row."""
    if not isinstance(num_sims, int) or num_sims < 10:
        raise UserError(f"--num-sims must be an int ≥ 10, got {num_sims!r}")
    if not isinstance(draws, int) or draws < 9:
        raise UserError(f"--draws must be an int ≥ 9, got {draws!r}")
    pairs = list(getattr(pairs, "pairs", pairs))
    if not pairs:
        raise UserError("no pairs to simulate from")
    model = run.model
    require(model, "alignment", tool="calibrate")
    fam = model.family
    m = method_spec(run.method)
    reason = uncalibratable(run)
    if reason:
        raise UserError(f"calibrate: {reason}")
    if importance is not None and getattr(fam, "selects", False):
        raise UserError(f"calibrate --posterior importance: the importance-corrected posterior "
                        f"of the {fam.name} family is not read per part; calibrate its guide "
                        f"(without --posterior importance)")
    ops = get_backend(run.backend)
    ops.prepare(run)
    if isinstance(distort, Planted):
        distort = ops.distortion(distort.kind, distort.factor)
    sims = [pairs[i % len(pairs)] for i in range(num_sims)]
    kind = array_kind(model)
    batches = make_batches(sims, run.src_vocab, run.tgt_vocab, 64, array=kind)
    arrays = []
    for i, b in enumerate(progress_bar(batches, desc="calibrate", unit="batch", leave=False,
                               disable=not progress)):
        arrays.append(ops.calibration_arrays(run, b, draws, seed * 1_000_003 + i, distort,
                                             importance))
    rng = np.random.default_rng(seed)
    rows = []
    masks = [a["mask"] for a in arrays]
    if importance is not None and m.posterior != "none":
        rows.append(_importance_row(fam, arrays, draws, rng, seed, importance["threshold"]))
    elif m.posterior != "none":
        if getattr(fam, "tree", False):  # each word's head; the joint by exact tree log q
            pits, cov = _discrete_rows([a["q_probs"] for a in arrays],
                                       [a["truth"] for a in arrays], masks, draws, rng)
            pits = {"per-word head": pits["per-token z"],
                    "joint log q": _joint_pits(arrays, draws, rng)}
        elif fam.enumerable:
            pits, cov = _discrete_rows([a["q_probs"] for a in arrays],
                                       [a["truth"] for a in arrays], masks, draws, rng)
        elif getattr(fam, "selects", False):  # each part selected or not; the joint by log q
            pits, cov = _discrete_rows(*_part_rows(arrays), draws, rng)
            pits = {"per-part selected": pits["per-token z"],
                    "joint log q": _joint_pits(arrays, draws, rng)}
        else:
            pits, cov = _continuous_rows(fam, arrays, draws, rng, seed)
        rows.append(_row(f"q ({m.posterior})", pits, cov))
    if all("exact_probs" in a for a in arrays):
        pits, cov = _discrete_rows([a["exact_probs"] for a in arrays],
                                   [a["truth"] for a in arrays], masks, draws, rng)
        if getattr(fam, "tree", False):  # the exact tree posterior: each head, the whole tree
            pits = {"per-word head": pits["per-token z"],
                    "joint log p": _joint_pits(arrays, draws, rng, prefix="exact_")}
        rows.append(_row("exact", pits, cov))
    out = {"method": run.method, "backend": run.backend, "num_sims": num_sims, "draws": draws,
           "seed": seed, "levels": list(LEVELS), "rows": rows, "gold_coverage": None,
           "gold_coverage_why": "no gold links given (a test.align beside the data)"}
    if gold is not None:
        real = make_batches(pairs, run.src_vocab, run.tgt_vocab, 64, gold=gold, array=kind)
        if getattr(fam, "tree", False) or getattr(fam, "selects", False):
            real = []  # gold links align target tokens, not tree heads; a selection: its parts
            over = "trees (heads of source words)" if getattr(fam, "tree", False) else \
                "selections of source parts"
            out["gold_coverage_why"] = (
                f"the {fam.name} family's posterior is over {over}, not one source position "
                f"per target token, so a credible set of positions per token (what the gold "
                f"links are checked against) is not defined for it")
        probs = [ops.calibration_probs(run, b) for b in real]
        gold_sets = [[gold[i] for i in b.index.tolist()] for b in real]
        rm = [np.asarray(b.tgt_mask) for b in real]
        out["gold_coverage"] = {k: _gold_coverage([p[k] for p in probs], gold_sets, rm)
                                for k in ("q_probs", "exact_probs")
                                if probs and all(k in p for p in probs)} or None
        if out["gold_coverage"] is not None:
            out["gold_coverage_why"] = None
        elif real:
            out["gold_coverage_why"] = "the run gives no per-token position probabilities"
    return out


# --- the report -------------------------------------------------------------------------------

def table(results: list[dict]) -> list[str]:
    """Markdown rows: method, posterior, min p-value (KS over the uniformity tests), in the
    band, coverage at the four levels, pass."""
    khat = any("khat_share" in row for r in results for row in r["rows"])
    lines = ["| method | posterior | min p (KS) | ECDFs in band | cov 50 | cov 80 | cov 90 | "
             "cov 95 | calibrated |" + (" share k̂ > threshold |" if khat else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|" if khat else "")]
    for r in results:
        for row in r["rows"]:
            band = all(t["in_band"] for t in row["tests"].values())
            cov = row["coverage"]
            share = row.get("khat_share")
            lines.append(f"| {r['method']} | {row['posterior']} | {row['p_min']:.3g} | "
                         f"{'yes' if band else 'no'} | " + " | ".join(
                             f"{cov[f'{lv:.2f}']:.3f}" for lv in LEVELS)
                         + f" | {'yes' if row['passes'] else 'NO'} |"
                         + ((" — |" if share is None else f" {share:.3f} |") if khat else ""))
    return lines


def write_report(result: dict, out: Path) -> list[Path]:
    """``calibration.json``, ``calibration.md`` and ``calibration.png`` (the PIT-ECDF
    differences with their bands, one panel per posterior and test; the coverage curve with
    the nominal line) into ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"Calibration of `{result['method']}` ({result['backend']}): {result['num_sims']} "
             f"simulated targets, {result['draws']} draws each; a posterior is calibrated when "
             f"every uniformity test of its k passes at {ALPHA} / k: the KS p-value at least "
             f"that and the PIT ECDF inside the simultaneous band of probability "
             f"1 − {ALPHA} / k.", "",
             *table([result])]
    gold = result.get("gold_coverage")
    if not gold and result.get("gold_coverage_why"):
        lines += ["", f"Coverage of the gold links: not computed — {result['gold_coverage_why']}."]
    if gold:
        lines += ["", "Coverage of the gold links (real targets):", "",
                  "| posterior | " + " | ".join(f"{lv:.0%}" for lv in LEVELS) + " |",
                  "|---|" + "---|" * len(LEVELS)]
        for k, cov in gold.items():
            lines.append(f"| {k.replace('_probs', '')} | " + " | ".join(
                "—" if v is None else f"{v:.3f}" for v in cov.values()) + " |")
    atomic_write_text(out / "calibration.md", "\n".join(lines) + "\n")
    atomic_write_text(out / "calibration.json", jsonio.dumps(result, indent=1) + "\n")
    tests = [(row["posterior"], name, np.asarray(v), row.get("band_prob", 0.99))
             for row in result["rows"] for name, v in row["pit"].items()]
    cols = len(tests) + 1
    fig, axes = plt.subplots(1, cols, figsize=(3.2 * cols, 3.0), squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, (post, name, values, band) in zip(axes[0], tests):
        arviz_api.plot_ecdf(values, ax=ax, color=colors[0] if post == "exact" else colors[1],
                            ci_prob=band)
        ax.set_title(f"{post}: {name}", fontsize=8)
        ax.axhline(0.0, color="black", lw=0.6)
    ax = axes[0][-1]
    ax.plot([0, 1], [0, 1], color="black", lw=0.8, label="nominal")
    for k, row in enumerate(result["rows"]):
        ax.plot(LEVELS, [row["coverage"][f"{lv:.2f}"] for lv in LEVELS], "o-",
                color=colors[k % 10], label=row["posterior"])
    ax.set(xlim=(0.4, 1.0), ylim=(0.4, 1.0), xlabel="credible level", ylabel="coverage")
    ax.set_title("coverage of z*", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "calibration.png", dpi=110)
    plt.close(fig)
    return [out / "calibration.json", out / "calibration.md", out / "calibration.png"]
