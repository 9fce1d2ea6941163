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

import json
from pathlib import Path

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Arc
from matplotlib.textpath import TextPath

__all__ = ["heads_from_arcs", "depth", "format_tree", "tree_figure", "draw_tree"]


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


def _text_width(text: str, size: float, **font) -> float:
    """The rendered width of ``text`` in points at font size ``size`` (from its glyph outlines: no canvas needed)."""
    return TextPath((0, 0), text, size=size, prop=FontProperties(**font)).get_extents().width if text.strip() else 0.0


def tree_figure(tokens: list[str], heads: list[int], title: str = "") -> Figure:
    """The tree as arcs above the sentence (head → dependent, an arrowhead at the dependent, the root arcs from a
    ROOT mark at the left), on axes laid out in points: each word is placed by its rendered width, so no two words
    overlap however long they are; an arc's height grows with the number of words it spans (scaled down for long
    sentences). The words are the texts with ``gid`` ``token-<i>`` (0 = ROOT)."""
    if len(tokens) != len(heads):
        raise ValueError(f"{len(tokens)} tokens but {len(heads)} heads")
    depth(heads)  # validates
    size, gap = 10.0, 12.0
    words = ["ROOT", *tokens]
    widths = [_text_width("ROOT", size - 1, style="italic"), *(_text_width(t, size) for t in tokens)]
    centres = [widths[0] / 2]
    for left, right in zip(widths, widths[1:], strict=False):
        centres.append(centres[-1] + max(left / 2 + gap + right / 2, 24.0))  # 24 pt: room for an arrowhead
    span = max((abs(m - h) for m, h in enumerate(heads, start=1)), default=1)
    rise = min(16.0, 220.0 / span)  # points of height per word spanned
    base, top = 4.0, 20.0 + rise * span
    margin, below, title_room = 18.0, 20.0, 24.0 if title else 6.0
    x0, x1 = -margin, centres[-1] + widths[-1] / 2 + margin
    pad = max(0.0, 216.0 - (x1 - x0)) / 2  # at least 3 inches wide, the sentence centred
    fig = Figure(figsize=((x1 - x0 + 2 * pad) / 72, (top + below + title_room) / 72), dpi=150)
    ax = fig.add_axes((0, 0, 1, 1))  # 1 data unit = 1 point on both axes
    ax.set_xlim(x0 - pad, x1 + pad)
    ax.set_ylim(-below, top + title_room)
    for i, (word, x) in enumerate(zip(words, centres, strict=True)):
        style = {"style": "italic", "fontsize": size - 1} if i == 0 else {"fontsize": size}
        ax.text(x, 0, word, ha="center", va="top", gid=f"token-{i}", **style)
    for m, h in enumerate(heads, start=1):
        a = centres[h] + (5.0 if m > h else -5.0)  # arcs leave a head on the side of their dependent
        b, peak = centres[m], 14.0 + rise * abs(m - h)
        ax.add_patch(Arc(((a + b) / 2, base), abs(b - a), 2 * peak, theta1=0, theta2=180, linewidth=1.2,
                         color="tab:blue"))
        ax.annotate("", xy=(b, base), xytext=(b, base + 8), arrowprops={"arrowstyle": "-|>", "color": "tab:blue",
                                                                       "shrinkA": 0, "shrinkB": 0})
    ax.axis("off")
    if title:
        ax.text((x0 + x1) / 2, top + title_room - 4, title, ha="center", va="top", fontsize=9)
    return fig


def draw_tree(tokens: list[str], heads: list[int], out: str | Path, title: str = "") -> Path:
    """Draw :func:`tree_figure` into the PNG ``out``, and the tokens, heads and title beside it as
    ``<name>.data.json`` (``python -m latentstruct.report.figures redraw`` draws it again)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(tree_figure(tokens, heads, title)).print_png(str(out))
    data = {"figure": "dependency-tree", "title": title, "tokens": list(tokens), "heads": list(heads)}
    out.with_suffix(".data.json").write_text(json.dumps(data, ensure_ascii=False) + "\n")
    return out
