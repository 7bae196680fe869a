"""scikit-learn's bundled 8×8 handwritten digits (1,797 images, no download) as token sequences
for an attention classifier: each image cut into ``patch × patch`` patches (row-major), a patch's
pixels (scaled to [0, 1]) a token's features; a fixed split (seed 0: 1,300 train / 497 test) and
a noisy copy of the test images (Gaussian noise on the pixels, clipped to [0, 1])."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..core.errors import UserError

__all__ = ["DigitsData", "ImageBatch", "load_digits_patches", "to_patches", "image_batches",
           "read_image_tokens"]

N_TRAIN = 1300


@dataclass
class DigitsData:
    train_x: torch.Tensor  # [N, tokens, patch²]
    train_y: torch.Tensor  # [N]
    test_x: torch.Tensor
    test_y: torch.Tensor
    test_x_noisy: torch.Tensor | None  # None: no noisy copy (a --data-dir)
    n_classes: int = 10


@dataclass
class ImageBatch:
    """A batch of token-sequence images: ``x [B, tokens, features]``, labels ``y [B]``."""

    x: torch.Tensor
    y: torch.Tensor

    @property
    def size(self) -> int:
        return self.x.shape[0]

    @property
    def n_tokens(self) -> int:
        """What the loss is averaged over: the examples."""
        return self.x.shape[0]

    def to(self, device) -> ImageBatch:
        """The same batch with its tensors on ``device``."""
        return ImageBatch(self.x.to(device), self.y.to(device))


def image_batches(x: torch.Tensor, y: torch.Tensor, batch_size: int, shuffle: bool = False,
                  seed: int = 0) -> list[ImageBatch]:
    """Consecutive chunks of ``batch_size`` examples (after a seeded permutation if
    ``shuffle``)."""
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed)) \
        if shuffle else torch.arange(x.shape[0])
    return [ImageBatch(x[idx], y[idx]) for idx in order.split(batch_size)]


def to_patches(images, patch: int = 2) -> torch.Tensor:
    """``images [N, H, W]`` (values in [0, 1]) → ``[N, (H/p)·(W/p), p²]``. Refuses an image
    whose sides are not multiples of ``patch`` or values outside [0, 1]."""
    images = np.asarray(images, dtype=np.float32)
    if images.ndim != 3:
        raise UserError(f"images must be [N, H, W], got shape {images.shape}")
    n, h, w = images.shape
    if h % patch or w % patch:
        raise UserError(f"image of {h}×{w} pixels does not split into {patch}×{patch} patches")
    if images.size and (images.min() < 0 or images.max() > 1):
        raise UserError("pixel values must lie in [0, 1]")
    x = images.reshape(n, h // patch, patch, w // patch, patch).transpose(0, 1, 3, 2, 4)
    return torch.from_numpy(np.ascontiguousarray(x.reshape(n, -1, patch * patch)))


def load_digits_patches(patch: int = 2, noise: float = 0.3, seed: int = 0) -> DigitsData:
    from sklearn.datasets import load_digits

    d = load_digits()
    images = d.images / 16.0
    order = np.random.default_rng(seed).permutation(len(images))
    tr, te = order[:N_TRAIN], order[N_TRAIN:]
    rng = np.random.default_rng(seed + 1)
    noisy = np.clip(images[te] + noise * rng.standard_normal(images[te].shape), 0.0, 1.0)
    y = torch.as_tensor(d.target, dtype=torch.long)
    return DigitsData(to_patches(images[tr], patch), y[tr], to_patches(images[te], patch), y[te],
                      to_patches(noisy, patch))


def read_image_tokens(data_dir) -> DigitsData:
    """A ``--data-dir`` of token-sequence examples for the ``images`` kind: ``train.npz`` and
    ``test.npz`` each holding ``x [N, n_tokens, token_dim]`` (float) and ``y [N]`` (int labels
    0 … C−1). No noisy copy (``test_x_noisy`` is None: reports give the clean figures only).
    Refused, naming the file and the array: a missing file or array, another array, shapes
    that disagree, a non-finite value, a label outside the training labels."""
    from pathlib import Path

    from ..core.errors import DataError

    def read(name):
        path = Path(data_dir) / f"{name}.npz"
        if not path.is_file():
            raise DataError(f"{path}: missing (an images --data-dir holds train.npz and test.npz "
                            f"with x [N, n_tokens, token_dim] and y [N])")
        try:
            with np.load(path, allow_pickle=False) as f:
                arrays = {k: f[k] for k in f.files}
        except (OSError, ValueError) as e:
            raise DataError(f"{path}: not a NumPy .npz archive of plain arrays ({e})") from None
        if set(arrays) != {"x", "y"}:
            raise DataError(f"{path}: holds {', '.join(sorted(arrays)) or 'nothing'}; an images "
                            f"file holds exactly x [N, n_tokens, token_dim] and y [N]")
        x, y = arrays["x"], arrays["y"]
        if x.ndim != 3 or not np.issubdtype(x.dtype, np.number) or not len(x):
            raise DataError(f"{path}: x must be a numeric [N, n_tokens, token_dim] array with "
                            f"N ≥ 1, got {x.dtype} of shape {list(x.shape)}")
        if y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
            raise DataError(f"{path}: y must be {len(x)} labels ≥ 0 (ints), got {y.dtype} of "
                            f"shape {list(y.shape)}")
        if not np.isfinite(x).all():
            n = int(np.argwhere(~np.isfinite(x))[0][0])
            raise DataError(f"{path}: x is not finite in example {n} (counted from 0)")
        return torch.as_tensor(x.astype(np.float32)), torch.as_tensor(y.astype(np.int64)), path

    train_x, train_y, _ = read("train")
    test_x, test_y, where = read("test")
    if test_x.shape[1:] != train_x.shape[1:]:
        raise DataError(f"{where}: examples of shape {list(test_x.shape[1:])}, the training "
                        f"ones are {list(train_x.shape[1:])}")
    n_classes = int(train_y.max()) + 1
    if int(test_y.max()) >= n_classes:
        raise DataError(f"{where}: label {int(test_y.max())}; the training data has "
                        f"{n_classes} classes")
    return DigitsData(train_x, train_y, test_x, test_y, None, max(n_classes, 2))
