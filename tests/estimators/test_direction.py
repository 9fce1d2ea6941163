"""Every estimator points downhill: on every structure it serves, with a linear loss on an enumerable case, its mean
gradient has a positive cosine with the exact gradient of the expected loss (latentstruct.diagnose computes both).

A flipped sign (``backward_fn`` negated, a pull-back subtracted the wrong way) turns that cosine negative: the other
estimator tests, which check shapes, finiteness and hand-computed cases of a few estimators, let it through.
``python -m latentstruct.diagnose`` shows the same cosines (and more) as a table.
"""

from __future__ import annotations

import pytest
import torch

from latentstruct import capabilities, diagnose

#: diagnose's structures by the name of their structure= option
OPTION = {"categorical": "categorical", "sequence": "sequence_tagging", "binary_tree": "binary_tree",
          "projective": "projective_dep_tree", "nonprojective": "nonprojective_dep_tree", "matching": "matching",
          "topk": "topk"}


def test_every_structure_of_the_microscope_is_an_option():
    assert set(OPTION) == set(diagnose.STRUCTURES)
    assert all(type(diagnose.STRUCTURES[name][0]) is capabilities.options("structure")[OPTION[name]]
               for name in OPTION)


@pytest.mark.parametrize("option", diagnose.estimator_options())
def test_the_mean_gradient_points_along_the_exact_one(option):
    torch.set_num_threads(1)
    estimator = diagnose.build_estimator(option)
    served = [name for name in diagnose.STRUCTURES
              if not capabilities.missing(type(estimator), capabilities.options("structure")[OPTION[name]])]
    assert served, f"{option} serves no structure of the microscope"
    cosines = {}
    for name in served:
        got = diagnose.measure(option, estimator, name, "linear", batch=3, draws=8, seed=0)
        assert not isinstance(got, str), f"{option} on {name}: {got}"
        cosines[name] = got.cosine_of_mean
    assert all(c > 0.05 for c in cosines.values()), f"{option}: cosine of the mean gradient with the exact {cosines}"
