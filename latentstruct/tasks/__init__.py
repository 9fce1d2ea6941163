"""Tasks: how a batch flows through the model, its loss and its metrics."""

from latentstruct.tasks.classification import LatentClassifier

__all__ = ["LatentClassifier"]
