"""Readers for the real image-classification datasets: MNIST, Fashion-MNIST and CIFAR-10.

* :func:`read_idx` (the IDX format, plain or compressed; the payload must match the header),
  :func:`load_mnist` (an MNIST-format folder: MNIST and Fashion-MNIST), :func:`load_cifar10` (the pickles of
  ``cifar-10-batches-py``); labels must be 0-9; every malformed file is one ``ValueError`` line naming it.
* :func:`image_classification`: ``data_dir/{mnist,fashion_mnist,cifar10}``; valid = ``n_valid`` training images
  picked by ``np.random.RandomState(seed)``, train = the rest (``subset``: its first examples), test = the canonical
  test set; float32 ``[N, C, H, W]`` in [0, 1], standardised by the fixed :data:`NORMALIZATION` constants.

Formats byte by byte and the split protocol: docs/data.md#images.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import torch

from latentstruct.data.base import TensorSplits
from latentstruct.data.files import STREAM_ERRORS, first_file, open_binary, stream_error
from latentstruct.ranges import NonNegative

__all__ = ["DATASETS", "NORMALIZATION", "image_classification", "load_cifar10", "load_mnist", "read_idx"]

DATASETS: tuple[str, ...] = ("mnist", "fashion_mnist", "cifar10")

#: per-dataset channel (mean, std) of the [0, 1]-scaled training images
NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}

_IDX_TYPES: dict[int, np.dtype] = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

_CIFAR_FOLDER = "cifar-10-batches-py"
_CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_TEST = "test_batch"


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (plain or gzip) into an array of its shape and type, in native byte order."""
    path = Path(path)
    try:
        with open_binary(path) as f:
            raw = f.read()
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except STREAM_ERRORS as err:
        raise stream_error(path, err) from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path}: not an IDX file (the magic must start with two zero bytes)")
    type_code, ndim = raw[2], raw[3]
    if type_code not in _IDX_TYPES:
        raise ValueError(f"{path}: unknown IDX data type 0x{type_code:02X}")
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise ValueError(f"{path}: header truncated ({len(raw)} bytes, {ndim} dimensions need {header_len})")
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_TYPES[type_code]
    expected = math.prod(shape) * dtype.itemsize
    if len(raw) - header_len != expected:
        raise ValueError(
            f"{path}: data size mismatch: shape {shape} of {dtype.name} needs {expected} bytes, "
            f"found {len(raw) - header_len}"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header_len).reshape(shape)
    return data.astype(dtype.newbyteorder("="), copy=True)


def _find_mnist_file(root: Path, name: str) -> Path:
    found = first_file([root / name, root / f"{name}.gz"])
    if found is not None:
        return found
    expected = ", ".join(f"{n}[.gz]" for pair in _MNIST_FILES.values() for n in pair)
    raise FileNotFoundError(f"missing {name}[.gz] in {root}; an MNIST-format folder must hold: {expected}")


