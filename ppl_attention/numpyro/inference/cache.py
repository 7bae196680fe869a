"""JAX's persistent compilation cache for the NumPyro side: XLA compiles a step once per padded
batch shape (seconds each on a CPU); kept on disk, another seed, a resume, an evaluation or the
next job of a sweep loads the compiled program instead."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import jax

from ...errors import UserError

__all__ = ["CACHE_ENV", "default_cache_dir", "enable_compilation_cache"]

#: environment variable: ``off`` disables the persistent compilation cache, a path moves it
CACHE_ENV = "PPL_ATTENTION_JAX_CACHE"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ppl_attention" / "jax"


@functools.cache
def enable_compilation_cache() -> str | None:
    """Turn on JAX's persistent compilation cache in the user's cache directory
    (``$XDG_CACHE_HOME/ppl_attention/jax``, else ``~/.cache/ppl_attention/jax``), or in the
    directory ``$PPL_ATTENTION_JAX_CACHE`` names; ``PPL_ATTENTION_JAX_CACHE=off`` leaves it
    off. Returns the directory used (None: off). Compilations under half a second are not
    kept."""
    setting = os.environ.get(CACHE_ENV, "").strip()
    if setting.lower() in ("0", "off", "no", "false", "none"):
        return None
    path = Path(setting).expanduser() if setting else default_cache_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{CACHE_ENV}: cannot use {path} as JAX's compilation cache ({e}); "
                        f"set {CACHE_ENV}=off to train without it") from None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return str(path)
