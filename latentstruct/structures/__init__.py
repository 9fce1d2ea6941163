"""Latent structures (DESIGN.md §4): what z can be, with MAP, marginals, SparseMAP, sampling, log-partition."""

from latentstruct.structures.base import Structure, gumbel_like
from latentstruct.structures.categorical import Categorical
from latentstruct.structures.dependency import ProjectiveDepTree

__all__ = ["Structure", "Categorical", "ProjectiveDepTree", "gumbel_like"]
