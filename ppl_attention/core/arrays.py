"""Parameter pytrees in a run directory, in a safe format: an ``.npz`` of plain arrays (read with
``allow_pickle=False``, so a file a user hands over is data, never code). A pytree of nested
dicts of arrays — a NumPyro param map ``{site: value}``, Flax's ``{"params": {...}}`` — is
stored flat, one array per leaf under its path joined by ``/``; groups (the last weights, the
best weights, the optimizer state) live side by side under their own prefix."""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from .errors import UnsafeCheckpoint, UserError
from .files import make_readable

__all__ = ["flatten_tree", "unflatten_tree", "save_arrays", "load_arrays"]

SEP = "/"


def flatten_tree(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
    """``{"a": {"b": x}}`` → ``{"a/b": array(x)}``; refuses what is not a dict of arrays."""
    out = {}
    if not isinstance(tree, dict):
        raise UserError(f"{prefix or 'parameters'}: expected a dict of arrays, got "
                        f"{type(tree).__name__} (parameters are stored as nested dicts)")
    for key, value in tree.items():
        if not isinstance(key, str) or SEP in key or not key:
            raise UserError(f"parameter name {key!r} under {prefix or 'the top'}: names must "
                            f"be non-empty strings without {SEP!r}")
        path = f"{prefix}{SEP}{key}" if prefix else key
        if isinstance(value, dict):
            if not value:
                out[path + SEP] = np.zeros(0)  # an empty group keeps its place
            else:
                out.update(flatten_tree(value, path))
        else:
            arr = np.asarray(value)
            if arr.dtype == object:
                raise UserError(f"parameter {path!r} is not an array ({type(value).__name__})")
            out[path] = arr
    return out


def unflatten_tree(flat: dict[str, np.ndarray]) -> dict:
    """The inverse of :func:`flatten_tree`."""
    tree: dict = {}
    for path, arr in flat.items():
        parts = path.split(SEP)
        node = tree
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        if parts[-1]:
            node[parts[-1]] = arr
    return tree


def save_arrays(path: str | os.PathLike, groups: dict[str, dict]) -> None:
    """Write ``{group: pytree}`` to ``path`` (an ``.npz``), atomically."""
    flat = {}
    for group, tree in groups.items():
        if tree is None:
            continue
        flat.update(flatten_tree(tree, group))
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-", suffix=".npz")
    os.close(fd)
    try:
        np.savez(tmp, **flat)
        make_readable(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def read_plain_npz(path: str | os.PathLike, what: str = "parameter file") -> dict:
    """Every array of an ``.npz`` by name, read with ``allow_pickle=False``: a file holding
    pickled objects is refused without running them (:class:`UnsafeCheckpoint`), one that is
    no archive is a :class:`UserError` naming ``what`` it should have been."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise UserError(f"{path}: unreadable {what} ({e})") from None
    if magic[:2] != b"PK":
        raise UserError(f"{path}: not an .npz archive (the {what} is one)")
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except ValueError as e:
        raise UnsafeCheckpoint(f"{path}: holds pickled objects, not plain arrays; refusing to "
                               f"load it ({e})") from None
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise UserError(f"{path}: unreadable {what} ({e})") from None


def load_arrays(path: str | os.PathLike) -> dict[str, dict]:
    """``{group: pytree}`` from :func:`save_arrays`' file (:func:`read_plain_npz`)."""
    return unflatten_tree(read_plain_npz(path))
