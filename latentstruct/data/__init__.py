"""Datasets: generators for synthetic data and readers for the real formats."""

from latentstruct.data.base import TensorSplits, iterate_batches, num_batches
from latentstruct.data.images import image_classification
from latentstruct.data.sorting import sorting_numbers
from latentstruct.data.synthetic import synthetic_clusters

__all__ = ["TensorSplits", "iterate_batches", "num_batches", "synthetic_clusters", "sorting_numbers",
           "image_classification"]
