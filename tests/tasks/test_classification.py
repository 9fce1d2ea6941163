"""The classification task's own metric: the V-measure, computed here, against scikit-learn's."""

from __future__ import annotations

import pytest
import torch

from latentstruct.tasks.classification import v_measure


def test_v_measure_is_scikit_learns_on_random_labelings():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        n, classes, clusters = (int(torch.randint(1, high, (1,), generator=gen)) for high in (60, 6, 6))
        true = torch.randint(0, classes, (n,), generator=gen) * 3 + 7  # labels need not be 0..k-1
        pred = torch.randint(0, clusters, (n,), generator=gen) - 2
        want = 100 * sklearn_metrics.v_measure_score(true.numpy(), pred.numpy())
        assert v_measure(true, pred) == pytest.approx(want, abs=1e-9)


def test_v_measure_at_its_edges():
    same = torch.tensor([0, 0, 1, 1, 2])
    assert v_measure(same, same + 5) == pytest.approx(100)  # a relabelling is perfect
    assert v_measure(same, torch.zeros(5, dtype=torch.long)) == pytest.approx(0)  # one cluster: not homogeneous
    assert v_measure(torch.zeros(4, dtype=torch.long), torch.arange(4)) == pytest.approx(0)  # one class, split
    assert v_measure(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long)) == 100
    assert v_measure(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1])) == pytest.approx(0)  # independent
