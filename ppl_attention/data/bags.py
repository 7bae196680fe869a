"""Bags of real-valued instances with one label each — multiple-instance learning, the data of an
attention-based bag classifier (Ilse et al. 2018): the model attends over a bag's instances
(the latent alignment of its one label to an instance) and predicts the label.

A bag is a :class:`Bag`: ``features [M, F]`` (M instances of F real-valued features) and a
``label`` in 0 … C−1. A batch of bags is a :class:`~ppl_attention.data.batching.Batch` laid out
as a pairs batch whose target is the one label, so every tool that reads a pairs batch reads
it: ``features [B, S, F]`` (S the largest bag, padding rows 0), ``src_mask [B, S]`` (the bag's
instances), ``src [B, S]`` the instance positions, ``tgt_in [B, 1]`` zeros, ``tgt_out [B, 1]``
the labels, ``tgt_mask [B, 1]`` true. The alignment site is ``[B, 1]`` over the S instances.

On disk (``--data-dir``): ``train.npz``, ``test.npz`` and optionally ``valid.npz``, each with the
arrays

- ``x`` — ``[N, M, F]`` float, the instances of N bags padded to M;
- ``y`` — ``[N]`` int, the labels (0 … C−1);
- ``mask`` — ``[N, M]`` bool, optional: which of the M rows are instances (default: all).

Any other array, a shape that disagrees, a non-finite feature, a label outside 0 … C−1 or an
empty bag is refused naming the file and the array. C is the largest training label + 1.

The built-in task ``digit-bags``: bags of scikit-learn's bundled 8×8 digits (64 pixel features,
scaled to [0, 1]; no download), 4 to 12 digits a bag, labelled 1 when the bag holds a 9 — the
MNIST-bags benchmark of Ilse et al. on the digits that ship with scikit-learn.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import DataError, UserError
from .splits import Split

__all__ = ["Bag", "read_bags", "collate_bags", "digit_bags", "BAG_ARRAYS"]

#: the arrays a bags file may hold
BAG_ARRAYS = ("x", "y", "mask")


@dataclass(frozen=True)
class Bag:
    """One bag: ``features [M, F]`` (float32) and its ``label``."""

    features: np.ndarray
    label: int

    def __len__(self) -> int:
        return self.features.shape[0]

    def sides(self) -> tuple[list[str], list[str], list[int]]:
        """What a tool shows of a bag: ``instance0 …``, its one label and the label's id."""
        return [f"instance{m}" for m in range(len(self))], [f"label {self.label}"], [self.label]

    @staticmethod
    def collate(bags: list[Bag], index: list[int], array: str = "torch"):
        """A batch of bags (:func:`collate_bags`): what ``make_batches`` calls for bags."""
        return collate_bags(bags, index, array)


