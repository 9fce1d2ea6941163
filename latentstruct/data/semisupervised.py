"""Binarised MNIST / Fashion-MNIST with a balanced labelled subset, for the semi-supervised discrete VAE (seed 003).

* :func:`binarize`: pixel/255 rounded to {0, 1} once (1 iff the uint8 value ≥ 128), flattened to 784.
* :func:`balanced_subset`: ``n_labelled / num_classes`` train examples of every class, nested across sizes for one
  seed.
* :func:`semisupervised_mnist`: ``{"train": {"x": float32 [N, 784], "y": int64 [N], "labelled": bool [N]},
  "valid": {"x", "y"}, "test": {"x", "y"}}``; valid = the last ``n_valid`` (10,000) training images, in file order.
* :func:`semisupervised_dataset`: the same as ``TensorSplits`` that cannot leak a label: ``train`` holds only ``x``,
  ``labelled`` the labelled subset's ``x`` and ``y``; a trainer with ``trainer.phases`` trains on ``labelled`` first.

The protocol in full: docs/data.md#semisupervised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import torch

from latentstruct.data.base import TensorSplits
from latentstruct.data.images import load_mnist
from latentstruct.ranges import AtLeast, NonNegative

__all__ = ["SEMISUPERVISED_DATASETS", "balanced_subset", "binarize", "semisupervised_dataset", "semisupervised_mnist"]

SEMISUPERVISED_DATASETS: tuple[str, ...] = ("mnist", "fashion_mnist")


def binarize(images_uint8: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Fixed binarisation: float32 tensor of the same shape, 1 where pixel/255 ≥ 0.5 (uint8 value ≥ 128), else 0."""
    x = torch.as_tensor(np.asarray(images_uint8) if not isinstance(images_uint8, torch.Tensor) else images_uint8)
    if x.dtype != torch.uint8:
        raise ValueError(f"binarize expects uint8 pixels in [0, 255], got {x.dtype}")
    return (x.to(torch.float32) / 255.0 >= 0.5).to(torch.float32)


def balanced_subset(
    labels: np.ndarray | torch.Tensor, n: int, num_classes: int = 10, seed: int = 0
) -> torch.Tensor:
    """Sorted int64 indices of exactly ``n / num_classes`` examples of each class ``0 .. num_classes-1``, picked by
    ``np.random.RandomState(seed)`` (one permutation per class, in class order; see docs/data.md#semisupervised).

    Raises ValueError if ``n`` is negative or not divisible by ``num_classes``, if a label lies outside the classes,
    or if a class has fewer than ``n / num_classes`` examples."""
    y = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    y = y.astype(np.int64).reshape(-1)
    if num_classes < 1:
        raise ValueError(f"num_classes={num_classes} must be positive")
    if n < 0 or n % num_classes:
        raise ValueError(f"n={n} labelled examples cannot be split evenly over {num_classes} classes")
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), found [{y.min()}, {y.max()}]")
    per_class = n // num_classes
    rng = np.random.RandomState(seed)
    chosen = []
    for c in range(num_classes):
        members = np.flatnonzero(y == c)
        if len(members) < per_class:
            raise ValueError(f"class {c} has {len(members)} examples, fewer than the {per_class} requested")
        chosen.append(members[rng.permutation(len(members))[:per_class]])
    return torch.from_numpy(np.sort(np.concatenate(chosen)).astype(np.int64))


def semisupervised_mnist(
    name: str,
    data_dir: str | Path,
    n_labelled: int,
    seed: int = 0,
    n_valid: int = 10000,
    num_classes: int = 10,
) -> dict[str, dict[str, torch.Tensor]]:
    """Binarised train / valid / test splits of ``data_dir/name`` with a balanced labelled subset of the train split
    (docs/data.md#semisupervised: the protocol and the returned structure)."""
    if name not in SEMISUPERVISED_DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(SEMISUPERVISED_DATASETS)}")
    raw = load_mnist(Path(data_dir) / name)
    train_images, train_labels = raw["train"]
    test_images, test_labels = raw["test"]
    n_total = len(train_images)
    if not 0 <= n_valid < n_total:
        raise ValueError(f"n_valid={n_valid} must be between 0 and {n_total - 1} (the training images less one)")
    n_train = n_total - n_valid

    def flat(images: np.ndarray) -> torch.Tensor:
        return binarize(images).reshape(len(images), -1)

    x_all, y_all = flat(train_images), torch.from_numpy(train_labels.astype(np.int64))
    train_y = y_all[:n_train]
    labelled = torch.zeros(n_train, dtype=torch.bool)
    labelled[balanced_subset(train_y, n_labelled, num_classes, seed)] = True
    return {
        "train": {"x": x_all[:n_train], "y": train_y, "labelled": labelled},
        "valid": {"x": x_all[n_train:], "y": y_all[n_train:]},
        "test": {"x": flat(test_images), "y": torch.from_numpy(test_labels.astype(np.int64))},
    }


def semisupervised_dataset(
    name: Literal["mnist", "fashion_mnist"],
    data_dir: str | Path,
    n_labelled: Annotated[int, NonNegative] = 100,
    label_seed: int = 0,
    n_valid: Annotated[int, NonNegative] = 10000,
    num_classes: Annotated[int, AtLeast(1)] = 10,
) -> TensorSplits:
    """:func:`semisupervised_mnist` as :class:`TensorSplits` with the splits ``train`` (images only), ``labelled``,
    ``valid`` and ``test`` (see docs/data.md#semisupervised); dims ``input_dim`` and ``num_classes``.

    Args:
        name: mnist or fashion_mnist (IDX files read from <data_dir>/<name>/).
        data_dir: root of the real datasets.
        n_labelled: labelled training images, the same number per class (seed 003: 50 ... 1200).
        label_seed: seed of the balanced labelled subset.
        n_valid: the last training images held out for validation.
        num_classes: the classes, each with n_labelled / num_classes labelled images.
    """
    data = semisupervised_mnist(name, data_dir, n_labelled, label_seed, n_valid, num_classes)
    train = data["train"]
    splits = {
        "train": {"x": train["x"]},
        "labelled": {"x": train["x"][train["labelled"]], "y": train["y"][train["labelled"]]},
        "valid": data["valid"],
        "test": data["test"],
    }
    return TensorSplits(splits, dims={"input_dim": train["x"].shape[1], "num_classes": num_classes})
