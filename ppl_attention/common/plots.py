"""Matplotlib figures of training and comparisons (files, no screen needed), made to be read at a
glance: one fixed, distinct colour per method in every figure; the floor drawn where there is
one; a bound far above the rest clipped and labelled with its value rather than flattening every
other bar; training curves smoothed, the raw loss faint behind, and the annealed KL weight drawn
so a loss that rises with it is not read as divergence."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..core.method_specs import METHOD_SPECS  # noqa: E402

_PALETTE = plt.get_cmap("tab20").colors
#: tab20's pairs interleaved (dark, then light shades) so neighbours in the registry differ most
_ORDER = [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19]


def method_colour(name: str):
    """The colour of a method (or a "method setting=…" label) — the same in every figure."""
    method = name.split(" ")[0]
    names = list(METHOD_SPECS)
    i = names.index(method) if method in names else len(names) + sum(map(ord, method))
    return _PALETTE[_ORDER[i % len(_ORDER)]]


def smooth(values: list[float], weight: float = 0.9) -> list[float]:
    """Exponential moving average, bias-corrected (no pull towards 0 at the start)."""
    out, avg = [], 0.0
    for k, v in enumerate(values, 1):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight**k))
    return out


def _kl_axis(ax, steps, kls, colour="0.4", label="KL weight η·λ(t)"):
    twin = ax.twinx()
    twin.plot(steps, kls, "--", color=colour, lw=1, label=label)
    twin.set_ylabel("KL weight", color="0.4")
    twin.set_ylim(0, max(kls) * 1.05 if kls and max(kls) > 0 else 1)
    return twin


def plot_learning_curve(history: list[dict], path, title: str = "") -> None:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    pts = [(h["step"], h["train_loss"]) for h in history if "train_loss" in h]
    if pts:
        steps, loss = zip(*pts)
        ax.plot(steps, loss, color="C0", alpha=0.25, lw=0.8)
        ax.plot(steps, smooth(list(loss)), color="C0", label="train −ELBO/token (smoothed)")
    val = [h for h in history if "valid_nll" in h]
    if val:
        ax.plot([h["step"] for h in val], [h["valid_nll"] for h in val], "o-", color="C3",
                label="validation score")
    ax.set_xlabel("step")
    ax.set_ylabel("nats per token")
    ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    kl = [(h["step"], h["kl_weight"]) for h in history if "kl_weight" in h]
    if kl:
        twin = _kl_axis(ax, *zip(*kl))
        h2, l2 = twin.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_curves(curves: dict[str, list[dict]], path, key: str = "train_loss") -> None:
    """Smoothed training curves of several runs, one colour per method; annealed KL weights
    (dashed, right axis) where a method has one."""
    fig, ax = plt.subplots(figsize=(8, 4.8))
    kl_curves = {}
    for name, history in curves.items():
        pts = [(h["step"], h[key]) for h in history if key in h]
        if pts:
            steps, vals = zip(*pts)
            ax.plot(steps, smooth(list(vals)), label=name, color=method_colour(name))
        kl = [(h["step"], h["kl_weight"]) for h in history if "kl_weight" in h]
        if kl:
            kl_curves[name] = kl
    ax.set_xlabel("step")
    ax.set_ylabel(key.replace("_", " ") + " (nats/token, smoothed)")
    finite = [h[key] for hs in curves.values() for h in hs if key in h and math.isfinite(h[key])]
    if finite:  # a method whose loss starts far above the rest must not flatten them
        srt = sorted(finite)
        ax.set_ylim(min(srt) - 0.05 * abs(min(srt)), srt[int(0.9 * (len(srt) - 1))] * 1.3)
    handles, labels = ax.get_legend_handles_labels()
    if kl_curves:
        twin = ax.twinx()
        for name, kl in kl_curves.items():
            twin.plot(*zip(*kl), "--", color=method_colour(name), lw=1,
                      label=f"{name}: KL weight")
        twin.set_ylabel("KL weight (dashed)")
        twin.set_ylim(0, 1.05 * max(v for kl in kl_curves.values() for _, v in kl) or 1)
        h2, l2 = twin.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _clip_limit(values: list[float], floor: float | None) -> float:
    """An axis limit that shows every value but a far outlier: 1.3 × the largest value not more
    than 3× the median distance above the floor (or above 0)."""
    base = floor if floor is not None else 0.0
    excess = sorted(v - base for v in values)
    med = excess[len(excess) // 2]
    keep = [e for e in excess if e <= 3 * max(med, 1e-9)] or excess
    return base + 1.3 * max(keep)


def plot_nll(rows: list[dict], path, floor: float | None = None) -> None:
    """NLL/token per method (mean ± sd over seeds) as horizontal bars, the floor (the
    generator's exact NLL) drawn; a bound (IWAE, hatched) far above the rest is clipped and
    labelled with its value."""
    rows = [r for r in rows if r.get("nll_per_token") is not None]
    if not rows:
        return
    names = [r["method"] for r in rows]
    means = [r["nll_per_token"][0] for r in rows]
    sds = [r["nll_per_token"][1] for r in rows]
    hi = _clip_limit(means, floor)
    lo = (floor if floor is not None else min(means)) * 0.95
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(rows) + 1.4))
    for i, (n, m, s, r) in enumerate(zip(names, means, sds, rows)):
        ax.barh(i, min(m, hi) - lo, left=lo, xerr=s if m < hi else None, capsize=3,
                color=method_colour(n), hatch=None if r.get("exact") else "//",
                edgecolor="white")
        if m > hi:
            ax.text(hi, i, f" {m:.2f} →", va="center", ha="right", fontsize=8, color="white",
                    fontweight="bold")
    if floor is not None:
        ax.axvline(floor, color="black", lw=1.2, ls="--")
        ax.text(floor, len(rows) - 0.4, f" floor {floor:.3f}", fontsize=8, va="bottom")
    ax.set_yticks(range(len(rows)), names)
    ax.invert_yaxis()
    ax.set_xlim(lo, hi)
    ax.set_xlabel("NLL/token (hatched: an IWAE bound; plain: exact)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_aer_vs_nll(rows: list[dict], path, floor: float | None = None) -> None:
    """The trade-off of a comparison: alignment error against NLL/token, one point (with seed
    error bars) per method, the floor drawn; a far-off NLL clipped to the edge and labelled."""
    rows = [r for r in rows if r.get("aer") is not None and r.get("nll_per_token") is not None]
    if not rows:
        return
    xs = [r["nll_per_token"][0] for r in rows]
    hi = _clip_limit(xs, floor)
    fig, ax = plt.subplots(figsize=(7, 5))
    for r, x in zip(rows, xs):
        c = method_colour(r["method"])
        shown = min(x, hi)
        ax.errorbar(shown, r["aer"][0], xerr=r["nll_per_token"][1] if x < hi else None,
                    yerr=r["aer"][1], fmt="o" if r.get("exact") else "s", color=c, ms=8,
                    capsize=3, label=r["method"])
        ax.annotate(r["method"] + ("" if x < hi else f" (NLL {x:.2f} →)"), (shown, r["aer"][0]),
                    textcoords="offset points", xytext=(6, 4), fontsize=8, color=c)
    if floor is not None:
        ax.axvline(floor, color="black", lw=1.2, ls="--", label=f"floor {floor:.3f}")
    ax.set_xlim(right=hi * 1.02)
    ax.set_xlabel("NLL/token (□: an IWAE bound)")
    ax.set_ylabel("AER against gold")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, ncol=2, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
