"""The gradient microscope: how close is each estimator's gradient to the exact one?

``python -m latentstruct.diagnose`` (``make table-lab-gradients``) takes every estimator option of
``configs/estimator/`` as a run would build it, and every structure at a size small enough to enumerate its vertices
Z. For random scores s and a downstream loss L it compares the estimator's gradient g(s) w.r.t. the scores with the
exact gradient of the expected loss under the Gibbs distribution,

    g*(s) = ∇_s E_{z∼p(z|s)}[L(z)],   p(z|s) = exp<s, z> / Σ_{z'∈Z} exp<s, z'>,

computed by enumeration (float64, autograd through the sum over Z). Three losses: ``linear`` L(z) = <c, z>,
``quadratic`` L(z) = ½||z − t||², and ``mlp`` L(z) = softplus(w₂ᵀ tanh(W₁ vec z + b₁)), each with parameters drawn
once per structure. Per example and estimator, over D independent draws g_1..g_D (the estimator's own randomness):

- ``cosine``: the mean over draws of cos(g_d, g*) — how well one call points;
- ``cosine_of_mean``: cos(ḡ, g*) for the mean ḡ of the draws — the direction the estimator points on average;
- ``bias``: ||ḡ − g*|| / ||g*||, the relative bias of the mean gradient (with D draws, a variance/D share remains:
  an unbiased estimator shows ≈ sqrt(variance / D));
- ``variance``: mean_d ||g_d − ḡ||² / ||g*||², the relative variance of one call;
- ``ms``: the cost of one call (forward and backward, the batch of B examples), in milliseconds.

Each metric is the mean over the B examples. A deterministic estimator (STE, the SPIGOT family, SparseMAP,
marginals, blackbox: two draws agree) is called once; its variance is 0 by construction and its cosine says how far
its direction is from the expected-loss gradient, which it was never meant to estimate without bias. An estimator
that a structure cannot serve (no marginals for matchings, no exact sampler, a top-k-only relaxation) shows —.

The gradient is the one the optimizer would see for the batch-mean loss, times B (so per example), from
``estimator(s, structure, downstream=L)`` in training mode and ``L(z).mean()`` of its output.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch
from torch.nn import functional as F

from latentstruct.structures import (
    BinaryTree,
    Categorical,
    Matching,
    NonProjectiveDepTree,
    ProjectiveDepTree,
    SequenceTagging,
    Structure,
    TopK,
)

__all__ = ["STRUCTURES", "LOSSES", "estimator_options", "build_estimator", "exact_gradient", "measure", "run",
           "main"]

#: name -> (structure, size n, the parts' shape): every vertex set small enough to enumerate
STRUCTURES: dict[str, tuple[Structure, int, tuple[int, ...]]] = {
    "categorical": (Categorical(), 6, (6,)),
    "sequence": (SequenceTagging(3), 3, (3, 3, 3)),
    "binary_tree": (BinaryTree(), 5, (5, 5)),
    "projective": (ProjectiveDepTree(), 4, (5, 5)),
    "nonprojective": (NonProjectiveDepTree(), 4, (5, 5)),
    "matching": (Matching(), 4, (4, 4)),
    "topk": (TopK(2), 6, (6,)),
}
LOSSES = ("linear", "quadratic", "mlp")
#: options of configs/estimator/ that are not estimators of a structure's scores
_NOT_HERE = {"ppo": "drives a sequential policy, not a structure"}


def estimator_options() -> list[str]:
    """The estimator options of ``configs/estimator/`` (but those in ``_NOT_HERE``), sorted."""
    from latentstruct.config import CONFIG_DIR

    return sorted(p.stem for p in (CONFIG_DIR / "estimator").glob("*.yaml") if p.stem not in _NOT_HERE)


def build_estimator(option: str, *overrides: str) -> torch.nn.Module:
    """The estimator ``estimator=<option>`` builds in a run (the composed config's defaults)."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from latentstruct.config import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"estimator={option}", *overrides])
    return instantiate(cfg.estimator)


def make_loss(name: str, part_shape: tuple[int, ...], generator: torch.Generator) -> Callable[[torch.Tensor],
                                                                                              torch.Tensor]:
    """The downstream loss ``name`` for vertices of ``part_shape``: z ``[B, *part_shape]`` -> ``[B]``."""
    d = math.prod(part_shape)

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    if name == "linear":
        c = draw(d)
        return lambda z: z.flatten(1) @ c.to(z.dtype)
    if name == "quadratic":
        t = torch.rand(d, generator=generator, dtype=torch.float64)
        return lambda z: 0.5 * ((z.flatten(1) - t.to(z.dtype)) ** 2).sum(-1)
    if name == "mlp":
        w1, b1, w2 = draw(16, d) / math.sqrt(d), draw(16), draw(16) / 4
        return lambda z: F.softplus(torch.tanh(z.flatten(1) @ w1.T.to(z.dtype) + b1.to(z.dtype)) @ w2.to(z.dtype))
    raise ValueError(f"unknown loss {name!r}; choose one of {', '.join(LOSSES)}")


def exact_gradient(scores: torch.Tensor, vertices: torch.Tensor, loss: Callable) -> torch.Tensor:
    """∇_s E_{z∼p(z|s)}[L(z)] per example (``[B, *part_shape]``), by enumeration of the ``vertices`` ``[V, ...]``."""
    s = scores.detach().to(torch.float64).requires_grad_(True)
    v = vertices.to(torch.float64)
    logits = torch.einsum("bp,vp->bv", s.flatten(1), v.flatten(1))
    expected = (logits.softmax(-1) * loss(v)).sum()  # L(v) [V], the same for every example
    (grad,) = torch.autograd.grad(expected, s)
    return grad


def _estimator_gradient(estimator, structure, scores, loss) -> torch.Tensor:
    s = scores.detach().clone().requires_grad_(True)
    z = estimator(s, structure, None, loss)
    (grad,) = torch.autograd.grad(loss(z).mean(), s, allow_unused=True)
    if grad is None:  # the output does not depend on the scores: no gradient reaches them
        grad = torch.zeros_like(s)
    return grad * s.shape[0]


@dataclass
class Measurement:
    estimator: str
    structure: str
    loss: str
    cosine: float
    cosine_of_mean: float
    bias: float
    variance: float
    ms: float
    draws: int
    deterministic: bool


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """cos(a_b, b_b) per example: a ``[..., B, *parts]`` against b ``[B, *parts]`` -> ``[..., B]``."""
    batch, parts = b.shape[0], b[0].numel()
    return F.cosine_similarity(a.reshape(-1, batch, parts), b.reshape(batch, parts), dim=-1, eps=1e-12)


def measure(option: str, estimator, structure_name: str, loss_name: str, batch: int, draws: int,
            seed: int) -> Measurement | str:
    """One cell: the metrics (module docstring) of ``estimator`` on a structure and loss, or why it cannot run."""
    structure, n, part_shape = STRUCTURES[structure_name]
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, *part_shape, generator=gen, dtype=torch.float64)
    loss = make_loss(loss_name, part_shape, gen)
    exact = exact_gradient(scores, structure.enumerate(n), loss)
    torch.manual_seed(seed)
    estimator.train()
    try:
        start = time.perf_counter()
        first = _estimator_gradient(estimator, structure, scores, loss)
        second = _estimator_gradient(estimator, structure, scores, loss)
        ms = (time.perf_counter() - start) / 2 * 1000
    except (NotImplementedError, ValueError, RuntimeError, TypeError) as err:
        return f"{type(err).__name__}: {' '.join(str(err).split())[:120]}"
    deterministic = torch.equal(first, second)
    grads = [first] if deterministic else [first, second]
    if not deterministic:
        start = time.perf_counter()
        grads += [_estimator_gradient(estimator, structure, scores, loss) for _ in range(draws - 2)]
        ms = (time.perf_counter() - start) / max(draws - 2, 1) * 1000 if draws > 2 else ms
    g = torch.stack(grads)  # [D, B, ...]
    mean = g.mean(0)
    norm2 = exact.flatten(1).pow(2).sum(-1).clamp_min(1e-300)
    return Measurement(
        option, structure_name, loss_name,
        cosine=float(_cos(g, exact).mean()),
        cosine_of_mean=float(_cos(mean, exact).mean()),
        bias=float(((mean - exact).flatten(1).pow(2).sum(-1) / norm2).sqrt().mean()),
        variance=float(((g - mean).flatten(2).pow(2).sum(-1).mean(0) / norm2).mean()),
        ms=ms, draws=len(grads), deterministic=deterministic,
    )


