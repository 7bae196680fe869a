"""Every ArviZ call of the package, in one place, for ArviZ 0.x (``InferenceData``; Python ≥ 3.10)
and ArviZ 1.x (Python ≥ 3.12: ``xarray.DataTree`` in place of ``InferenceData``, the statistics
in ``arviz-stats``, the plots in ``arviz-plots``). What a tool builds is an ``InferenceData``
under 0.x and a ``DataTree`` under 1.x, with the same groups, variables and dimensions: both
index a group as ``idata["posterior"]``, write ``idata.to_netcdf(path)`` and are read back by
``az.from_netcdf``. Imported lazily: ArviZ is not loaded until a tool needs it.
"""

from __future__ import annotations

__all__ = ["from_dict", "from_numpyro", "add_group", "group_dataset", "group_names",
           "has_group", "psislw", "summary", "ess", "rhat", "ecdf_confidence_band", "plot_ecdf",
           "save_trace_plot", "wasserstein_1d", "arviz_major"]

#: the groups of ArviZ's schema ``from_dict`` takes (the rest of its keywords are options)
GROUPS = ("posterior", "posterior_predictive", "predictions", "sample_stats",
          "log_likelihood", "prior", "prior_predictive", "sample_stats_prior",
          "observed_data", "constant_data", "predictions_constant_data")


def _az():
    import arviz as az

    return az


def arviz_major() -> int:
    """ArviZ's major version (0 or 1)."""
    return int(_az().__version__.split(".")[0])


def from_netcdf(path):
    """``arviz.from_netcdf``: an InferenceData (netCDF: data, never code) read from ``path``."""
    return _az().from_netcdf(str(path))


def from_dict(**kwargs):
    """``arviz.from_dict``: groups as keywords (``posterior={name: [chain, draw, …] array}``,
    ``observed_data=…``), then ``coords``, ``dims``, ``attrs``."""
    az = _az()
    if arviz_major() >= 1:
        groups = {g: kwargs.pop(g) for g in GROUPS if kwargs.get(g) is not None}
        for g in GROUPS:
            kwargs.pop(g, None)
        if kwargs.get("attrs") is not None:  # 1.x takes attributes per group: every group's
            kwargs["attrs"] = {g: dict(kwargs["attrs"]) for g in groups}
        return az.from_dict(groups, **kwargs)
    return az.from_dict(**kwargs)


def add_group(idata, name: str, data) -> None:
    """Set the group ``name`` of ``idata`` in place to ``data`` (an ``xarray.Dataset``, or a
    group of another result): a custom group such as ``exact_posterior``, or a group replaced
    by its dataset with new coordinates."""
    import xarray as xr

    if not isinstance(data, xr.Dataset):
        data = data.to_dataset()
    if arviz_major() >= 1:
        idata[name] = xr.DataTree(data)
    elif name in idata.groups():
        setattr(idata, name, data)
    else:
        idata.add_groups({name: data}, warn_on_custom_groups=False)


def group_dataset(idata, name: str):
    """The group ``name`` of ``idata`` as an ``xarray.Dataset`` (a copy under ArviZ 1.x)."""
    group = idata[name]
    return group.to_dataset() if arviz_major() >= 1 else group


def group_names(idata) -> list[str]:
    """The names of ``idata``'s groups (``posterior``, ``exact_posterior`` …)."""
    return list(idata.children) if arviz_major() >= 1 else list(idata.groups())


def has_group(idata, name: str) -> bool:
    return name in group_names(idata)


def from_numpyro(mcmc, **kwargs):
    """``arviz.from_numpyro``: posterior, sample_stats (divergences …), log_likelihood, observed
    data of an MCMC run."""
    if arviz_major() >= 1:
        return _az().from_numpyro(posterior=mcmc, **kwargs)
    return _az().from_numpyro(mcmc, **kwargs)


def psislw(log_weights):
    """Pareto-smoothed log weights and the k̂ of each row of ``log_weights [n, K]``."""
    if arviz_major() >= 1:
        return _psislw_rows(log_weights)
    return _az().psislw(log_weights)


