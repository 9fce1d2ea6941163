"""Synthetic clusters (seed 001 §7.1, the protocol of the authors' code).

z ~ Uniform{0..K-1}; x = m_z + σ·N(0, I) with centres m_z ~ N(0, I); one ground-truth linear model per cluster,
w_z ~ N(0, I); y = 1[w_z·x > b_z] with b_z the mean of w_z·x over the training examples of cluster z (so labels are
balanced). Validation and test are drawn fresh from the same centres and models.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
import torch

from latentstruct.data.base import TensorSplits
from latentstruct.ranges import AtLeast, NonNegative

__all__ = ["synthetic_clusters"]


def synthetic_clusters(
    num_features: Annotated[int, AtLeast(1)] = 100,
    num_clusters: Annotated[int, AtLeast(1)] = 3,
    n_train: Annotated[int, AtLeast(1)] = 5000,
    n_valid: Annotated[int, NonNegative] = 1000,
    n_test: Annotated[int, NonNegative] = 1000,
    noise: Annotated[float, NonNegative] = 0.1,
    seed: int = 42,
    data_dir: str | None = None,
) -> TensorSplits:
    """Generate the three splits. Deterministic in ``seed`` (NumPy's legacy generator, stable across versions).

    Args:
        num_features: input dimension D
        num_clusters: number of clusters K (also the latent size)
        n_train: training examples
        n_valid: validation examples
        n_test: test examples
        noise: σ of the isotropic noise around each centre
        seed: data seed: centres, cluster models and samples
        data_dir: unused (generated data)
    """
    rng = np.random.RandomState(seed)
    centres = rng.randn(num_clusters, num_features)
    weights = rng.randn(num_clusters, num_features)

    def draw(n):
        z = rng.randint(num_clusters, size=n)
        x = centres[z] + noise * rng.randn(n, num_features)
        return x, z, np.einsum("nd,nd->n", weights[z], x)

    raw = {name: draw(n) for name, n in (("train", n_train), ("valid", n_valid), ("test", n_test))}
    _, z_train, proj_train = raw["train"]
    bias = np.array([proj_train[z_train == k].mean() if (z_train == k).any() else 0.0 for k in range(num_clusters)])
    splits = {
        name: {
            "x": torch.tensor(x, dtype=torch.float32),
            "y": torch.tensor(proj > bias[z], dtype=torch.long),
            "z": torch.tensor(z, dtype=torch.long),
        }
        for name, (x, z, proj) in raw.items()
    }
    return TensorSplits(splits, dims={"input_dim": num_features, "num_classes": 2, "latent_dim": num_clusters})


#: the structures whose scores this data's latent fills (latentstruct.capabilities): one of K clusters
synthetic_clusters.structures = ("categorical",)
