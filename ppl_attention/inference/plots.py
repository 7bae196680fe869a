"""Matplotlib figures of training and comparisons (files, no screen needed)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_learning_curve(history: list[dict], path, title: str = "") -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    steps = [h["step"] for h in history if "train_loss" in h]
    ax.plot(steps, [h["train_loss"] for h in history if "train_loss" in h],
            label="train −ELBO/token")
    val = [h for h in history if "valid_nll" in h]
    if val:
        ax.plot([h["step"] for h in val], [h["valid_nll"] for h in val], "o-",
                label="valid NLL/token")
    ax.set_xlabel("step")
    ax.set_ylabel("nats per token")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_curves(curves: dict[str, list[dict]], path, key: str = "train_loss") -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, history in curves.items():
        pts = [(h["step"], h[key]) for h in history if key in h]
        if pts:
            ax.plot(*zip(*pts), label=name)
    ax.set_xlabel("step")
    ax.set_ylabel(key.replace("_", " ") + " (nats/token)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_bars(rows: list[dict], metric: str, path) -> None:
    names = [r["method"] for r in rows]
    means = [r[metric][0] if r[metric] is not None else float("nan") for r in rows]
    sds = [r[metric][1] if r[metric] is not None else 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(max(5, len(rows) * 0.9), 4))
    ax.bar(range(len(rows)), means, yerr=sds, capsize=3)
    ax.set_xticks(range(len(rows)), names, rotation=45, ha="right")
    ax.set_ylabel(metric)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
