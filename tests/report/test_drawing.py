"""Head lists from arc matrices, tree depth, text and pictures (latentstruct/report/drawing.py)."""

import pytest
import torch

from latentstruct.report.drawing import depth, draw_tree, format_tree, heads_from_arcs
from latentstruct.structures import NonProjectiveDepTree, ProjectiveDepTree


def _arcs(heads: list[int], pad: int = 0) -> torch.Tensor:
    n = len(heads) + pad
    z = torch.zeros(n + 1, n + 1)
    for m, h in enumerate(heads, start=1):
        z[h, m] = 1
    return z


def test_heads_round_trip_and_padding():
    heads = [2, 0, 2, 3]
    assert heads_from_arcs(_arcs(heads)) == heads
    assert heads_from_arcs(_arcs(heads, pad=2), length=4) == heads
    with pytest.raises(ValueError, match="exactly one head"):
        heads_from_arcs(_arcs(heads) * 0.5)


@pytest.mark.parametrize("structure", [ProjectiveDepTree(multiroot=True), NonProjectiveDepTree(multiroot=False)])
def test_every_map_tree_converts(structure):
    torch.manual_seed(0)
    scores = torch.randn(3, 6, 6)
    lengths = torch.tensor([5, 3, 4])
    z = structure.map(scores, lengths)
    for b in range(3):
        heads = heads_from_arcs(z[b], int(lengths[b]))
        assert len(heads) == lengths[b] and depth(heads) >= 1


@pytest.mark.parametrize("heads, expected", [([], 0), ([0, 0, 0], 1), ([2, 0, 2, 3], 3), ([0, 1, 2, 3, 4], 5)])
def test_depth(heads, expected):
    assert depth(heads) == expected


def test_depth_refuses_cycles_and_bad_heads():
    with pytest.raises(ValueError, match="cycle"):
        depth([2, 1, 0])
    with pytest.raises(ValueError, match="0..2"):
        depth([0, 3])


def test_format_and_draw(tmp_path):
    tokens, heads = ["It", "'s", "good"], [3, 3, 0]
    assert format_tree(tokens, heads) == "ROOT\n└── good (3)\n    ├── It (1)\n    └── 's (2)"
    png = draw_tree(tokens, heads, tmp_path / "t.png", title="MAP tree")
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="heads"):
        format_tree(tokens, [0, 0])