def _psislw_rows(log_weights):
    """ArviZ 1.x's PSIS, row by row, with 0.x's answer where 1.x refuses a row (a tail of
    fewer than 5 draws, or of equal values): the weights normalized, unsmoothed, and
    k̂ = ∞ — nothing can be said of their tail."""
    import numpy as np
    from arviz_stats.base import array_stats
    from scipy.special import logsumexp

    log_weights = np.asarray(log_weights, float)
    rows = log_weights.reshape(-1, log_weights.shape[-1])
    smoothed, khat = np.empty_like(rows), np.empty(rows.shape[0])
    for r, row in enumerate(rows):
        try:
            smoothed[r], khat[r] = array_stats.psislw(row, r_eff=1, axis=-1)
        except ValueError:
            smoothed[r], khat[r] = row - logsumexp(row), np.inf
    return smoothed.reshape(log_weights.shape), khat.reshape(log_weights.shape[:-1])


def summary(idata, **kwargs):
    """``arviz.summary`` (mean, sd, HDI, ESS bulk/tail, R-hat) as a DataFrame."""
    return _az().summary(idata, **kwargs)


def ess(data, method: str = "bulk"):
    return _az().ess(data, method=method)


def rhat(data):
    return _az().rhat(data)


def ecdf_confidence_band(n: int, eval_points, cdf_at_eval_points, prob: float = 0.95):
    """Simultaneous confidence band ``(lower, upper)`` of the ECDF of ``n`` draws from the
    distribution whose CDF at ``eval_points`` is given (Säilynoja et al. 2022): ArviZ 0.x's
    optimized method; ArviZ 1.x keeps only the simulation method (10,000 simulated ECDFs, a
    fixed seed), which finds the same band to Monte Carlo error."""
    import numpy as np

    if arviz_major() >= 1:
        from arviz_stats.ecdf_utils import (
            get_pointwise_confidence_band,
            simulate_confidence_bands,
        )

        pointwise = simulate_confidence_bands(n, 1, np.asarray(eval_points), prob, 10_000,
                                              np.random.default_rng(0))
        return get_pointwise_confidence_band(pointwise, n, np.asarray(cdf_at_eval_points))
    from arviz.stats.ecdf_utils import ecdf_confidence_band as band

    return band(n, eval_points, cdf_at_eval_points, prob=prob, method="optimized")


def plot_ecdf(values, *, ax, label: str | None = None, color=None, ci_prob: float = 0.95):
    """The ECDF of PIT ``values`` ∈ [0, 1] minus the uniform CDF, with its simultaneous
    ``ci_prob`` band (ArviZ's PIT-ECDF difference plot, drawn here on ``ax`` so that it is the
    same under ArviZ 0.x and 1.x): the line, the band shaded in the line's colour, and 0 — the
    ECDF of calibrated PITs — drawn as the reference."""
    import numpy as np

    values = np.sort(np.asarray(values, float).ravel())
    # an interior grid: at 0 and 1 the band is degenerate
    grid = np.linspace(0.0, 1.0, 101)[1:-1]
    ecdf = np.searchsorted(values, grid, side="right") / len(values)
    lower, upper = ecdf_confidence_band(len(values), grid, grid, prob=ci_prob)
    (line,) = ax.plot(grid, ecdf - grid, label=label, color=color)
    ax.fill_between(grid, np.asarray(lower) - grid, np.asarray(upper) - grid,
                    color=line.get_color(), alpha=0.15, linewidth=0)
    ax.axhline(0.0, color="0.3", linewidth=0.8)
    return ax


def save_trace_plot(idata, path) -> None:
    """``arviz.plot_trace`` of the posterior, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if arviz_major() >= 1:
        plots = _az().plot_trace_dist(idata, compact=True, backend="matplotlib")
        plots.savefig(path, dpi=90)
        plt.close("all")
        return
    axes = _az().plot_trace(idata, compact=True)
    fig = axes.ravel()[0].figure
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def wasserstein_1d(a, b) -> float:
    """The 1-Wasserstein distance between the empirical distributions of ``a`` and ``b``."""
    from scipy.stats import wasserstein_distance

    return float(wasserstein_distance(a, b))
