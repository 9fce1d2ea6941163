"""Multi-label classification: Mulan ARFF files, the re-split of the energy-model papers, and example-F1.

* :func:`read_arff` (Weka/Mulan ARFF, sparse or dense rows; the labels are the last ``num_labels`` attributes, read
  from the Mulan XML header :func:`read_label_xml` when not given), :func:`load_mulan`.
* :func:`mlc_dataset` reads ``data_dir/<name>/`` (bibtex, delicious, eurlex, bookmarks, or any Mulan-named dataset),
  merges train and test, drops the unlabelled examples and re-splits them by :func:`resplit` into the train / valid /
  test sizes of seed 004 (:data:`SPLIT_SIZES`; ``sizes=`` for the others).
* :func:`example_f1` (both sets empty scores 1.0), :func:`f1_at_threshold`, :func:`best_threshold` (on validation
  predictions only; ties to the smallest of :data:`DEFAULT_THRESHOLDS`).

Example::

    >>> example_f1(torch.tensor([[1, 0, 1], [0, 0, 0]]), torch.tensor([[1, 0, 0], [0, 0, 0]]))
    0.8333333333333333

File formats and names, the re-split and how its sizes were read from the paper (the 14 unlabelled delicious
examples), the threshold protocol: docs/data.md#mlc.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NamedTuple

import numpy as np
import torch

from latentstruct.data.base import TensorSplits
from latentstruct.data.files import first_file, read_lines
from latentstruct.ranges import NonNegative

__all__ = [
    "DEFAULT_THRESHOLDS",
    "MULAN_DATASETS",
    "SPLIT_SIZES",
    "MultiLabelData",
    "best_threshold",
    "example_f1",
    "f1_at_threshold",
    "load_mulan",
    "mlc_dataset",
    "read_arff",
    "read_label_xml",
    "resplit",
]

#: thresholds tried by :func:`best_threshold`: 0.05, 0.10, ..., 0.95
DEFAULT_THRESHOLDS: tuple[float, ...] = tuple(round(0.05 * k, 2) for k in range(1, 20))

#: train / valid / test sizes of the re-split (docs/data.md#mlc); bookmarks has none
SPLIT_SIZES: dict[str, tuple[int, int, int]] = {
    "bibtex": (4407, 1491, 1497),
    "delicious": (9690, 3207, 3194),
    "eurlex": (11557, 3876, 3881),
}


@dataclass(frozen=True)
class _Mulan:
    """Where a dataset's files are (alternatives of file stems, merged in order) and its expected sizes."""

    files: tuple[tuple[str, ...], ...]
    num_features: int | None = None
    num_labels: int | None = None


MULAN_DATASETS: dict[str, _Mulan] = {
    "bibtex": _Mulan((("bibtex-train", "bibtex-test"), ("bibtex",)), 1836, 159),
    "delicious": _Mulan((("delicious-train", "delicious-test"), ("delicious",)), 500, 983),
    "eurlex": _Mulan(
        (("eurlex-ev-fold1-train", "eurlex-ev-fold1-test"), ("eurlex-ev-train", "eurlex-ev-test"), ("eurlex-ev",)),
        5000, 3993,
    ),
    "bookmarks": _Mulan((("bookmarks-train", "bookmarks-test"), ("bookmarks",)), 2150, 208),
}


class MultiLabelData(NamedTuple):
    """``x``: float32 ``[N, F]`` features; ``y``: bool ``[N, L]`` labels; the attribute names of both."""

    x: np.ndarray
    y: np.ndarray
    feature_names: list[str]
    label_names: list[str]


# --- ARFF ----------------------------------------------------------------------------------------------------------


def _attribute_name(rest: str, where: str) -> str:
    """The name at the start of an ``@attribute`` declaration's remainder (bare, or quoted with escapes)."""
    rest = rest.strip()
    if not rest:
        raise ValueError(f"{where}: @attribute without a name")
    quote = rest[0]
    if quote not in "'\"":
        parts = rest.split(None, 1)
        if len(parts) < 2:
            raise ValueError(f"{where}: @attribute {parts[0]!r} has no type")
        return parts[0]
    chars: list[str] = []
    i = 1
    while i < len(rest):
        c = rest[i]
        if c == "\\" and i + 1 < len(rest):
            chars.append(rest[i + 1])
            i += 2
            continue
        if c == quote:
            if not rest[i + 1 :].strip():
                raise ValueError(f"{where}: @attribute {''.join(chars)!r} has no type")
            return "".join(chars)
        chars.append(c)
        i += 1
    raise ValueError(f"{where}: unterminated quoted attribute name")


