"""What the structure tests share to run one test on both backends: a structure of the library
built from NumPy arrays under Pyro (``"pyro"``) or NumPyro (``"numpyro"``), its results as
NumPy, events converted for ``log_prob``, and the chi-square test's draw counts per tier."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

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
