"""Multi-label data (latentstruct/data/mlc.py): the ARFF reader (sparse, dense, quoted names, gzip), the Mulan XML
label header, the seeded re-split, example-F1 and the validation threshold, on tiny generated files (plus the real
bibtex / delicious files in the shared data folder when present)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from latentstruct.data.mlc import (
    DEFAULT_THRESHOLDS,
    SPLIT_SIZES,
    best_threshold,
    example_f1,
    f1_at_threshold,
    mlc_dataset,
    read_arff,
    read_label_xml,
    resplit,
)


def write(path: Path, content: str, gz: bool = False) -> Path:
    data = content.encode("utf-8")
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


# three features (one numeric, two binary; names quoted with a space and with an escaped quote), two labels
HEADER = """% a comment
@RELATION toy

@attribute count numeric
@attribute 'two words' {0,1}
@attribute "it\\"s" {0,1}
@attribute lab_a {0,1}
@attribute 'lab b' {0,1}

@DATA
"""
SPARSE_ROWS = """{0 3.5,2 1,3 1}
{}
% a comment between rows
{1 1,3 1,4 1}

{4 1}
"""
DENSE_ROWS = """3.5,0,1,1,0
0,0,0,0,0
0,1,0,1,1
0,0,0,0,1
"""
X = np.array([[3.5, 0, 1], [0, 0, 0], [0, 1, 0], [0, 0, 0]], dtype=np.float32)
Y = np.array([[1, 0], [0, 0], [1, 1], [0, 1]], dtype=bool)
XML = """<?xml version="1.0" encoding="utf-8"?>
<labels xmlns="http://mulan.sourceforge.net/labels">
<label name="lab b"></label>
<label name="lab_a"></label>
</labels>
"""


@pytest.mark.parametrize("rows", [SPARSE_ROWS, DENSE_ROWS], ids=["sparse", "dense"])
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_read_arff(tmp_path, rows, gz):
    path = write(tmp_path / ("toy.arff.gz" if gz else "toy.arff"), HEADER + rows, gz=gz)
    data = read_arff(path, num_labels=2)
    assert data.x.dtype == np.float32 and data.y.dtype == np.bool_
    np.testing.assert_array_equal(data.x, X)
    np.testing.assert_array_equal(data.y, Y)
    assert data.feature_names == ["count", "two words", 'it"s']
    assert data.label_names == ["lab_a", "lab b"]


def test_read_arff_labels_from_xml(tmp_path):
    path = write(tmp_path / "toy-train.arff.gz", HEADER + SPARSE_ROWS, gz=True)
    with pytest.raises(FileNotFoundError, match="toy-train.xml.*toy.xml"):
        read_arff(path)
    write(tmp_path / "toy.xml", XML)  # found by dropping "-train"; the order of the XML names does not matter
    assert read_label_xml(tmp_path / "toy.xml") == ["lab b", "lab_a"]
    data = read_arff(path)
    np.testing.assert_array_equal(data.y, Y)
    assert data.label_names == ["lab_a", "lab b"]
    # an explicit header; one whose labels are not the last attributes is refused
    other = write(tmp_path / "other.xml", XML.replace("lab_a", "count"))
    with pytest.raises(ValueError, match=r"other\.xml: label 1 .count. is not among the last 2 attributes"):
        read_arff(path, label_xml=other)
    with pytest.raises(ValueError, match="no <label"):
        read_label_xml(write(tmp_path / "empty.xml", "<labels></labels>"))


@pytest.mark.parametrize(
    "rows, match",
    [
        ("{0 1,3 2}\n", "label values must be 0 or 1"),
        ("{7 1}\n", "index 7 outside"),
        ("{0 1,3}\n", "'index value'"),
        ("{0 1\n", "must end with"),
        ("1,0,0\n", "needs 5 values"),
        ("?,0,0,1,0\n", "missing values"),
        ("a,0,0,1,0\n", "non-numeric"),
    ],
)
def test_read_arff_errors(tmp_path, rows, match):
    path = write(tmp_path / "bad.arff", HEADER + rows)
    with pytest.raises(ValueError, match=match):
        read_arff(path, num_labels=2)


def test_read_arff_header_errors(tmp_path):
    with pytest.raises(ValueError, match=r"a\.arff:2: the file ends before its @data section"):
        read_arff(write(tmp_path / "a.arff", "@relation r\n@attribute a numeric\n"), num_labels=1)
    with pytest.raises(ValueError, match="impossible"):
        read_arff(write(tmp_path / "b.arff", HEADER + SPARSE_ROWS), num_labels=5)
    with pytest.raises(ValueError, match="unterminated"):
        read_arff(write(tmp_path / "c.arff", "@attribute 'open numeric\n@data\n"), num_labels=1)
    with pytest.raises(ValueError, match="has no type"):
        read_arff(write(tmp_path / "d.arff", "@attribute lonely\n@data\n"), num_labels=1)


# --- re-split ------------------------------------------------------------------------------------------------------


def test_resplit_sizes_determinism_disjointness():
    index = resplit(20, (11, 5, 4), seed=0)
    assert [len(index[s]) for s in ("train", "valid", "test")] == [11, 5, 4]
    assert sorted(np.concatenate(list(index.values())).tolist()) == list(range(20))  # each example exactly once
    again = resplit(20, (11, 5, 4), seed=0)
    assert all((index[s] == again[s]).all() for s in index)
    expected = np.random.RandomState(0).permutation(20)
    assert index["train"].tolist() == expected[:11].tolist() and index["test"].tolist() == expected[16:].tolist()
    assert resplit(20, (11, 5, 4), seed=1)["train"].tolist() != index["train"].tolist()
    with pytest.raises(ValueError, match="add up to 19, but there are 20"):
        resplit(20, (10, 5, 4))
    with pytest.raises(ValueError, match="three non-negative"):
        resplit(20, (20, 0))


def test_split_sizes_add_up():
    # bibtex: 4880 + 2515 official rows, none unlabelled; delicious: 12920 + 3185 rows, of which 14 unlabelled
    assert sum(SPLIT_SIZES["bibtex"]) == 4880 + 2515
    assert sum(SPLIT_SIZES["delicious"]) == 12920 + 3185 - 14
    assert sum(SPLIT_SIZES["eurlex"]) == 19314


def _toy_folder(root: Path, n_train: int = 7, n_test: int = 5, gz: bool = True) -> None:
    """``root/toy/toy-{train,test}.arff[.gz]`` + ``toy.xml``: feature 0 is a unique example id (1-based, train then
    test), the labels cycle so that every fourth example is unlabelled."""
    folder = root / "toy"
    folder.mkdir(parents=True)
    header = "@relation toy\n@attribute id numeric\n@attribute f {0,1}\n@attribute a {0,1}\n@attribute b {0,1}\n@data\n"
    patterns = ["", "2 1", "3 1", "2 1,3 1"]
    for name, ids in (("train", range(1, n_train + 1)), ("test", range(n_train + 1, n_train + n_test + 1))):
        rows = "".join(f"{{0 {i},{patterns[i % 4]}}}\n".replace(",}", "}") for i in ids)
        write(folder / (f"toy-{name}.arff" + (".gz" if gz else "")), header + rows, gz=gz)
    write(folder / "toy.xml", XML.replace("lab b", "a").replace("lab_a", "b"))


def test_mlc_dataset(tmp_path):
    _toy_folder(tmp_path)  # 12 examples, ids 1..12; 4, 8, 12 unlabelled
    data = mlc_dataset("toy", tmp_path, sizes=(5, 2, 2))
    assert data.dims == {"input_dim": 2, "num_labels": 2}
    assert data.extras["label_names"] == ["a", "b"] and data.extras["seed"] == 0
    ids = {split: d["x"][:, 0].long().tolist() for split, d in data.splits.items()}
    assert sorted(ids["train"] + ids["valid"] + ids["test"]) == [1, 2, 3, 5, 6, 7, 9, 10, 11]
    for split, d in data.splits.items():
        assert d["x"].dtype == torch.float32 and d["y"].dtype == torch.float32
        assert d["y"].sum(1).min() >= 1
        # labels travel with their example: id % 4 == 1 → a, 2 → b, 3 → a and b
        expected = [[float(i % 4 in (1, 3)), float(i % 4 in (2, 3))] for i in ids[split]]
        assert d["y"].tolist() == expected
    again = mlc_dataset("toy", tmp_path, sizes=(5, 2, 2))
    assert all(torch.equal(again.splits[s]["x"], data.splits[s]["x"]) for s in data.splits)
    other = mlc_dataset("toy", tmp_path, sizes=(5, 2, 2), seed=3)
    assert other.splits["train"]["x"][:, 0].tolist() != data.splits["train"]["x"][:, 0].tolist()
    kept = mlc_dataset("toy", tmp_path, sizes=(6, 3, 3), drop_empty=False)
    assert sum(kept.size(s) for s in kept.splits) == 12
    with pytest.raises(ValueError, match="add up to 12, but there are 9"):
        mlc_dataset("toy", tmp_path, sizes=(6, 3, 3))
    with pytest.raises(ValueError, match="no published split sizes for 'toy'"):
        mlc_dataset("toy", tmp_path)


def test_mlc_dataset_union_file_and_missing(tmp_path):
    _toy_folder(tmp_path, gz=False)
    train = (tmp_path / "toy" / "toy-train.arff").read_text()
    test_rows = (tmp_path / "toy" / "toy-test.arff").read_text().split("@data\n")[1]
    union = tmp_path / "u" / "toy"
    union.mkdir(parents=True)
    write(union / "toy.arff", train + test_rows)
    write(union / "toy.xml", (tmp_path / "toy" / "toy.xml").read_text())
    a = mlc_dataset("toy", tmp_path, sizes=(5, 2, 2))
    b = mlc_dataset("toy", tmp_path / "u", sizes=(5, 2, 2))
    assert all(torch.equal(a.splits[s]["x"], b.splits[s]["x"]) for s in a.splits)

    with pytest.raises(FileNotFoundError, match=r"bibtex-train\.arff\[\.gz\].*bibtex\.arff"):
        mlc_dataset("bibtex", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"eurlex-ev-fold1-train\.arff"):
        mlc_dataset("eurlex", tmp_path)
    with pytest.raises(ValueError, match="no published split sizes for 'bookmarks'"):
        mlc_dataset("bookmarks", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"bookmarks\.arff"):
        mlc_dataset("bookmarks", tmp_path, sizes=(1, 1, 1))


# --- metrics -------------------------------------------------------------------------------------------------------


def test_example_f1_hand_computed():
    pred = [[1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]]
    gold = [[0, 1, 1, 0], [0, 0, 0, 0], [0, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]]
    # per example: 2*1/(2+2) = 0.5; both empty = 1; empty prediction = 0; exact = 1; 2*1/(3+1) = 0.5
    expected = (0.5 + 1 + 0 + 1 + 0.5) / 5
    assert example_f1(np.array(pred), np.array(gold)) == pytest.approx(expected)
    assert example_f1(torch.tensor(pred, dtype=torch.float32), torch.tensor(gold).bool()) == pytest.approx(expected)
    assert example_f1(np.zeros((3, 2)), np.zeros((3, 2))) == 1.0
    assert example_f1(np.ones((2, 3)), np.zeros((2, 3))) == 0.0
    assert example_f1(np.zeros((0, 3)), np.zeros((0, 3))) == 0.0
    with pytest.raises(ValueError, match="same shape"):
        example_f1(np.zeros((2, 3)), np.zeros((2, 4)))


def test_threshold_selection():
    gold = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0]])
    probs = np.array([[0.9, 0.2, 0.35], [0.1, 0.6, 0.3], [0.8, 0.32, 0.05]])
    # threshold 0.3: [[1,0,1],[0,1,1],[1,1,0]] → (1 + 2/3 + 1) / 3; 0.35: [[1,0,1],[0,1,0],[1,0,0]] → (1+1+2/3)/3
    assert f1_at_threshold(probs, gold, 0.3) == pytest.approx((1 + 2 / 3 + 1) / 3)
    assert f1_at_threshold(probs, gold, 0.35) == pytest.approx((1 + 1 + 2 / 3) / 3)
    assert f1_at_threshold(probs, gold, 0.32) == pytest.approx(1.0)  # >= threshold counts as predicted
    t, f1 = best_threshold(probs, gold, grid=[0.1, 0.3, 0.32, 0.33, 0.5])
    assert (t, f1) == (0.32, pytest.approx(1.0))
    # every threshold in (0.1, 0.9] is perfect (0.1 >= 0.1 still predicts the second label): ties go to the first
    t, f1 = best_threshold(np.array([[0.9, 0.1]]), np.array([[1, 0]]))
    assert t == DEFAULT_THRESHOLDS[2] == 0.15 and f1 == 1.0
    assert DEFAULT_THRESHOLDS[0] == 0.05 and DEFAULT_THRESHOLDS[-1] == 0.95 and len(DEFAULT_THRESHOLDS) == 19
    with pytest.raises(ValueError, match="empty"):
        best_threshold(probs, gold, grid=[])


# --- real data (skipped when absent) -------------------------------------------------------------------------------

@pytest.mark.real_data("bibtex")
def test_real_bibtex(data_root):
    root = data_root / "bibtex"
    train = read_arff(root / "bibtex-train.arff.gz")  # label count from bibtex.xml
    assert train.x.shape == (4880, 1836) and train.y.shape == (4880, 159)
    assert train.label_names[0] == "TAG_2005" and set(np.unique(train.x)) == {0.0, 1.0}
    data = mlc_dataset("bibtex", root.parent)
    assert {s: data.size(s) for s in data.splits} == {"train": 4407, "valid": 1491, "test": 1497}
    assert data.dims == {"input_dim": 1836, "num_labels": 159}
    y = torch.cat([d["y"] for d in data.splits.values()])
    assert len(y) == 7395 and y.sum(1).min() >= 1
    assert y.sum(1).mean().item() == pytest.approx(2.402, abs=1e-3)


@pytest.mark.real_data("delicious")
def test_real_delicious(data_root):
    root = data_root / "delicious"
    test = read_arff(root / "delicious-test.arff.gz")
    assert test.x.shape == (3185, 500) and test.y.shape == (3185, 983)
    assert int((test.y.sum(1) == 0).sum()) == 4
    data = mlc_dataset("delicious", root.parent)
    assert {s: data.size(s) for s in data.splits} == {"train": 9690, "valid": 3207, "test": 3194}
    assert data.dims == {"input_dim": 500, "num_labels": 983}
    with pytest.raises(ValueError, match="16105 examples"):
        mlc_dataset("delicious", root.parent, drop_empty=False)
