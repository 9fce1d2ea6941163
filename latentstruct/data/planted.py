r"""Planted-structure classification (issue #22; in the spirit of seed 001 §7.1): a known latent structure per example.

A fixed random *teacher* maps each input to the part scores of a structure, the true latent is the teacher's MAP
structure, and the label is a fixed random bilinear read-out of the input through that structure:

    x ~ N(0, I_D)                                                          (input, D = ``num_features``)
    s*(x) = reshape(W_t x, part_shape) + σ_t ε,   W_t ~ N(0, 1/D),  ε ~ N(0, I)     (teacher part scores)
    z*    = MAP_Z(s*(x))                     (the structure's own ``map``: a vertex of Z, [*part_shape], 0/1)
    u(x)  = xᵀ V vec(z*) = Σ_p z*_p (V_p · x),   V ~ N(0, 1) [D, P]         (P = prod(part_shape) parts)
    y     = 1[u(x) > b] XOR f,  b = median of u over the training split,  f ~ Bernoulli(label_noise)

σ_t = ``teacher_noise`` (0: z* is a deterministic function of x; MAP is invariant to the teacher's scale, so a
"temperature" only matters through σ_t). The read-out u is exactly what the bilinear decoder fed the true z*
computes (ŷ = zᵀ W_g x + b_g, ``latent=gold``): the oracle's error is the label noise plus its estimation error,
while the linear model (ŷ = w·x + b, ``latent=none``) only sees the average read-out E[vec(z*)]ᵀ Vᵀ x, as z* varies
with x. Each example's parts, per ``structure`` with n = ``size`` (the shapes of ``tests/structures/test_contract.py``):

========================  ===================  =================================================
structure                 part_shape           z* (a vertex)
========================  ===================  =================================================
categorical               (n,)                 one of n classes (one-hot)
sequence_tagging          (n, T, T)            n tags among T = ``num_tags`` (linear-chain parts)
binary_tree               (n, n)               the n - 1 constituents of a binary tree over n leaves
projective_dep_tree       (n+1, n+1)           a head per word (arcs h → m; 0 is the root)
nonprojective_dep_tree    (n+1, n+1)           a head per word, any spanning arborescence
matching                  (n, n)               a permutation matrix
topk                      (n,)                 a k-subset (k-hot), k = ``k``
========================  ===================  =================================================

Validation and test are drawn fresh from the same teacher and read-out; the threshold b comes from the training
split only. Deterministic in ``seed`` (NumPy's legacy generator for x, W_t, V, ε and the flips; the MAP is exact).

The true latents vary across examples. With the sizes of ``configs/experiment/planted_<structure>.yaml`` (D = 10,
4,000 training examples, seed 0), the distinct z* among the training examples and their empirical entropy:
categorical (n = 6) 6, 2.4 bits; sequence_tagging (n = 6, T = 3) 370, 7.5 bits; binary_tree (n = 8; 429 trees exist)
303, 7.3 bits; projective_dep_tree (n = 6) 528, 8.0 bits; nonprojective_dep_tree (n = 6) 1,499, 9.9 bits; matching
(n = 6; 720 exist) 409, 7.8 bits; topk (n = 8, k = 3; 56 exist) 50, 5.0 bits. The most frequent z* covers at most
7% of the examples (24% for the 6 classes). Test accuracies of the references (trainer ``planted``, seed 301) are
in ``docs/reference.md``'s "Planted structures".
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
import torch

from latentstruct.data.base import TensorSplits
from latentstruct.ranges import AtLeast, NonNegative
from latentstruct.structures import (
    BinaryTree,
    Categorical,
    Matching,
    NonProjectiveDepTree,
    ProjectiveDepTree,
    SequenceTagging,
    TopK,
)

__all__ = ["planted_structure", "STRUCTURES", "make_structure", "part_shape"]

#: the structures, by their option names in ``configs/structure/``
STRUCTURES = ("categorical", "sequence_tagging", "binary_tree", "projective_dep_tree", "nonprojective_dep_tree",
              "matching", "topk")

StructureName = Literal["categorical", "sequence_tagging", "binary_tree", "projective_dep_tree",
                        "nonprojective_dep_tree", "matching", "topk"]


def make_structure(structure: str, num_tags: int = 5, k: int = 3, multiroot: bool = True):
    """The structure object of an option name (the same settings as the ``structure=`` option it names)."""
    return {
        "categorical": lambda: Categorical(),
        "sequence_tagging": lambda: SequenceTagging(num_tags),
        "binary_tree": lambda: BinaryTree(),
        "projective_dep_tree": lambda: ProjectiveDepTree(multiroot),
        "nonprojective_dep_tree": lambda: NonProjectiveDepTree(multiroot),
        "matching": lambda: Matching(),
        "topk": lambda: TopK(k),
    }[structure]()


def part_shape(structure: str, size: int, num_tags: int = 5) -> tuple[int, ...]:
    """The shape of one example's parts for a structure of size n = ``size``."""
    n = size
    return {
        "categorical": (n,),
        "sequence_tagging": (n, num_tags, num_tags),
        "binary_tree": (n, n),
        "projective_dep_tree": (n + 1, n + 1),
        "nonprojective_dep_tree": (n + 1, n + 1),
        "matching": (n, n),
        "topk": (n,),
    }[structure]


