"""scripts/spigot_ce_probe.py: T is the projection onto the tree polytope's affine hull, and for a small step from the
marginals (inside the polytope) it is what the exact SparseMAP projection returns."""

from __future__ import annotations

import torch

from latentstruct.structures import ProjectiveDepTree
from latentstruct.structures.sparsemap import sparsemap
from scripts.spigot_ce_probe import _page, hull, tangent


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


def test_the_ablation_page_shows_every_row_every_probe_batch_and_the_hull():
    row = {"row": "interior", "seeds": [301, 302], "commits": ["c361fb2222ba"], "last train/loss": [0.29, 0.26],
           "wall_seconds": [1254, 1270]}
    for metric, values in (("valid/acc", [77.75, 76.25]), ("test/acc", [79.0, 78.0]), ("test/depth", [])):
        row.update({metric: values, f"{metric} mean": sum(values) / max(len(values), 1), f"{metric} sd": 0.5})
    batch = {"||eta*gamma||": 3e-4, "||T(eta*gamma)||": 1.7e-4, "||g||": 0.53, "cos(g,T)": -0.003,
             "cos(g,g0)": 0.96, "g_gap": 0.2, "g_support": 47.0, "cos(g500,T)": 0.52, "g500_gap": 3e-4}
    page = _page({"commit": "c361fb2222ba" + "0" * 28, "args": "embedding.freeze=false", "rows": [row],
                  "other_latent_test_means": [78.2, 80.63], "probe": [batch, batch],
                  "hull": [{"n": 3, "trees": 12, "arcs": 9, "affine_dim": 6, "arcs_minus_n": 6}]})
    assert "| interior | 301, 302 | 77.00 ± 0.50 (77.75 / 76.25) | 78.50 ± 0.50 (79.00 / 78.00) | – |" in page
    assert page.count("| -0.003 | 0.960 |") == 2 and "| 3 | 12 | 9 | 6 | 6 |" in page
    assert "2 runs (commits recorded: c361fb2222ba)" in page and "78.20-80.63" in page
