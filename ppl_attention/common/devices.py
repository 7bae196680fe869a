"""Where a command computes: ``--device cpu|cuda|cuda:N|auto``, for either backend.

Under Pyro the device is a ``torch.device`` the model, its batches and its random numbers
follow; under NumPyro it is the JAX device made the default while the command runs
(``jax.default_device``), so every array a program creates lands there. ``cuda`` on a machine
whose backend sees no GPU is refused before any work, with what to install. ``auto`` is the
first GPU when there is one, else the CPU. A run directory records the device it trained on
(``config.json``: ``train.device``); a run trained on one device evaluates on any other.
"""

from __future__ import annotations

import contextlib
import re

from ..core.errors import UserError

__all__ = ["DEVICE_HELP", "check_spec", "torch_device", "jax_device", "describe",
           "job_device", "jax_default_device", "device_count"]

DEVICE_HELP = ("where to compute: cpu, cuda (the first GPU), cuda:N, or auto (a GPU when there "
               "is one, else the CPU); default cpu")
_SPEC = re.compile(r"^(cpu|auto|cuda|cuda:\d+)$")

_INSTALL = {"pyro": "the CUDA build of torch (README: set-up on a GPU)",
            "numpyro": "the CUDA build of JAX: pip install -e '.[numpyro-cuda]' (README)"}


def check_spec(spec: str | None) -> str:
    """The spec itself, checked for its form (not yet for the machine)."""
    spec = "cpu" if spec is None else str(spec).strip().lower()
    if spec == "gpu":
        spec = "cuda"
    if not _SPEC.match(spec):
        raise UserError(f"--device {spec!r}: expected cpu, cuda, cuda:N or auto")
    return spec


def device_count(backend: str) -> int:
    """GPUs the backend sees (0 when none, or when its array library is not installed)."""
    if backend == "numpyro":
        try:
            import jax

            return len(jax.devices("gpu"))
        except (ImportError, RuntimeError):
            return 0
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _index(spec: str, backend: str) -> int | None:
    """The GPU index a spec names on this machine (None: the CPU); refuses what is absent."""
    if spec == "cpu":
        return None
    n = device_count(backend)
    if spec == "auto":
        return 0 if n else None
    index = int(spec.partition(":")[2] or 0)
    if n == 0:
        raise UserError(f"--device {spec}: {'JAX' if backend == 'numpyro' else 'torch'} sees no "
                        f"CUDA GPU on this machine ({backend} backend); use --device cpu, or "
                        f"install {_INSTALL[backend]}")
    if index >= n:
        raise UserError(f"--device {spec}: only {n} GPU(s) visible (cuda:0 … cuda:{n - 1})")
    return index


def torch_device(spec: str | None = "cpu"):
    """The ``torch.device`` of ``spec`` on this machine."""
    import torch

    index = _index(check_spec(spec), "pyro")
    return torch.device("cpu") if index is None else torch.device("cuda", index)


def jax_device(spec: str | None = "cpu"):
    """The JAX device of ``spec`` on this machine."""
    import jax

    index = _index(check_spec(spec), "numpyro")
    return jax.devices("cpu")[0] if index is None else jax.devices("gpu")[index]


def describe(spec: str | None, backend: str) -> str:
    """What a run directory records: ``cpu`` or ``cuda:N (the GPU's name)``."""
    spec = check_spec(spec)
    index = _index(spec, backend)
    if index is None:
        return "cpu"
    if backend == "numpyro":
        return f"cuda:{index} ({jax_device(spec).device_kind})"
    import torch

    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


def job_device(spec: str | None, job: int, backend: str) -> str:
    """The device of the ``job``-th job of a sweep: ``cuda`` (or ``auto`` on a GPU machine)
    spreads jobs over the visible GPUs, one device per job, round robin; a named device is
    every job's."""
    spec = check_spec(spec)
    if spec in ("cuda", "auto"):
        n = device_count(backend)
        if n:
            return f"cuda:{job % n}"
        if spec == "cuda":
            _index(spec, backend)  # refuses
        return "cpu"
    return spec


@contextlib.contextmanager
def jax_default_device(spec: str | None):
    """Make ``spec``'s JAX device the default while the block runs (NumPyro work)."""
    import jax

    with jax.default_device(jax_device(spec)):
        yield