def run(options: list[str], structures: list[str], losses: list[str], batch: int, draws: int, seed: int,
        log=print) -> tuple[pd.DataFrame, dict[tuple[str, str], str]]:
    """Every cell; the measurements as a frame, and the (estimator, structure) pairs that could not run, with why."""
    rows, skipped = [], {}
    for option in options:
        estimator = build_estimator(option)
        for structure_name in structures:
            for loss_name in losses:
                got = measure(option, estimator, structure_name, loss_name, batch, draws, seed)
                if isinstance(got, str):
                    skipped[option, structure_name] = got
                    break
                rows.append(vars(got))
        log(f"{option}: {sum(r['estimator'] == option for r in rows)} cells")
    return pd.DataFrame(rows), skipped


def _grid(df: pd.DataFrame, metric: str, options: list[str], structures: list[str], fmt: str) -> list[str]:
    """A Markdown table, estimator rows × structure columns, of ``metric`` averaged over the losses."""
    mean = df.groupby(["estimator", "structure"])[metric].mean() if len(df) else pd.Series(dtype=float)
    lines = ["| estimator | " + " | ".join(structures) + " |", "|---" * (len(structures) + 1) + "|"]
    for option in options:
        cells = []
        for s in structures:
            if (option, s) in mean.index:
                cells.append(format(mean[option, s], fmt))
            else:
                cells.append("—")
        deterministic = len(df) and bool(df[df.estimator == option].deterministic.all())
        lines.append(f"| `{option}`{' (det.)' if deterministic else ''} | " + " | ".join(cells) + " |")
    return lines


