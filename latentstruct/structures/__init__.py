"""Latent structures (DESIGN.md §4): what z can be, with MAP, marginals, SparseMAP, sampling, log-partition."""

from latentstruct.structures.base import Structure, gumbel_like
from latentstruct.structures.categorical import Categorical

__all__ = ["Structure", "Categorical", "gumbel_like"]