def load_mnist(root: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Read an MNIST-format folder (MNIST or Fashion-MNIST): ``{"train": (images, labels), "test": ...}`` with
    images uint8 ``[N, H, W]`` (28×28 for the real data) and labels int64 ``[N]``."""
    root = Path(root)
    out = {}
    for split, (images_name, labels_name) in _MNIST_FILES.items():
        images_path, labels_path = _find_mnist_file(root, images_name), _find_mnist_file(root, labels_name)
        images, labels = read_idx(images_path), read_idx(labels_path)
        if images.ndim != 3 or images.dtype != np.uint8:
            raise ValueError(f"{images_path}: expected uint8 images [N, H, W], got {images.dtype} {images.shape}")
        if labels.ndim != 1 or labels.dtype != np.uint8:
            raise ValueError(f"{labels_path}: expected uint8 labels [N], got {labels.dtype} {labels.shape}")
        _check_labels(labels, labels_path)
        if len(images) != len(labels):
            raise ValueError(f"{root}: {split} has {len(images)} images but {len(labels)} labels")
        out[split] = (images, labels.astype(np.int64))
    return out


def _check_labels(labels: np.ndarray, path: Path) -> None:
    """Every label a class 0-9, else ``ValueError`` naming the file and the first bad record."""
    bad = np.flatnonzero((labels < 0) | (labels > 9))
    if len(bad):
        raise ValueError(f"{path}: record {int(bad[0])}: label {int(labels[bad[0]])} outside 0..9")


def _cifar_folder(root: Path) -> Path:
    for folder in (root, root / _CIFAR_FOLDER):
        if all((folder / name).is_file() for name in (*_CIFAR_TRAIN, _CIFAR_TEST)):
            return folder
    raise FileNotFoundError(
        f"CIFAR-10 not found under {root}: expected {root}/[{_CIFAR_FOLDER}/]{{{', '.join(_CIFAR_TRAIN)}, "
        f"{_CIFAR_TEST}}} (the python-pickle batches of cifar-10-python.tar.gz)"
    )


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        try:
            batch = pickle.load(f, encoding="bytes")
        except Exception as err:  # noqa: BLE001 - a damaged pickle can raise nearly anything (EOFError, MemoryError...)
            detail = " ".join(f"{type(err).__name__}: {err}".split())
            what = "not a readable CIFAR-10 batch, the pickle is truncated or corrupt"
            raise ValueError(f"{path}: {what} ({detail})") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise ValueError(f"{path}: not a CIFAR-10 batch (expected a dict with b'data' and b'labels')")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{path}: expected uint8 data [n, 3072], got {data.dtype} {data.shape}")
    if labels.shape != (len(data),):
        raise ValueError(f"{path}: {len(data)} images but labels of shape {labels.shape}")
    _check_labels(labels, path)
    return data.reshape(-1, 3, 32, 32), labels


def load_cifar10(root: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Read the CIFAR-10 python batches from ``root`` (the ``cifar-10-batches-py`` folder or its parent):
    ``{"train": (uint8 [N, 3, 32, 32], int64 [N]), "test": (...)}``; the training batches are concatenated in order."""
    folder = _cifar_folder(Path(root))
    train = [_read_cifar_batch(folder / name) for name in _CIFAR_TRAIN]
    test = _read_cifar_batch(folder / _CIFAR_TEST)
    return {
        "train": (np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train])),
        "test": test,
    }


def _to_tensor(images: np.ndarray, name: str) -> torch.Tensor:
    x = torch.from_numpy(np.ascontiguousarray(images))
    if x.ndim == 3:
        x = x.unsqueeze(1)
    mean, std = NORMALIZATION[name]
    mean_t = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    if x.shape[1] != len(mean):
        raise ValueError(f"{name}: images have {x.shape[1]} channels, normalisation constants {len(mean)}")
    return (x.to(torch.float32) / 255.0 - mean_t) / std_t


def image_classification(
    name: Literal["mnist", "fashion_mnist", "cifar10"],
    data_dir: str,
    n_valid: Annotated[int, NonNegative] = 5000,
    seed: int = 0,
    subset: Annotated[int | None, NonNegative] = None,
) -> TensorSplits:
    """Train / valid / test splits of ``name`` (one of :data:`DATASETS`) read from ``data_dir/name``; each split is
    ``{"x": float32 [N, C, H, W] normalised, "y": int64 [N]}``. See docs/data.md#images for the protocol.

    Args:
        name: mnist, fashion_mnist or cifar10 (read from <data_dir>/<name>/, see latentstruct/data/images.py)
        data_dir: root of the real datasets
        n_valid: training images held out for validation
        seed: seed of the validation hold-out
        subset: keep only this many training images (reduced runs); null = all
    """
    if name not in DATASETS:
        raise ValueError(f"unknown image dataset {name!r}; choose one of {', '.join(DATASETS)}")
    folder = Path(data_dir) / name
    raw = load_cifar10(folder) if name == "cifar10" else load_mnist(folder)
    train_x, train_y = raw["train"]
    n_train = len(train_x)
    if not 0 <= n_valid <= n_train:
        raise ValueError(f"n_valid={n_valid} must be between 0 and the {n_train} training images")
    if subset is not None and subset < 0:
        raise ValueError(f"subset={subset} must be non-negative")
    order = np.random.RandomState(seed).permutation(n_train)
    valid_idx, train_idx = order[:n_valid], order[n_valid:]
    if subset is not None:
        train_idx = train_idx[:subset]
    parts = {
        "train": (train_x[train_idx], train_y[train_idx]),
        "valid": (train_x[valid_idx], train_y[valid_idx]),
        "test": raw["test"],
    }
    splits = {}
    for split, (x, y) in parts.items():
        if len(y) and (y.min() < 0 or y.max() >= 10):
            raise ValueError(f"{folder}: {split} labels outside 0..9")
        splits[split] = {"x": _to_tensor(x, name), "y": torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))}
    _, channels, height, width = splits["test"]["x"].shape
    return TensorSplits(splits, dims={"channels": channels, "height": height, "width": width, "num_classes": 10})
