"""JAX's persistent compilation cache for the NumPyro side: XLA compiles a step once per padded
batch shape (seconds each on a CPU); kept on disk, another seed, a resume, an evaluation or the
next job of a sweep loads the compiled program instead."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import jax

from ...core.errors import UserError

__all__ = ["CACHE_ENV", "default_cache_dir", "enable_compilation_cache", "PersistentStep",
           "code_fingerprint"]

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
    off. Returns the directory used (None: off). Every compilation is kept, the small ones
    too: a run's many short programs (one per shape class and operation) add up to more than its
    few long ones (a `wordalign --load` of 1,000 pairs: 31 s warm when only those over half a
    second were kept, 16 s with all, in a 4.6 MB cache)."""
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
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return str(path)


# --- traced steps kept between processes --------------------------------------------------------

def _user_files() -> list[str]:
    """The source files whose code a traced step may contain: this package's and every loaded
    module's outside the Python installation (a user's model and what it imports)."""
    import sys
    import sysconfig

    skip = {Path(p).resolve() for p in (sysconfig.get_paths()["purelib"],
                                        sysconfig.get_paths()["platlib"],
                                        sysconfig.get_paths()["stdlib"])}
    files = set()
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if not f or not f.endswith(".py"):
            continue
        p = Path(f).resolve()
        if "ppl_attention" in p.parts or not any(p.is_relative_to(s) for s in skip):
            files.add(str(p))
    return sorted(files)


def code_fingerprint() -> str:
    """A hash of every source file a traced step may contain and of the libraries' versions:
    a program traced under other code is never reused."""
    import hashlib

    import numpyro
    import optax

    h = hashlib.sha256(f"{jax.__version__} {numpyro.__version__} {optax.__version__}".encode())
    for f in _user_files():
        try:
            h.update(f.encode() + Path(f).read_bytes())
        except OSError:
            continue
    return h.hexdigest()


class PersistentStep:
    """A jitted training step whose traced program is kept on disk per argument signature
    (``jax.export``), next to JAX's compilation cache: a later run — another seed, a resume,
    the next job of a sweep — neither traces nor lowers nor compiles it again. The key holds
    everything the program depends on: :func:`code_fingerprint`, ``identity`` (the model's
    class, configuration and family, the method and the optimizer's settings) and the
    arguments' structure, shapes and dtypes. Call it as the step it wraps."""

    def __init__(self, step, identity: str, directory: Path):
        import hashlib

        self.step, self.init = step, step.init
        self.directory = directory / "traced"
        self.base = hashlib.sha256((code_fingerprint() + identity + str(jax.devices()[0]))
                                   .encode()).hexdigest()
        self.fns: dict = {}

    def _cache_size(self) -> int:
        return len(self.fns)

    def __call__(self, raw, opt, *rest):
        leaves, treedef = jax.tree.flatten((raw, opt, *rest))
        sig = str(treedef) + "|" + "|".join(
            f"{type(x).__name__}{getattr(x, 'shape', ())}{getattr(x, 'dtype', '')}"
            f"{getattr(x, 'weak_type', '')}" for x in leaves)
        fn = self.fns.get(sig)
        if fn is None:
            fn = self.fns[sig] = self._build(sig, raw, opt, treedef, leaves)
        return fn(*leaves)

    def _build(self, sig, raw, opt, treedef, leaves):
        import hashlib

        raw_def, opt_def = jax.tree.structure(raw), jax.tree.structure(opt)
        n_raw, n_opt = raw_def.num_leaves, opt_def.num_leaves
        path = self.directory / (hashlib.sha256((self.base + sig).encode()).hexdigest()
                                 + ".jaxexport")
        exported = None
        if path.exists():
            try:
                exported = jax.export.deserialize(bytearray(path.read_bytes()))
            except Exception:  # a damaged file: trace again
                exported = None
        if exported is None:
            def flat(*xs):
                r, o, loss = self.step(*jax.tree.unflatten(treedef, xs))
                return (*jax.tree.leaves(r), *jax.tree.leaves(o), loss)

            data = jax.export.export(jax.jit(flat))(*leaves).serialize()
            # the program later runs load, so that its compilation is the one they find cached
            exported = jax.export.deserialize(data)
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_bytes(data)
                os.replace(tmp, path)
            except OSError:
                pass  # a read-only cache: the run still trains
        call = jax.jit(exported.call)

        def run(*xs):
            out = call(*xs)
            return (jax.tree.unflatten(raw_def, out[:n_raw]),
                    jax.tree.unflatten(opt_def, out[n_raw:n_raw + n_opt]), out[-1])
        return run
