"""Every ArviZ call of the package, in one place: ArviZ 1.x (Python ≥ 3.12) reorganised the API
(``xarray.DataTree`` in place of ``InferenceData``, the statistics in ``arviz-stats``, the plots
in ``arviz-plots``), and the package is tested with ArviZ 0.x only (``pyproject.toml`` bounds it
``<1``); porting to 1.x is this file. Imported lazily: ArviZ is not loaded until a tool needs it.
"""

from __future__ import annotations

__all__ = ["from_dict", "from_numpyro", "psislw", "summary", "ess", "rhat",
           "ecdf_confidence_band", "plot_ecdf", "save_trace_plot", "wasserstein_1d"]


def _az():
    import arviz as az

    return az


def from_dict(**kwargs):
    """``arviz.from_dict`` (groups as dicts of ``[chain, draw, …]`` arrays)."""
    return _az().from_dict(**kwargs)


def from_numpyro(mcmc, **kwargs):
    """``arviz.from_numpyro``: posterior, sample_stats (divergences …), log_likelihood, observed
    data of an MCMC run."""
    return _az().from_numpyro(mcmc, **kwargs)


def psislw(log_weights):
    """Pareto-smoothed log weights and the k̂ of each row of ``log_weights [n, K]``."""
    return _az().psislw(log_weights)


def summary(idata, **kwargs):
    """``arviz.summary`` (mean, sd, HDI, ESS bulk/tail, R-hat) as a DataFrame."""
    return _az().summary(idata, **kwargs)


def ess(data, method: str = "bulk"):
    return _az().ess(data, method=method)


def rhat(data):
    return _az().rhat(data)


def ecdf_confidence_band(n: int, eval_points, cdf_at_eval_points, prob: float = 0.95):
    """Simultaneous confidence band ``(lower, upper)`` of the ECDF of ``n`` draws from the
    distribution whose CDF at ``eval_points`` is given (Säilynoja et al. 2022; ArviZ's
    optimized method)."""
    from arviz.stats.ecdf_utils import ecdf_confidence_band as band

    return band(n, eval_points, cdf_at_eval_points, prob=prob, method="optimized")


def plot_ecdf(values, *, ax, label: str | None = None, color=None, ci_prob: float = 0.95):
    """The ECDF of PIT ``values`` ∈ [0, 1] minus the uniform CDF, with its simultaneous
    ``ci_prob`` band (ArviZ's PIT-ECDF difference plot)."""
    import numpy as np
    from scipy.stats import uniform

    # an interior grid: at 0 and 1 the band is degenerate, and ArviZ's default grid (the
    # values' range) fails outright for PITs piled on one end
    grid = np.linspace(0.0, 1.0, 101)[1:-1]
    return _az().plot_ecdf(values, eval_points=grid, cdf=uniform(0, 1).cdf, difference=True,
                           confidence_bands=True, ci_prob=ci_prob, ax=ax,
                           plot_kwargs={"label": label, **({"color": color} if color else {})})


def save_trace_plot(idata, path) -> None:
    """``arviz.plot_trace`` of the posterior, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = _az().plot_trace(idata, compact=True)
    fig = axes.ravel()[0].figure
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def wasserstein_1d(a, b) -> float:
    """The 1-Wasserstein distance between the empirical distributions of ``a`` and ``b``."""
    from scipy.stats import wasserstein_distance

    return float(wasserstein_distance(a, b))