def report(df: pd.DataFrame, skipped: dict, options: list[str], structures: list[str], args,
           seconds: float, env: dict) -> list[str]:
    """The Markdown of ``results/lab/gradients.md``; ``env``: :func:`latentstruct.records.environment` at the start
    (before the files are rewritten, which would make the tree look dirty)."""
    sizes = ", ".join(f"{s} n = {STRUCTURES[s][1]} ({len(STRUCTURES[s][0].enumerate(STRUCTURES[s][1]))} vertices)"
                      for s in structures)
    lines = [
        "# The gradient microscope: each estimator's gradient against the exact gradient of the expected loss",
        "",
        f"Written by `make table-lab-gradients` (`python -m latentstruct.diagnose --draws {args.draws} --batch "
        f"{args.batch} --seed {args.seed}`); the method is in `latentstruct/diagnose.py`'s docstring.",
        "",
        f"**Status:** {df.groupby(['estimator', 'structure']).ngroups if len(df) else 0} estimator × structure cells "
        f"measured against the exact gradient, {len(skipped)} not applicable (listed at the end).",
        "",
        f"- git commit: {env['git_commit']}{' (dirty)' if env['git_dirty'] else ''}; torch {env['torch']}; "
        f"hardware: CPU ({platform.machine()}); generated {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}"
        f" in {seconds / 60:.1f} min",
        f"- sizes: {sizes}",
        f"- protocol: B = {args.batch} random score vectors N(0, 1) per structure (seed {args.seed}), losses "
        f"{', '.join(LOSSES)} (parameters drawn once per structure), {args.draws} draws per stochastic estimator, "
        "1 call for a deterministic one (marked det.: two draws agreed); estimators as `estimator=<option>` builds "
        "them (the configs' defaults); each cell is the mean over the losses and the examples",
        "- a deterministic estimator's variance is 0 by construction: its cosine says how far its direction is from "
        "the expected-loss gradient, which it does not set out to estimate",
        "",
        "## Cosine of one call's gradient with the exact one (mean over draws)", "",
        *_grid(df, "cosine", options, structures, ".3f"),
        "", "## Cosine of the mean gradient (over the draws) with the exact one", "",
        *_grid(df, "cosine_of_mean", options, structures, ".3f"),
        "", "## Relative bias of the mean gradient, ‖ḡ − g*‖ / ‖g*‖", "",
        f"(with {args.draws} draws an unbiased estimator still shows about sqrt(variance / {args.draws}))", "",
        *_grid(df, "bias", options, structures, ".3g"),
        "", "## Relative variance of one call, E‖g − ḡ‖² / ‖g*‖²", "",
        *_grid(df, "variance", options, structures, ".3g"),
        "", f"## Cost of one call (forward and backward, batch of {args.batch}), ms", "",
        *_grid(df, "ms", options, structures, ".2f"),
        "", "## Not run", "",
    ]
    lines += [f"- `{o}` on {s}: {why}" for (o, s), why in sorted(skipped.items())]
    lines += [f"- `{o}`: {why}" for o, why in _NOT_HERE.items()]
    lines += ["", "The cells per loss are in `gradients.csv`; the figure `gradients.png` plots the cosine against the "
              "cost, a panel per structure."]
    return lines