def planted_structure(
    structure: StructureName = "projective_dep_tree",
    size: Annotated[int, AtLeast(2)] = 6,
    num_tags: Annotated[int, AtLeast(1)] = 5,
    k: Annotated[int, AtLeast(1)] = 3,
    multiroot: bool = True,
    num_features: Annotated[int, AtLeast(1)] = 10,
    n_train: Annotated[int, AtLeast(1)] = 4000,
    n_valid: Annotated[int, NonNegative] = 1000,
    n_test: Annotated[int, NonNegative] = 1000,
    teacher_noise: Annotated[float, NonNegative] = 0.0,
    label_noise: Annotated[float, NonNegative] = 0.05,
    seed: int = 0,
    data_dir: str | None = None,
) -> TensorSplits:
    """Generate the three splits (the equations are in the module docstring). Deterministic in ``seed``.

    Args:
        structure: the latent structure (the name of its ``structure=`` option; the experiments set both)
        size: n, the structure's size (classes, words, leaves, matched items, candidates)
        num_tags: T, the tags of sequence_tagging (the structure's num_tags)
        k: the subset size of topk (the structure's k)
        multiroot: dependency trees may have several root arcs (the structure's multiroot)
        num_features: input dimension D
        n_train: training examples
        n_valid: validation examples
        n_test: test examples
        teacher_noise: σ_t, the std of the Gaussian noise on the teacher's part scores (0: z* is a function of x)
        label_noise: probability of flipping each label, after thresholding the read-out
        seed: data seed: teacher, read-out, samples and flips
        data_dir: unused (generated data)
    """
    if structure not in STRUCTURES:
        raise ValueError(f"structure must be one of {STRUCTURES}, got {structure!r}")
    if not 0 <= label_noise <= 0.5:
        raise ValueError(f"label_noise is a flip probability in [0, 0.5], got {label_noise}")
    if structure == "topk" and not 1 <= k <= size:
        raise ValueError(f"topk needs 1 <= k <= size, got k={k}, size={size}")
    shape = part_shape(structure, size, num_tags)
    parts = math.prod(shape)
    struct = make_structure(structure, num_tags, k, multiroot)
    rng = np.random.RandomState(seed)
    teacher = rng.randn(parts, num_features) / math.sqrt(num_features)  # W_t
    readout = rng.randn(num_features, parts)  # V

    def draw(n):
        x = rng.randn(n, num_features)
        scores = x @ teacher.T + teacher_noise * rng.randn(n, parts)
        z = struct.map(torch.tensor(scores, dtype=torch.float64).view(n, *shape)).to(torch.float32)
        u = np.einsum("nd,dp,np->n", x, readout, z.reshape(n, parts).double().numpy())
        flips = rng.rand(n) < label_noise
        return x, z, u, flips

    raw = {name: draw(n) for name, n in (("train", n_train), ("valid", n_valid), ("test", n_test))}
    threshold = float(np.median(raw["train"][2]))
    splits = {
        name: {
            "x": torch.tensor(x, dtype=torch.float32),
            "y": torch.tensor((u > threshold) ^ flips, dtype=torch.long),
            "z": z,
        }
        for name, (x, z, u, flips) in raw.items()
    }
    dims = {"input_dim": num_features, "num_classes": 2, "latent_dim": parts, "part_shape": shape}
    return TensorSplits(splits, dims=dims)
