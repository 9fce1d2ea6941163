"""Datasets as in-memory tensors with a deterministic, resumable batch iterator."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["TensorSplits", "iterate_batches", "num_batches"]


@dataclass
class TensorSplits:
    """``splits[name]`` is a dict of equally long tensors (e.g. ``x``, ``y``, ``z``); the ``dims`` tell the model
    builder its sizes (``input_dim``, ``num_classes``, ``latent_dim``); ``extras`` hands it what is not a size but
    comes with the data (the text datasets: the vocabulary and the pretrained embedding matrix)."""

    splits: dict[str, dict[str, torch.Tensor]]
    dims: dict[str, int] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)

    def size(self, split: str) -> int:
        return len(next(iter(self.splits[split].values())))


def num_batches(n: int, batch_size: int | None, drop_last: bool = False) -> int:
    """Batches per epoch; with ``drop_last`` the last, smaller batch is not counted (nor yielded)."""
    if not batch_size:
        return 1
    if drop_last and n < batch_size:
        raise ValueError(f"drop_last with batch size {batch_size} leaves no batch of {n} examples")
    return n // batch_size if drop_last else -(-n // batch_size)


def iterate_batches(
    data: dict[str, torch.Tensor],
    batch_size: int | None,
    shuffle_seed: int | None = None,
    start: int = 0,
    drop_last: bool = False,
) -> Iterator[dict[str, torch.Tensor]]:
    """Yield batches from batch index ``start`` on. ``batch_size=None`` is one full batch; a shuffle order depends
    only on ``shuffle_seed`` so that a resumed run sees exactly the batches it would have seen; ``drop_last`` skips
    a last batch smaller than ``batch_size``."""
    n = len(next(iter(data.values())))
    if not batch_size:
        if start == 0:
            yield data
        return
    order = torch.arange(n)
    if shuffle_seed is not None:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(shuffle_seed))
    for i in range(start * batch_size, n - batch_size + 1 if drop_last else n, batch_size):
        idx = order[i : i + batch_size]
        yield {k: v[idx] for k, v in data.items()}
