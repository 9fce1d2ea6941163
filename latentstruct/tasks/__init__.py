"""Tasks: how a batch flows through the model, its loss and its metrics (the interface: ``tasks/base.py``)."""

from latentstruct.tasks.base import Task
from latentstruct.tasks.classification import LatentClassifier
from latentstruct.tasks.energy import BilevelEnergyTask, MultiLabelEnergy
from latentstruct.tasks.energy_citation import CitationEnergy
from latentstruct.tasks.energy_ner import SequenceLabelEnergy
from latentstruct.tasks.knn import KNN
from latentstruct.tasks.listops import ListOps
from latentstruct.tasks.sorting import Sorting
from latentstruct.tasks.text import LatentTreeNLI, LatentTreeSST
from latentstruct.tasks.vae import SemiSupervisedVAE, UnsupervisedVAE

__all__ = ["Task", "LatentClassifier", "Sorting", "KNN", "LatentTreeSST", "LatentTreeNLI", "SemiSupervisedVAE",
           "UnsupervisedVAE", "ListOps", "BilevelEnergyTask", "MultiLabelEnergy",
           "SequenceLabelEnergy", "CitationEnergy"]
