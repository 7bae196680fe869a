"""Gradient estimators against the exact gradient, on models small enough to enumerate.

Three latents with a nonlinear downstream loss f(z) = ‖tanh(W vec(z)) − y‖² (W, y fixed,
Gaussian): a categorical over S = 7 positions (a chain of one step with 7 labels), a linear
chain (n = 5, t = 3: 243 label sequences) and a projective dependency tree (N = 5, one root
child: 42 trees), each q = p(· | θ) with Gaussian potentials. The objective is E_q[f(z)]; its
exact gradient sums every structure (``structures.estimators.exact_gradient``). Each estimator
of ``structures.estimators.gradient_draws`` gives ``--draws`` single-draw gradients; the table
reports the bias of their mean (cosine with the exact gradient, and relative L2 error
‖mean − exact‖ / ‖exact‖ — for an unbiased estimator the error is its Monte Carlo noise alone,
``noise`` ≈ √(variance / draws) / ‖exact‖, given beside it), the variance per draw
Σ_i Var(g_i) and the time per single-draw gradient (jitted under JAX; after a warm-up), for
both backends (``pyro``: torch; ``numpyro``: JAX).

The relaxations run at several temperatures (perturbed marginals, straight-through) and λs
(implicit MLE), so the table shows how their bias moves as τ → 0; SparseMAP's gradient is exact
for *its own* distribution, a different q, so its error against p(· | θ) is the difference of
the two objectives, with no variance.

    python benchmarks/estimators.py --draws 2000 --out runs/estimators
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "structures"))

SETTINGS = [("score-function", {}),
            ("perturbed", {"temperature": 1.0}), ("perturbed", {"temperature": 0.5}),
            ("perturbed", {"temperature": 0.1}),
            ("straight-through", {"temperature": 1.0}),
            ("straight-through", {"temperature": 0.5}),
            ("straight-through", {"temperature": 0.1}),
            ("imle", {"lam": 1.0}), ("imle", {"lam": 10.0}), ("imle", {"lam": 100.0}),
            ("sparsemap", {})]
MODELS = ("categorical", "chain", "tree")


def _problem(model: str):
    """(potentials θ, every structure's event [M, *event]) in NumPy, float64."""
    from brute_force import chain_events, dependency_trees

    rng = np.random.default_rng({"categorical": 0, "chain": 1, "tree": 2}[model])
    if model == "categorical":
        theta = np.zeros((1, 7, 7))
        theta[0, 0] = rng.standard_normal(7)
        events = np.asarray(chain_events((1, 7, 7), 1))
    elif model == "chain":
        theta = rng.standard_normal((5, 3, 3))
        events = np.asarray(chain_events((5, 3, 3), 5))
    else:
        theta = rng.standard_normal((5, 5))
        trees = dependency_trees(5, 5)
        events = np.zeros((len(trees), 5, 5))
        for k, heads in enumerate(trees):
            events[k, heads, np.arange(5)] = 1.0
    D = theta.size
    W = rng.standard_normal((D, 4)) / np.sqrt(3)
    y = rng.standard_normal(4)
    return theta, events, W, y


def _structure(backend: str, model: str, theta):
    if backend == "pyro":
        import torch

        from ppl_attention.pyro.crfs import LinearChainCRF
        from ppl_attention.pyro.trees import DependencyTree

        t = torch.as_tensor(theta)
        return DependencyTree(t).trainable if model == "tree" else LinearChainCRF(t).structure
    import jax.numpy as jnp

    from ppl_attention.numpyro.crfs import LinearChainCRF
    from ppl_attention.numpyro.trees import DependencyTree

    t = jnp.asarray(theta)
    return DependencyTree(t).trainable if model == "tree" else LinearChainCRF(t).structure


def run_cell(backend: str, model: str, draws: int) -> list[dict]:
    """Every estimator setting on one model and backend."""
    from ppl_attention.structures.estimators import exact_gradient, gradient_draws

    theta, events, W, y = _problem(model)
    ev_dims = theta.ndim
    if backend == "pyro":
        import torch

        torch.set_num_threads(1)
        torch.manual_seed(0)
        Wt, yt = torch.as_tensor(W), torch.as_tensor(y)

        def f(ev):
            flat = ev.reshape(*ev.shape[:ev.ndim - ev_dims], -1)
            return ((torch.tanh(flat @ Wt) - yt) ** 2).sum(-1)

        s = _structure(backend, model, theta)
        exact = exact_gradient(s, f, torch.as_tensor(events)).numpy()

        def estimate(name, kw, n, seed):
            torch.manual_seed(seed)
            return gradient_draws(_structure(backend, model, theta), f, name, n, **kw).numpy()
    else:
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)
        Wj, yj = jnp.asarray(W), jnp.asarray(y)

        def f(ev):
            flat = ev.reshape(*ev.shape[:ev.ndim - ev_dims], -1)
            return ((jnp.tanh(flat @ Wj) - yj) ** 2).sum(-1)

        s = _structure(backend, model, theta)
        exact = np.asarray(exact_gradient(s, f, jnp.asarray(events)))
        compiled = {}

        def estimate(name, kw, n, seed):
            key = (name, tuple(sorted(kw.items())), n)
            if key not in compiled:
                compiled[key] = jax.jit(lambda th, k: gradient_draws(
                    _structure(backend, model, th), f, name, n, k, **kw))
            return np.asarray(compiled[key](jnp.asarray(theta), jax.random.PRNGKey(seed)))
    rows = []
    norm = np.linalg.norm(exact)
    for name, kw in SETTINGS:
        estimate(name, kw, draws, 1)  # warm-up (and JAX's compilation)
        t0 = time.perf_counter()
        g = estimate(name, kw, draws, 2)
        seconds = time.perf_counter() - t0
        g = g.reshape(draws, -1)
        mean = g.mean(0)
        var = float(((g - mean) ** 2).sum(1).mean())
        cos = float(mean @ exact.ravel() / (np.linalg.norm(mean) * norm + 1e-300))
        rel = float(np.linalg.norm(mean - exact.ravel()) / norm)
        rows.append({"backend": backend, "model": model, "estimator": name,
                     "setting": ", ".join(f"{'τ' if k == 'temperature' else 'λ'} = {v:g}"
                                          for k, v in kw.items()),
                     "cosine": cos, "relative_error": rel,
                     "noise": float(np.sqrt(var / draws) / norm), "variance": var,
                     "ms_per_gradient": 1000 * seconds / draws})
    return rows