def _number(text: str, where: str) -> float:
    text = text.strip().strip("'\"")
    try:
        return float(text)
    except ValueError:
        if text == "?":
            raise ValueError(f"{where}: missing values ('?') are not supported") from None
        raise ValueError(f"{where}: non-numeric value {text!r}") from None


def read_label_xml(path: str | Path) -> list[str]:
    """The label names of a Mulan XML header, in document order (``<label name="...">`` at any depth)."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as err:
        raise ValueError(f"{path}: not a well-formed Mulan label XML ({err})") from None
    names = []
    for element in root.iter():
        if element.tag.rsplit("}", 1)[-1] == "label":
            name = element.get("name")
            if name is None:
                raise ValueError(f"{path}: a <label> element has no name attribute")
            names.append(name)
    if not names:
        raise ValueError(f"{path}: no <label name=...> element found")
    return names


def _label_xml_candidates(arff: Path) -> list[Path]:
    stem = re.sub(r"(\.arff)?(\.gz|\.xz|\.bz2)?$", "", arff.name)
    out = [arff.parent / f"{stem}.xml"]
    while "-" in stem:
        stem = stem.rsplit("-", 1)[0]
        out.append(arff.parent / f"{stem}.xml")
    return out


def read_arff(
    path: str | Path, num_labels: int | None = None, label_xml: str | Path | None = None
) -> MultiLabelData:
    """Read a Mulan ARFF file (sparse or dense rows; docs/data.md#mlc). The last ``num_labels`` attributes are the
    labels; without ``num_labels`` they are the labels of ``label_xml`` or of the XML header found next to the file.
    Returns float32 features ``[N, F]`` and bool labels ``[N, L]`` with their names."""
    path = Path(path)
    names: list[str] = []
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    row_lines: list[int] = []  # the line of each row, for the messages
    n = lineno = 0
    in_data = False
    for lineno, line in read_lines(path, final_newline=False):
        line = line.strip()
        if not line or line.startswith("%"):
            continue
        where = f"{path}:{lineno}"
        if not in_data:
            keyword, *rest_ = line.split(None, 1)
            keyword, rest = keyword.lower(), (rest_[0] if rest_ else "")
            if keyword == "@attribute":
                names.append(_attribute_name(rest, where))
            elif keyword == "@data":
                in_data = True
            elif keyword != "@relation":
                raise ValueError(f"{where}: unexpected header line {line[:60]!r}")
            continue
        if line.startswith("{"):
            if not line.endswith("}"):
                raise ValueError(f"{where}: a sparse row must end with '}}' (instance weights are not supported)")
            body = line[1:-1].strip()
            seen: set[int] = set()
            for item in body.split(",") if body else ():
                parts = item.split()
                if len(parts) != 2:
                    raise ValueError(f"{where}: sparse entries are 'index value', got {item.strip()!r}")
                try:
                    index = int(parts[0])
                except ValueError:
                    raise ValueError(f"{where}: bad attribute index {parts[0]!r}") from None
                if not 0 <= index < len(names):
                    raise ValueError(f"{where}: attribute index {index} outside 0..{len(names) - 1}")
                if index in seen:
                    raise ValueError(f"{where}: attribute index {index} given twice")
                seen.add(index)
                try:  # the fast path: a plain number
                    value = float(parts[1])
                except ValueError:
                    value = _number(parts[1], where)
                rows.append(n)
                cols.append(index)
                vals.append(value)
        else:
            fields = line.split(",")
            if len(fields) != len(names):
                raise ValueError(f"{where}: a dense row needs {len(names)} values, got {len(fields)}")
            for index, field in enumerate(fields):
                value = _number(field, where)
                if value != 0.0:
                    rows.append(n)
                    cols.append(index)
                    vals.append(value)
        row_lines.append(lineno)
        n += 1
    if not in_data:
        raise ValueError(f"{path}:{lineno}: the file ends before its @data section (truncated, or not an ARFF file?)")

    xml_names = None
    if num_labels is None:
        xml_path = Path(label_xml) if label_xml is not None else first_file(_label_xml_candidates(path))
        if xml_path is None or not xml_path.is_file():
            tried = [str(label_xml)] if label_xml is not None else [str(p) for p in _label_xml_candidates(path)]
            raise FileNotFoundError(
                f"{path}: num_labels not given and no Mulan label XML found (looked for {', '.join(tried)})"
            )
        xml_names = read_label_xml(xml_path)
        num_labels = len(xml_names)
    if not 1 <= num_labels < len(names):
        raise ValueError(f"{path}: num_labels={num_labels} impossible with {len(names)} attributes")
    num_features = len(names) - num_labels
    if xml_names is not None and sorted(xml_names) != sorted(names[num_features:]):
        label_names = set(names[num_features:])
        i, name = next(((i, name) for i, name in enumerate(xml_names) if name not in label_names), (0, xml_names[0]))
        raise ValueError(
            f"{xml_path}: label {i} {name!r} is not among the last {num_labels} attributes of {path} (the XML's labels "
            "must be the ARFF's last attributes, each once)"
        )

    row = np.asarray(rows, dtype=np.int64)
    col = np.asarray(cols, dtype=np.int64)
    val = np.asarray(vals, dtype=np.float32)
    x = np.zeros((n, num_features), dtype=np.float32)
    is_feature = col < num_features
    x[row[is_feature], col[is_feature]] = val[is_feature]
    label_vals = val[~is_feature]
    if not np.isin(label_vals, (0.0, 1.0)).all():
        first = int(np.flatnonzero(~np.isin(label_vals, (0.0, 1.0)))[0])
        bad_row, bad_col = int(row[~is_feature][first]), int(col[~is_feature][first])
        raise ValueError(
            f"{path}:{row_lines[bad_row]}: label values must be 0 or 1, found {label_vals[first]:g} for "
            f"{names[bad_col]!r}"
        )
    y = np.zeros((n, num_labels), dtype=bool)
    y[row[~is_feature], col[~is_feature] - num_features] = label_vals == 1.0
    return MultiLabelData(x, y, names[:num_features], names[num_features:])


# --- datasets ------------------------------------------------------------------------------------------------------


def _spec(name: str) -> _Mulan:
    return MULAN_DATASETS.get(name, _Mulan(((f"{name}-train", f"{name}-test"), (name,))))


def _arff(folder: Path, stem: str) -> Path | None:
    return first_file([folder / f"{stem}.arff", folder / f"{stem}.arff.gz"])


def load_mulan(name: str, folder: str | Path) -> tuple[MultiLabelData, list[Path]]:
    """Read dataset ``name`` from ``folder`` (the first complete file alternative listed in docs/data.md#mlc),
    train rows then test rows; return the merged data and the files read. The known datasets are checked against
    their feature and label counts."""
    folder = Path(folder)
    spec = _spec(name)
    paths: list[Path] = []
    for stems in spec.files:
        found = [_arff(folder, stem) for stem in stems]
        if all(found):
            paths = [p for p in found if p is not None]
            break
    if not paths:
        alternatives = "; or ".join(" + ".join(str(folder / f"{s}.arff[.gz]") for s in stems) for stems in spec.files)
        raise FileNotFoundError(
            f"no {name} ARFF files found; expected {alternatives} (the Mulan files: github.com/tsoumakas/mulan, "
            "folder data/multi-label/)"
        )
    parts = [read_arff(p, spec.num_labels) for p in paths]
    first = parts[0]
    for path, part in zip(paths[1:], parts[1:], strict=True):
        if part.feature_names != first.feature_names or part.label_names != first.label_names:
            raise ValueError(f"{path}: its attributes differ from those of {paths[0]}")
    data = MultiLabelData(
        np.concatenate([p.x for p in parts]), np.concatenate([p.y for p in parts]), first.feature_names,
        first.label_names,
    )
    if spec.num_features is not None and data.x.shape[1] != spec.num_features:
        raise ValueError(f"{name}: expected {spec.num_features} features, the files have {data.x.shape[1]}")
    return data, paths


def resplit(n: int, sizes: Sequence[int], seed: int = 0) -> dict[str, np.ndarray]:
    """Indices of train / valid / test: the first ``sizes[0]``, next ``sizes[1]`` and last ``sizes[2]`` entries of
    ``np.random.RandomState(seed).permutation(n)``; the sizes must add up to ``n``."""
    sizes = [int(s) for s in sizes]
    if len(sizes) != 3 or min(sizes) < 0:
        raise ValueError(f"sizes must be three non-negative integers (train, valid, test), got {sizes}")
    if sum(sizes) != n:
        raise ValueError(f"the split sizes {sizes} add up to {sum(sizes)}, but there are {n} examples")
    order = np.random.RandomState(seed).permutation(n)
    a, b = sizes[0], sizes[0] + sizes[1]
    return {"train": order[:a], "valid": order[a:b], "test": order[b:]}


def mlc_dataset(
    name: str,
    data_dir: str | Path,
    seed: int = 0,
    sizes: Annotated[Sequence[int] | None, NonNegative] = None,
    folder: str | None = None,
    drop_empty: bool = True,
) -> TensorSplits:
    """A Mulan dataset re-split as in docs/data.md#mlc, as :class:`~latentstruct.data.base.TensorSplits`: each
    split ``{"x": float32 [N, F], "y": float32 [N, L] in {0, 1}}``; ``dims`` = ``input_dim`` (F), ``num_labels``
    (L); ``extras`` = ``label_names``, ``files`` (the files read), ``seed``. ``folder`` defaults to ``name`` (relative
    to ``data_dir`` unless absolute); ``sizes`` overrides :data:`SPLIT_SIZES`.

    Args:
        name: bibtex, delicious, eurlex, bookmarks, or any <name> read from <data_dir>/<name>/: <name>-train.arff +
            <name>-test.arff (or <name>.arff) and <name>.xml.
        data_dir: root of the real datasets.
        seed: seed of the fixed re-split permutation (the same split for every run).
        sizes: train / valid / test sizes adding up to the labelled examples; null = seed 004's Table 6 (bibtex,
            delicious, eurlex; bookmarks has none).
        folder: the dataset folder, relative to data_dir unless absolute; null = <name>.
        drop_empty: drop the examples without any label before splitting (gives the paper's sizes).
    """
    if sizes is None:
        if name not in SPLIT_SIZES:
            raise ValueError(
                f"no published split sizes for {name!r} (known: {', '.join(SPLIT_SIZES)}); pass "
                "sizes=(n_train, n_valid, n_test) adding up to the number of examples"
            )
        sizes = SPLIT_SIZES[name]
    root = Path(folder or name).expanduser()
    root = root if root.is_absolute() else Path(data_dir) / root
    data, paths = load_mulan(name, root)
    x, y = data.x, data.y
    if drop_empty:
        keep = y.any(axis=1)
        x, y = x[keep], y[keep]
    try:
        index = resplit(len(x), sizes, seed)
    except ValueError as err:
        what = "labelled examples" if drop_empty else "examples"
        raise ValueError(f"{name}: {err} ({len(x)} {what} in {', '.join(map(str, paths))})") from None
    splits = {
        split: {"x": torch.from_numpy(x[idx]), "y": torch.from_numpy(y[idx].astype(np.float32))}
        for split, idx in index.items()
    }
    dims = {"input_dim": x.shape[1], "num_labels": y.shape[1]}
    return TensorSplits(splits, dims=dims, extras={"label_names": data.label_names, "files": paths, "seed": seed})


# --- metrics -------------------------------------------------------------------------------------------------------


def _pair(pred: torch.Tensor | np.ndarray, gold: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    pred, gold = torch.as_tensor(pred), torch.as_tensor(gold)
    if pred.shape != gold.shape or pred.dim() != 2:
        shapes = f"{tuple(pred.shape)} and {tuple(gold.shape)}"
        raise ValueError(f"expected two [N, L] arrays of the same shape, got {shapes}")
    return pred, gold


def example_f1(pred: torch.Tensor | np.ndarray, gold: torch.Tensor | np.ndarray) -> float:
    """Mean over the ``N`` examples of ``2 |p ∩ g| / (|p| + |g|)`` for 0/1 ``pred`` and ``gold`` ``[N, L]``; an example
    whose predicted and gold sets are both empty counts 1.0. Returns a fraction (not ×100); 0.0 when ``N`` = 0."""
    pred, gold = _pair(pred, gold)
    if len(pred) == 0:
        return 0.0
    p, g = pred.bool(), gold.bool()
    inter = (p & g).sum(1).double()
    total = (p.sum(1) + g.sum(1)).double()
    f1 = torch.where(total > 0, 2 * inter / total.clamp(min=1), torch.ones_like(total))
    return float(f1.mean())


def f1_at_threshold(
    probs: torch.Tensor | np.ndarray, gold: torch.Tensor | np.ndarray, threshold: float
) -> float:
    """:func:`example_f1` of the prediction ``probs >= threshold`` (``probs``, ``gold``: ``[N, L]``)."""
    probs, gold = _pair(probs, gold)
    return example_f1(probs >= threshold, gold)


def best_threshold(
    probs_valid: torch.Tensor | np.ndarray,
    gold_valid: torch.Tensor | np.ndarray,
    grid: Sequence[float] = DEFAULT_THRESHOLDS,
) -> tuple[float, float]:
    """The threshold of ``grid`` with the highest validation example-F1 (the first, i.e. smallest of a sorted grid,
    on ties) and that F1. Pass validation predictions only; apply the threshold to test with
    :func:`f1_at_threshold`."""
    if len(grid) == 0:
        raise ValueError("the threshold grid is empty")
    scores = [f1_at_threshold(probs_valid, gold_valid, float(t)) for t in grid]
    best = int(np.argmax(scores))
    return float(grid[best]), scores[best]
