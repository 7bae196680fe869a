"""What the structure tests share to run one test on both backends: a structure of the library
built from NumPy arrays under Pyro (``"pyro"``) or NumPyro (``"numpyro"``), its results as
NumPy, events converted for ``log_prob``, and the chi-square test's draw counts per tier."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from brute_force import TOP_K

from ppl_attention.numpyro import crfs as jax_crfs
from ppl_attention.pyro import crfs as torch_crfs

BACKENDS = ["pyro", "numpyro"]
#: draws of the chi-square test: a fast form in the default tier, 20,000 in the statistical one
DRAWS = [pytest.param(2_000, id="fast"),
         pytest.param(20_000, id="full", marks=pytest.mark.statistical)]


def conv(backend, x, dtype=None):
    """A NumPy array (or None) as the backend's array."""
    if x is None:
        return None
    if backend == "pyro":
        t = torch.tensor(np.asarray(x))
        return t.to(getattr(torch, np.dtype(dtype).name)) if dtype is not None else t
    return jnp.asarray(x, dtype=dtype)


def make(backend, name, theta, lengths=None, dtype=np.float64):
    """``name`` (``LinearChainCRF``, ``SemiMarkovCRF``, ``TreeCRF``) of ``theta`` and
    ``lengths`` on ``backend``."""
    cls = getattr(torch_crfs if backend == "pyro" else jax_crfs, name)
    return cls(conv(backend, theta, dtype), conv(backend, lengths))


def arr(x):
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def draws(backend, d, k):
    """``k`` exact draws of ``d``, seeded."""
    if backend == "pyro":
        torch.manual_seed(0)
        return arr(d.sample((k,)))
    import jax

    return arr(d.sample(jax.random.PRNGKey(0), (k,)))


def every_operation(d, q) -> dict:
    """Every exact quantity of ``d`` (and against ``q``) as NumPy, per batch row."""
    top_events, top_scores = d.top_k(TOP_K)
    return dict(log_z=arr(d.log_partition), marginals=arr(d.marginals), entropy=arr(d.entropy()),
                best=arr(d.argmax()), cross_entropy=arr(d.cross_entropy(q)),
                kl=arr(d.kl_divergence(q)), top_events=arr(top_events),
                top_scores=arr(top_scores))


def assert_row_equals_brute_force(got: dict, b: int, ref: dict) -> None:
    """Row ``b`` of :func:`every_operation` against the brute-force ``ref`` (float64)."""
    np.testing.assert_allclose(got["log_z"][b], ref["log_z"], rtol=1e-10)
    for name in ("marginals", "entropy", "cross_entropy", "kl"):
        np.testing.assert_allclose(got[name][b], ref[name], atol=1e-10)
    np.testing.assert_array_equal(got["best"][b], ref["best"])
    np.testing.assert_allclose(got["top_scores"][:, b], ref["top_scores"], rtol=1e-10)
    np.testing.assert_array_equal(got["top_events"][:, b], ref["top_events"])


def counts_of(drawn, keys: list, key_of) -> np.ndarray:
    """How often each structure (``keys``, in order) was drawn; ``key_of(event)`` its key."""
    index = {k: j for j, k in enumerate(keys)}
    counts = np.zeros(len(keys))
    for e in drawn:
        counts[index[key_of(e)]] += 1
    return counts