def table(rows: list[dict]) -> str:
    md = ["| model | estimator | setting | backend | cosine | rel. L2 error | MC noise | "
          "variance / draw | ms / gradient |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['model']} | {r['estimator']} | {r['setting'] or '—'} | {r['backend']} "
                  f"| {r['cosine']:.3f} | {r['relative_error']:.3f} | {r['noise']:.3f} | "
                  f"{r['variance']:.3g} | {r['ms_per_gradient']:.3f} |")
    return "\n".join(md)


def figure(rows: list[dict], path: Path) -> None:
    """Relative error of each relaxation against τ (λ for I-MLE) per model, the score
    function's Monte Carlo noise as the reference line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in MODELS if any(r["model"] == m for r in rows)]
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.4), sharey=True,
                             squeeze=False)
    axes = axes[0]
    colors = {"perturbed": "tab:blue", "straight-through": "tab:orange", "imle": "tab:green"}
    backend = rows[0]["backend"]
    for ax, model in zip(axes, models):
        mine = [r for r in rows if r["model"] == model and r["backend"] == backend]
        for est, color in colors.items():
            pts = [(float(r["setting"].split("= ")[1]), r["relative_error"]) for r in mine
                   if r["estimator"] == est]
            if est == "imle":
                pts = [(1 / x, e) for x, e in pts]  # λ large ≈ a small step: plot 1/λ
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color,
                    label=est + (" (x = 1/λ)" if est == "imle" else " (x = τ)"))
        sf = next(r for r in mine if r["estimator"] == "score-function")
        ax.axhline(sf["relative_error"], color="black", ls="--",
                   label="score function (unbiased: its error is noise)")
        ax.set_xscale("log")
        ax.set_title(model)
        ax.set_xlabel("temperature τ (or 1/λ)")
    axes[0].set_ylabel("relative L2 error of the mean gradient")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draws", type=int, default=2000, help="single-draw gradients per cell")
    p.add_argument("--backends", default="pyro,numpyro")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--out", default="runs/estimators")
    args = p.parse_args(argv)
    if args.draws < 1000:
        raise SystemExit("--draws: the table needs at least 1000 draws per cell")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for backend in args.backends.split(","):
        for model in args.models.split(","):
            print(f"{backend} {model} …", file=sys.stderr, flush=True)
            rows += run_cell(backend, model, args.draws)
    (out / "estimators.json").write_text(json.dumps(rows, indent=1, allow_nan=False) + "\n")
    md = table(rows)
    (out / "estimators.md").write_text(md + "\n")
    figure(rows, out / "estimators.png")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
