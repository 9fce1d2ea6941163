"""scripts/spigot_ce_probe.py: T is the projection onto the tree polytope's affine hull, and for a small step from the
marginals (inside the polytope) it is what the exact SparseMAP projection returns."""

from __future__ import annotations

import torch

from latentstruct.structures import ProjectiveDepTree
from latentstruct.structures.sparsemap import sparsemap
from scripts.spigot_ce_probe import hull, tangent


def test_hull_enumeration_agrees_with_tangent():
    hull()  # raises if T changes a difference of two trees


def test_tangent_is_the_exact_projection_of_a_small_interior_step():
    torch.manual_seed(0)
    tree = ProjectiveDepTree(multiroot=True)
    scores = torch.randn(3, 6, 6, dtype=torch.float64)
    lengths = torch.tensor([5, 4, 3])
    mu0 = tree.marginals(scores, lengths)
    step = 1e-3 * torch.randn(3, 6, 6, dtype=torch.float64)
    exact = mu0 - sparsemap(tree, mu0 - step, lengths, tol=1e-12)
    assert torch.allclose(exact, tangent(step, lengths), atol=1e-9)
    assert not torch.allclose(exact, torch.where(step.abs() > 0, step, 0.0), atol=1e-5)  # T is not the raw step
    # the 2-iteration active set returns something else entirely: the truncation SST's SPIGOT-CE ran with
    truncated = mu0 - sparsemap(tree, mu0 - step, lengths, max_iter=2, strict=False)
    assert (truncated - tangent(step, lengths)).norm() > 10 * tangent(step, lengths).norm()
