"""Latent structures (DESIGN.md §4): what z can be, with MAP, marginals, SparseMAP, sampling, log-partition."""

from latentstruct.structures.base import Structure, gumbel_like
from latentstruct.structures.binary_tree import BinaryTree
from latentstruct.structures.binary_vector import BinaryVector
from latentstruct.structures.categorical import Categorical
from latentstruct.structures.dependency import ProjectiveDepTree
from latentstruct.structures.matching import Matching
from latentstruct.structures.nonprojective import NonProjectiveDepTree
from latentstruct.structures.sequence import SequenceTagging
from latentstruct.structures.topk import TopK

__all__ = [
    "Structure",
    "Categorical",
    "ProjectiveDepTree",
    "NonProjectiveDepTree",
    "SequenceTagging",
    "BinaryTree",
    "Matching",
    "TopK",
    "BinaryVector",
    "gumbel_like",
]
