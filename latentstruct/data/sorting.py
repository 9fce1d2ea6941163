"""Sorting numbers as a bipartite matching (Mena et al. 2018, Sorting Numbers; seed 002 §5.1, App. C.1).

Each example is a sequence x of d numbers drawn i.i.d. from U[0, 1]; its label is the permutation matrix that sorts
it, z*[i, j] = 1 iff x_i is the j-th smallest number of x (0-based j). The label is stored compactly as the rank
vector ``y`` ``[N, d]`` (y[n, i] = j iff z*[n, i, j] = 1), so that ``z* = one_hot(y, d)``.

Split sizes. Seed 002's released code trains on one fixed set of 10 sequences (its batch size), one full-batch step
per "epoch", and tests on a single fresh sequence per repetition (200 repetitions). We keep the 10 training sequences
as the default but validate and test on many sequences (defaults 200 and 1000) and report means over them: the mean
over a test set is what the 200 single-sequence repetitions estimate, with far less variance per run.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
import torch

from latentstruct.data.base import TensorSplits
from latentstruct.ranges import AtLeast, NonNegative

__all__ = ["sorting_numbers", "ranks"]


def ranks(x: np.ndarray) -> np.ndarray:
    """The rank of every number within its sequence: ``[N, d]`` float → ``[N, d]`` int64, 0 = the smallest.

    Ties (possible after rounding to float32, with probability ~d²/2²⁵ per sequence) are broken by position, so
    the labels are always permutations.
    """
    order = np.argsort(x, axis=-1, kind="stable")  # order[n, j] = index of the j-th smallest
    return np.argsort(order, axis=-1)  # the inverse permutation: the position of each index


def sorting_numbers(
    num_items: Annotated[int, AtLeast(1)] = 10,
    n_train: Annotated[int, AtLeast(1)] = 10,
    n_valid: Annotated[int, NonNegative] = 200,
    n_test: Annotated[int, NonNegative] = 1000,
    seed: int = 42,
    data_dir: str | None = None,
) -> TensorSplits:
    """Generate the three splits: ``x`` ``[N, d]`` float32 in [0, 1) and ``y`` ``[N, d]`` int64 ranks.

    Deterministic in ``seed`` (NumPy's legacy generator, stable across versions); the splits are drawn in the order
    train, valid, test, so a larger ``n_test`` never changes the training data.

    Args:
        num_items: d, the length of each sequence (the matching is d × d)
        n_train: training sequences (seed 002's released code: 10, one full batch)
        n_valid: validation sequences (best-validation selection stands in for early stopping)
        n_test: test sequences (the paper: a single one per repetition; we report means over many)
        seed: data seed: every split's numbers
        data_dir: unused (generated data)
    """
    if num_items < 1:
        raise ValueError(f"num_items must be >= 1, got {num_items}")
    rng = np.random.RandomState(seed)
    splits = {}
    for name, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        x = rng.uniform(0.0, 1.0, size=(n, num_items)).astype(np.float32)
        splits[name] = {"x": torch.from_numpy(x), "y": torch.from_numpy(ranks(x))}
    return TensorSplits(splits, dims={"input_dim": num_items, "num_items": num_items})