def figure(df: pd.DataFrame, structures: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, len(structures))
    rows = math.ceil(len(structures) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    mean = df.groupby(["structure", "estimator"])[["cosine", "ms"]].mean().reset_index()
    for ax, s in zip(axes.flat, structures, strict=False):
        part = mean[mean.structure == s]
        ax.scatter(part.ms, part.cosine, s=14)
        for _, r in part.iterrows():
            ax.annotate(r.estimator, (r.ms, r.cosine), fontsize=6, xytext=(2, 2), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_ylim(min(-0.05, float(part.cosine.min()) - 0.05), 1.02)
        ax.set_title(s, fontsize=9)
        ax.set_xlabel("ms per call")
        ax.set_ylabel("cosine with the exact gradient")
        ax.axhline(0, color="0.8", lw=0.5)
    for ax in list(axes.flat)[len(structures):]:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latentstruct.diagnose", description=__doc__.split("\n\n")[0])
    parser.add_argument("--estimators", nargs="*", default=None, help="options of configs/estimator/ (default: all)")
    parser.add_argument("--structures", nargs="*", default=list(STRUCTURES), choices=list(STRUCTURES))
    parser.add_argument("--losses", nargs="*", default=list(LOSSES), choices=list(LOSSES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/lab/gradients.md"))
    args = parser.parse_args(argv)
    from latentstruct.records import environment

    env = environment(torch.device("cpu"))
    torch.set_num_threads(1)
    options = args.estimators or estimator_options()
    start = time.perf_counter()
    df, skipped = run(options, args.structures, args.losses, args.batch, args.draws, args.seed,
                      log=lambda m: print(m, file=sys.stderr, flush=True))
    seconds = time.perf_counter() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out.with_suffix(".csv"), index=False, float_format="%.6g")
    args.out.write_text("\n".join(report(df, skipped, options, args.structures, args, seconds, env)) + "\n")
    figure(df, args.structures, args.out.with_suffix(".png"))
    print(f"wrote {args.out}, {args.out.with_suffix('.csv')} and {args.out.with_suffix('.png')} ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
