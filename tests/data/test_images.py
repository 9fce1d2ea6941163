"""IDX / CIFAR-10 readers and the image-classification splits, on tiny generated files (plus real MNIST if present)."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from latentstruct.data.images import (
    DATASETS,
    NORMALIZATION,
    image_classification,
    load_cifar10,
    load_mnist,
    read_idx,
)

_TYPE_CODES = {"u1": 0x08, "i1": 0x09, "i2": 0x0B, "i4": 0x0C, "f4": 0x0D, "f8": 0x0E}


def idx_bytes(array: np.ndarray) -> bytes:
    """Encode ``array`` as IDX: 0, 0, type code, ndim, big-endian uint32 sizes, big-endian data."""
    kind = array.dtype.kind + str(array.dtype.itemsize)
    header = bytes([0, 0, _TYPE_CODES[kind], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> Path:
    data = idx_bytes(array)
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def write_mnist(root: Path, n_train: int, n_test: int, seed: int = 0, compress: bool = True) -> dict:
    rng = np.random.RandomState(seed)
    root.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte": rng.randint(0, 256, size=(n_train, 28, 28)).astype(np.uint8),
        "train-labels-idx1-ubyte": rng.randint(0, 10, size=n_train).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.randint(0, 256, size=(n_test, 28, 28)).astype(np.uint8),
        "t10k-labels-idx1-ubyte": rng.randint(0, 10, size=n_test).astype(np.uint8),
    }
    for name, array in arrays.items():
        write_idx(root / (name + ".gz" if compress else name), array, compress)
    return arrays


def write_cifar(folder: Path, n_per_batch: int, seed: int = 0) -> dict:
    rng = np.random.RandomState(seed)
    folder.mkdir(parents=True, exist_ok=True)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"data": rng.randint(0, 256, size=(n_per_batch, 3072)).astype(np.uint8),
            b"labels": [int(v) for v in rng.randint(0, 10, size=n_per_batch)],
            b"batch_label": name.encode(),
        }
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
        batches[name] = batch
    return batches


# --- IDX ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["u1", "i1", ">i2", ">i4", ">f4", ">f8", "<i4", "<f8"])
@pytest.mark.parametrize("compress", [False, True])
def test_idx_round_trip(tmp_path, dtype, compress):
    rng = np.random.RandomState(1)
    array = (rng.randn(3, 4, 5) * 1000).astype(dtype)
    out = read_idx(write_idx(tmp_path / "a.idx", array, compress))  # no .gz suffix: detected by magic bytes
    assert out.shape == (3, 4, 5)
    assert out.dtype == np.dtype(dtype).newbyteorder("=")
    np.testing.assert_array_equal(out, array)


def test_idx_known_bytes_big_endian(tmp_path):
    raw = bytes([0, 0, 0x0B, 1, 0, 0, 0, 2, 0x01, 0x02, 0xFF, 0xFE])
    (tmp_path / "x").write_bytes(raw)
    np.testing.assert_array_equal(read_idx(tmp_path / "x"), np.array([0x0102, -2], dtype=np.int16))


def test_idx_plain_file_with_gz_suffix(tmp_path):
    array = np.arange(6, dtype=np.uint8).reshape(2, 3)
    np.testing.assert_array_equal(read_idx(write_idx(tmp_path / "plain.gz", array)), array)


def test_idx_empty(tmp_path):
    empty = np.zeros((0, 4), dtype=np.int32)
    assert read_idx(write_idx(tmp_path / "e", empty)).shape == (0, 4)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda raw: b"\x01" + raw[1:],  # bad magic
        lambda raw: raw[:2] + b"\x0a" + raw[3:],  # unknown type
        lambda raw: raw[:3] + b"\x05" + raw[4:],  # more dimensions than the header holds
        lambda raw: raw[:-1],  # truncated data
        lambda raw: raw + b"\x00",  # trailing bytes
        lambda raw: raw[:6],  # truncated header
        lambda raw: b"",
    ],
)
def test_idx_corrupt_raises(tmp_path, mutate):
    raw = idx_bytes(np.arange(24, dtype=">i2").reshape(2, 3, 4))
    path = tmp_path / "bad-file"
    path.write_bytes(mutate(raw))
    with pytest.raises(ValueError, match="bad-file"):
        read_idx(path)


def test_idx_truncated_gzip_raises(tmp_path):
    path = tmp_path / "trunc.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.arange(100, dtype=np.uint8)))[:-10])
    with pytest.raises(ValueError, match="trunc.gz"):
        read_idx(path)


# --- MNIST -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [True, False])
def test_load_mnist(tmp_path, compress):
    arrays = write_mnist(tmp_path, 7, 3, compress=compress)
    data = load_mnist(tmp_path)
    assert set(data) == {"train", "test"}
    x, y = data["train"]
    assert x.dtype == np.uint8 and x.shape == (7, 28, 28)
    assert y.dtype == np.int64 and y.shape == (7,)
    np.testing.assert_array_equal(x, arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(y, arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(data["test"][0], arrays["t10k-images-idx3-ubyte"])
    np.testing.assert_array_equal(data["test"][1], arrays["t10k-labels-idx1-ubyte"])


def test_load_mnist_missing_file(tmp_path):
    write_mnist(tmp_path, 2, 2)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_mnist(tmp_path)
    message = str(err.value)
    assert "t10k-labels-idx1-ubyte" in message and "train-images-idx3-ubyte" in message and str(tmp_path) in message


def test_load_mnist_count_mismatch(tmp_path):
    write_mnist(tmp_path, 4, 2)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(3, dtype=np.uint8), compress=True)
    with pytest.raises(ValueError, match="4 images but 3 labels"):
        load_mnist(tmp_path)


# --- CIFAR-10 ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("nested", [True, False])
def test_load_cifar10(tmp_path, nested):
    folder = tmp_path / "cifar-10-batches-py"
    batches = write_cifar(folder, 4)
    data = load_cifar10(tmp_path if nested else folder)
    x, y = data["train"]
    assert x.dtype == np.uint8 and x.shape == (20, 3, 32, 32)
    assert y.dtype == np.int64 and y.shape == (20,)
    # row-major channel-first: the first 1024 values are the red plane
    np.testing.assert_array_equal(x[0, 0].ravel(), batches["data_batch_1"][b"data"][0, :1024])
    np.testing.assert_array_equal(x[5, 2, 31], batches["data_batch_2"][b"data"][1, 3072 - 32 :])
    np.testing.assert_array_equal(y[16:], batches["data_batch_5"][b"labels"])
    tx, ty = data["test"]
    assert tx.shape == (4, 3, 32, 32) and ty.dtype == np.int64
    np.testing.assert_array_equal(ty, batches["test_batch"][b"labels"])


def test_load_cifar10_missing(tmp_path):
    write_cifar(tmp_path / "cifar-10-batches-py", 1)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3") as err:
        load_cifar10(tmp_path)
    assert "cifar-10-batches-py" in str(err.value) and "test_batch" in str(err.value)


def test_load_cifar10_bad_shape(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder, 2)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((2, 3000), dtype=np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(ValueError, match="test_batch"):
        load_cifar10(folder)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((2, 3072), dtype=np.uint8), b"labels": [0]}, f)
    with pytest.raises(ValueError, match="labels"):
        load_cifar10(folder)


# --- image_classification ----------------------------------------------------------------------------------------


@pytest.fixture
def data_dir(tmp_path) -> Path:
    write_mnist(tmp_path / "mnist", 30, 6, seed=0)
    write_mnist(tmp_path / "fashion_mnist", 30, 6, seed=1, compress=False)
    write_cifar(tmp_path / "cifar10" / "cifar-10-batches-py", 4)
    return tmp_path


@pytest.mark.parametrize("name", DATASETS)
def test_image_classification_splits(data_dir, name):
    data = image_classification(name, str(data_dir), n_valid=5, seed=3)
    channels, side = (3, 32) if name == "cifar10" else (1, 28)
    n_train = 20 if name == "cifar10" else 30
    assert data.dims == {"channels": channels, "height": side, "width": side, "num_classes": 10}
    assert data.size("train") == n_train - 5 and data.size("valid") == 5
    assert data.size("test") == (4 if name == "cifar10" else 6)
    for split in ("train", "valid", "test"):
        x, y = data.splits[split]["x"], data.splits[split]["y"]
        assert x.dtype == torch.float32 and x.shape[1:] == (channels, side, side)
        assert y.dtype == torch.int64 and ((0 <= y) & (y < 10)).all()


@pytest.mark.parametrize("name", DATASETS)
def test_image_classification_normalisation(data_dir, name):
    raw = (load_cifar10 if name == "cifar10" else load_mnist)(data_dir / name)
    data = image_classification(name, str(data_dir), n_valid=5)
    mean, std = NORMALIZATION[name]
    images = torch.from_numpy(raw["test"][0]).float()
    if images.ndim == 3:
        images = images.unsqueeze(1)
    for c in range(len(mean)):
        expected = (images[:, c] / 255 - mean[c]) / std[c]
        torch.testing.assert_close(data.splits["test"]["x"][:, c], expected)
    np.testing.assert_array_equal(data.splits["test"]["y"].numpy(), raw["test"][1])


def test_normalisation_constants():
    assert NORMALIZATION["mnist"] == ((0.1307,), (0.3081,))
    assert NORMALIZATION["fashion_mnist"] == ((0.2860,), (0.3530,))
    assert NORMALIZATION["cifar10"] == ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))


def test_image_classification_split_is_a_seeded_partition(data_dir):
    raw = load_mnist(data_dir / "mnist")
    a = image_classification("mnist", str(data_dir), n_valid=8, seed=7)
    b = image_classification("mnist", str(data_dir), n_valid=8, seed=7)
    c = image_classification("mnist", str(data_dir), n_valid=8, seed=8)
    for split in ("train", "valid"):
        torch.testing.assert_close(a.splits[split]["x"], b.splits[split]["x"])
    assert not torch.equal(a.splits["valid"]["x"], c.splits["valid"]["x"])
    order = np.random.RandomState(7).permutation(30)
    np.testing.assert_array_equal(a.splits["valid"]["y"].numpy(), raw["train"][1][order[:8]])
    np.testing.assert_array_equal(a.splits["train"]["y"].numpy(), raw["train"][1][order[8:]])


def test_image_classification_subset(data_dir):
    full = image_classification("fashion_mnist", str(data_dir), n_valid=5, seed=2)
    small = image_classification("fashion_mnist", str(data_dir), n_valid=5, seed=2, subset=7)
    assert small.size("train") == 7 and small.size("valid") == 5 and small.size("test") == 6
    torch.testing.assert_close(small.splits["train"]["x"], full.splits["train"]["x"][:7])
    torch.testing.assert_close(small.splits["valid"]["x"], full.splits["valid"]["x"])
    assert image_classification("fashion_mnist", str(data_dir), n_valid=5, subset=1000).size("train") == 25


def test_image_classification_errors(data_dir, tmp_path):
    with pytest.raises(ValueError, match="mnist, fashion_mnist, cifar10"):
        image_classification("svhn", str(data_dir))
    with pytest.raises(ValueError, match="n_valid"):
        image_classification("mnist", str(data_dir), n_valid=31)
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        image_classification("mnist", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="data_batch_1"):
        image_classification("cifar10", str(tmp_path / "nowhere"))


# --- real MNIST (skipped when absent) ----------------------------------------------------------------------------

@pytest.mark.real_data("mnist")
def test_real_mnist(data_root):
    data = load_mnist(data_root / "mnist")
    x, y = data["train"]
    tx, ty = data["test"]
    assert x.shape == (60000, 28, 28) and tx.shape == (10000, 28, 28)
    assert y.shape == (60000,) and ty.shape == (10000,)
    assert y.min() == 0 and y.max() == 9 and ty.min() == 0 and ty.max() == 9
    assert np.bincount(ty, minlength=10).sum() == 10000
    assert (np.bincount(y, minlength=10) > 5000).all()
    assert y[0] == 5 and ty[0] == 7
    assert x.max() == 255 and x.min() == 0
