"""Dependency trees as head lists: conversion from the structures' arc layout, depth, text and pictures.

A tree over n words is a list ``heads`` of length n where ``heads[m - 1]`` is the head of word m (1-based words; head 0
is the root), the form :class:`~latentstruct.structures.ProjectiveDepTree` and
:class:`~latentstruct.structures.NonProjectiveDepTree` encode as a 0/1 arc matrix ``z[h, m]`` (``[n+1, n+1]``,
arc h → m). Used for the latent-tree statistics of seed 001 Appendix B (average depth of the MAP trees) and for
drawing them (its Figures 4-6).

    heads = heads_from_arcs(z, length)          # z: [n+1, n+1] from structure.map(...)[b]
    depth(heads)                                # 1 for a flat tree (every word attached to the root)
    print(format_tree(tokens, heads))
    draw_tree(tokens, heads, "tree.png")
"""

from __future__ import annotations

from pathlib import Path

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Arc

__all__ = ["heads_from_arcs", "depth", "format_tree", "draw_tree"]


def heads_from_arcs(z: torch.Tensor, length: int | None = None) -> list[int]:
    """The head list of a 0/1 arc matrix ``z`` ``[n+1, n+1]`` (``z[h, m]`` = arc h → m, row/column 0 the root),
    for its first ``length`` words (default all). Raises ValueError unless every word has exactly one head."""
    n = z.shape[-1] - 1 if length is None else length
    cols = z[: n + 1, 1 : n + 1]
    if not bool(((cols == 0) | (cols == 1)).all()) or not bool((cols.sum(0) == 1).all()):
        raise ValueError("z is not a tree's 0/1 arc matrix: every word needs exactly one head")
    return [int(h) for h in cols.argmax(0)]


def depth(heads: list[int]) -> int:
    """The number of arcs on the longest root-to-word path (0 for no words, 1 when every word hangs off the root).
    Raises ValueError on a cycle or a head outside 0..n."""
    n = len(heads)
    if any(not 0 <= h <= n for h in heads):
        raise ValueError(f"heads must be in 0..{n}, got {heads}")
    memo: dict[int, int] = {0: 0}

    def level(m: int) -> int:
        path = []
        while m not in memo:
            if m in path:
                raise ValueError(f"the heads {heads} contain a cycle")
            path.append(m)
            m = heads[m - 1]
        for node in reversed(path):
            memo[node] = memo[heads[node - 1]] + 1
        return memo[path[0]] if path else memo[m]

    return max((level(m) for m in range(1, n + 1)), default=0)


def format_tree(tokens: list[str], heads: list[int]) -> str:
    """An indented text rendering, children under their head in word order, e.g.::

        ROOT
        └── good (3)
            ├── It (1)
            └── 's (2)
    """
    if len(tokens) != len(heads):
        raise ValueError(f"{len(tokens)} tokens but {len(heads)} heads")
    depth(heads)  # validates
    children: dict[int, list[int]] = {h: [] for h in range(len(heads) + 1)}
    for m, h in enumerate(heads, start=1):
        children[h].append(m)
    lines = ["ROOT"]

    def walk(node: int, prefix: str) -> None:
        kids = children[node]
        for i, m in enumerate(kids):
            last = i == len(kids) - 1
            lines.append(f"{prefix}{'└── ' if last else '├── '}{tokens[m - 1]} ({m})")
            walk(m, prefix + ("    " if last else "│   "))

    walk(0, "")
    return "\n".join(lines)


def draw_tree(tokens: list[str], heads: list[int], out: str | Path, title: str = "") -> Path:
    """Draw the tree as arcs above the sentence (head → dependent, an arrowhead at the dependent, the root arcs
    from a ROOT mark at the left) into a PNG."""
    if len(tokens) != len(heads):
        raise ValueError(f"{len(tokens)} tokens but {len(heads)} heads")
    depth(heads)  # validates
    n = len(tokens)
    fig = Figure(figsize=(max(4.0, 0.9 * (n + 1)), 3.2))
    ax = fig.subplots()
    ax.text(0, 0, "ROOT", ha="center", va="top", fontsize=9, style="italic")
    for i, tok in enumerate(tokens, start=1):
        ax.text(i, 0, tok, ha="center", va="top", fontsize=10)
    top = 0.5
    for m, h in enumerate(heads, start=1):
        width = abs(m - h)
        height = 0.6 + 0.35 * width
        top = max(top, height / 2)
        ax.add_patch(Arc(((m + h) / 2, 0.15), width, height, theta1=0, theta2=180, linewidth=1.2,
                         color="tab:blue"))
        ax.annotate("", xy=(m, 0.15), xytext=(m, 0.35), arrowprops={"arrowstyle": "->", "color": "tab:blue"})
    ax.set_xlim(-0.7, n + 0.7)
    ax.set_ylim(-0.6, top + 0.4)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=9)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    FigureCanvasAgg(fig).print_png(str(out))
    return out
