"""Figures of alignment posteriors (matplotlib, saved as PNG)."""

from __future__ import annotations

import numpy as np

from ..common import arviz_api


def _valid(a):
    """Drop all-NaN padded rows and columns of a [T, S] array."""
    rows = ~np.all(np.isnan(a), 1)
    cols = ~np.all(np.isnan(a), 0)
    return a[np.ix_(rows, cols)], rows, cols


def plot_pair_heatmaps(idata, pair: int, path, title: str | None = None) -> None:
    """Prior vs exact posterior vs q (where present) for one pair: target × source heatmaps
    of the mean alignment weights, tokens as tick labels, a colour bar each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("prior p(z | x, y<t)", idata.prior["alignment"])]
    if arviz_api.has_group(idata, "exact_posterior"):
        panels.append(("exact posterior p(z | x, y)", idata.exact_posterior["alignment"]))
    else:
        panels.append(("posterior draws (guide)", idata.posterior["alignment"]))
    if "alignment_q" in idata.posterior:
        panels.append(("guide q(z | x, y)", idata.posterior["alignment_q"]))
    src = idata.prior["source_token"].sel(pair=pair).values
    tgt = idata.prior["target_token"].sel(pair=pair).values
    method = idata.posterior.attrs.get("method", "")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), squeeze=False)
    for ax, (name, da) in zip(axes[0], panels):
        a = da.sel(pair=pair)
        if "draw" in a.dims:
            a = a.mean(("chain", "draw"))
        a, rows, cols = _valid(np.asarray(a, dtype=float))
        im = ax.imshow(a, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_xticks(range(a.shape[1]), src[cols], rotation=90)
        ax.set_yticks(range(a.shape[0]), tgt[rows])
        ax.set_xlabel("source")
        ax.set_ylabel("target")
        ax.set_title(name, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(title or f"pair {pair} — method {method}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def entropy_per_position(da) -> np.ndarray:
    """Mean (over pairs and draws) entropy in nats of the alignment weights at each target
    position ``[T]`` (NaN where no pair reaches that position)."""
    a = np.asarray(da, dtype=float)
    if "draw" in da.dims:
        a = a.mean(axis=(0, 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.nansum(np.where(a > 0, a * np.log(a), 0.0), -1)
    h[np.all(np.isnan(a), -1)] = np.nan
    return np.nanmean(h, 0)


def plot_entropy(idata, path) -> None:
    """Entropy of prior and posterior alignment weights per target position."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    curves = [("prior", idata.prior["alignment"])]
    if arviz_api.has_group(idata, "exact_posterior"):
        curves.append(("exact posterior", idata.exact_posterior["alignment"]))
    else:
        curves.append(("posterior (mean of draws)", idata.posterior["alignment"]))
    if "alignment_q" in idata.posterior:
        curves.append(("guide q (mean of draws)", idata.posterior["alignment_q"]))
    for name, da in curves:
        ax.plot(entropy_per_position(da), marker="o", label=name)
    ax.set_xlabel("target position")
    ax.set_ylabel("entropy (nats)")
    ax.set_title(f"alignment entropy — {idata.posterior.attrs.get('method', '')}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_alignment_posteriors(runs, source: list[str], target: list[str], path,
                              title: str | None = None) -> None:
    """One heatmap per ``(label, run)``: the exact posterior p(z_t = j | x, y) (enumerable
    families; forward–backward for a Markov chain) or the attention weights (deterministic) of the
    pair (source, target), target tokens down, source tokens across, a colour bar each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch
    from pyro import poutine

    from ..data.batching import collate
    from ..pyro.attend import recording
    from ..pyro.models.base import declared, exact_posterior
    from ..pyro.models.device import model_device

    fig, axes = plt.subplots(1, len(runs), figsize=(3.2 * len(runs) + 1, 0.35 * len(target) + 2),
                             squeeze=False)
    for ax, (label, run) in zip(axes[0], runs):
        model = run.model
        b = collate([(source, target)], [0], run.src_vocab, run.tgt_vocab)
        b = b.to(model_device(model))
        with torch.no_grad():
            if model.family.deterministic:
                with recording() as calls, poutine.block():
                    model.model(b)
                w = next(c for c in calls if c.name == declared(model, "site")).weights
            else:
                w = exact_posterior(model, b)
        a = w[0, : len(target)].cpu().numpy()  # the <eos> step left out
        im = ax.imshow(a, vmin=0.0, vmax=1.0, cmap="Blues", aspect="auto")
        ax.set_xticks(range(len(source)), source)
        ax.set_yticks(range(len(target)), target)
        ax.set_title(label, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