def read_bags(path: str | Path) -> list[Bag]:
    """The bags of an ``.npz`` file (module docstring), refused with the file and the array
    named when anything is off."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: missing (a bags --data-dir holds train.npz, test.npz and "
                        f"optionally valid.npz)")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not a NumPy .npz archive of plain arrays ({e})") from None
    unknown = sorted(set(arrays) - set(BAG_ARRAYS))
    if unknown:
        raise DataError(f"{path}: array(s) {', '.join(unknown)} are not bag data (it holds "
                        f"x [N, M, F], y [N] and optionally mask [N, M])")
    for need in ("x", "y"):
        if need not in arrays:
            raise DataError(f"{path}: no array {need!r} (a bags file holds x [N, M, F], y [N] "
                            f"and optionally mask [N, M])")
    x, y = arrays["x"], arrays["y"]
    if x.ndim != 3 or not np.issubdtype(x.dtype, np.number):
        raise DataError(f"{path}: x must be a numeric [N, M, F] array, got {x.dtype} of shape "
                        f"{list(x.shape)}")
    N, M, _ = x.shape
    if N == 0 or M == 0:
        raise DataError(f"{path}: x holds no bags (shape {list(x.shape)})")
    if y.shape != (N,) or not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{path}: y must be N = {N} integer labels, got {y.dtype} of shape "
                        f"{list(y.shape)}")
    if y.min() < 0:
        raise DataError(f"{path}: y holds a negative label ({int(y.min())} at bag "
                        f"{int(np.argmin(y))}, counted from 0)")
    mask = arrays.get("mask")
    if mask is None:
        mask = np.ones((N, M), bool)
    elif mask.shape != (N, M) or mask.dtype != np.bool_:
        raise DataError(f"{path}: mask must be a boolean [N, M] = [{N}, {M}] array, got "
                        f"{mask.dtype} of shape {list(mask.shape)}")
    empty = np.flatnonzero(~mask.any(1))
    if empty.size:
        raise DataError(f"{path}: bag {int(empty[0])} (counted from 0) has no instance in mask")
    bad = ~np.isfinite(x) & mask[..., None]
    if bad.any():
        n, m, _ = np.argwhere(bad)[0]
        raise DataError(f"{path}: x is not finite at bag {n}, instance {m} (counted from 0)")
    x = x.astype(np.float32)
    return [Bag(x[n][mask[n]], int(y[n])) for n in range(N)]


def check_labels(bags: list[Bag], n_classes: int, where: str) -> None:
    """Refuse a label outside the classes of the training data."""
    for n, b in enumerate(bags):
        if b.label >= n_classes:
            raise DataError(f"{where}: bag {n} (counted from 0) has label {b.label}; the "
                            f"training data has {n_classes} classes (0 … {n_classes - 1})")


def collate_bags(bags: list[Bag], index: list[int], array: str = "torch"):
    """One batch of ``bags`` (their corpus ``index``), laid out as a pairs batch (module
    docstring), as ``array`` ("torch" or "numpy")."""
    from .batching import ARRAYS, Batch

    if array not in ARRAYS:
        raise UserError(f"array must be one of {', '.join(ARRAYS)}, got {array!r}")
    widths = {b.features.shape[1] for b in bags}
    if len(widths) != 1:
        raise DataError(f"bags with different numbers of features in one corpus: "
                        f"{sorted(widths)}")
    B, S, F = len(bags), max(len(b) for b in bags), widths.pop()
    features = np.zeros((B, S, F), np.float32)
    src_mask = np.zeros((B, S), bool)
    for r, b in enumerate(bags):
        features[r, :len(b)] = b.features
        src_mask[r, :len(b)] = True
    fields = [np.broadcast_to(np.arange(S), (B, S)).copy(), src_mask,
              np.zeros((B, 1), np.int64), np.array([[b.label] for b in bags], np.int64),
              np.ones((B, 1), bool), np.asarray(index, np.int64)]
    if array == "torch":
        import torch

        fields = [torch.as_tensor(f) for f in fields]
        features = torch.as_tensor(features)
    return Batch(*fields, None, 0, features)


def digit_bags(n_train: int = 600, n_eval: int = 200, seed: int = 0, target: int = 9,
               min_size: int = 4, max_size: int = 12):
    """The built-in ``digit-bags`` task (module docstring): train / valid / test splits of bags
    of scikit-learn's digits, label 1 when a bag holds the digit ``target``; the digits of the
    three splits are disjoint."""
    from sklearn.datasets import load_digits

    from .splits import Task

    d = load_digits()
    x = (d.images.reshape(len(d.images), -1) / 16.0).astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(x))
    parts = np.array_split(order, [int(0.6 * len(x)), int(0.8 * len(x))])

    def split(n: int, pool: np.ndarray, part: str) -> Split:
        rng = random.Random(f"digit-bags/{seed}/{part}")
        pool = pool.tolist()
        bags = []
        for _ in range(n):
            idx = rng.sample(pool, rng.randint(min_size, max_size))
            bags.append(Bag(x[idx], int(any(d.target[i] == target for i in idx))))
        return Split(bags, None)

    return Task("digit-bags", split(n_train, parts[0], "train"), split(n_eval, parts[1], "valid"),
                split(n_eval, parts[2], "test"),
                {"target": target, "min_size": min_size, "max_size": max_size, "seed": seed})
