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
- ``ms``: the cost of one call (forward and backward, the batch of B examples), in milliseconds: a deterministic
  estimator's second call (its first may import or build what later calls reuse), a stochastic one's mean over the
  draws after the first two.

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
from dataclasses import dataclass, field
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
#: the structures measured at real sizes too (issue #38), and those sizes
GROWN = ("sequence", "binary_tree", "projective", "nonprojective")
REAL_SIZES = (10, 30)
LOSSES = ("linear", "quadratic", "mlp")
#: estimators not run past the enumerable sizes, and why
_ENUMERATES = {"exact": "enumerates every vertex (thousands to astronomically many past the enumerable sizes)",
               "perturb_and_map": "the same estimator as st_gumbel (a subclass that changes nothing): measured once "
                                  "past the enumerable sizes"}


def part_shape(name: str, n: int) -> tuple[int, ...]:
    """The parts' shape of structure ``name`` (a key of :data:`STRUCTURES`) at size n."""
    return {"categorical": (n,), "sequence": (n, 3, 3), "binary_tree": (n, n), "projective": (n + 1, n + 1),
            "nonprojective": (n + 1, n + 1), "matching": (n, n), "topk": (n,)}[name]
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
    return instantiate(cfg.task.estimator)


def make_loss(name: str, part_shape: tuple[int, ...], generator: torch.Generator) -> Callable[[torch.Tensor],
                                                                                              torch.Tensor]:
    """The downstream loss ``name`` for vertices of ``part_shape``: z ``[B, *part_shape]`` -> ``[B]``. A loss that
    is linear on the vertices, L(z) = <c, z> + const there, carries c ``[P]`` as ``vertex_weights``."""
    d = math.prod(part_shape)

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    if name == "linear":
        c = draw(d)
        loss = lambda z: z.flatten(1) @ c.to(z.dtype)  # noqa: E731
        loss.vertex_weights = c
        return loss
    if name == "quadratic":  # on a vertex z_p² = z_p, so L(z) = <½ − t, z> + ½||t||²: linear on the vertices
        t = torch.rand(d, generator=generator, dtype=torch.float64)
        loss = lambda z: 0.5 * ((z.flatten(1) - t.to(z.dtype)) ** 2).sum(-1)  # noqa: E731
        loss.vertex_weights = 0.5 - t
        return loss
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


def marginal_gradient(scores: torch.Tensor, structure: Structure, c: torch.Tensor) -> torch.Tensor:
    """∇_s E[<c, z>] = J_μ(s)ᵀ c = Cov(z) c, the Jacobian-vector product of the marginals μ(s) (float64, autograd):
    exact at any size for a structure with marginals, for a loss linear on the vertices."""
    s = scores.detach().to(torch.float64).requires_grad_(True)
    mu = structure.marginals(s)
    (grad,) = torch.autograd.grad((mu.flatten(1) * c.to(mu.dtype)).sum(), s)
    return grad


def sampled_gradient(scores: torch.Tensor, structure: Structure, loss: Callable, samples: int, seed: int,
                     chunk: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    """A reference for ∇_s E[L(z)] when L is not linear and Z is too large to enumerate: the score-function
    identity ∇_s E[L] = E[(L(z) − b)(z − μ)] over ``samples`` exact draws z ~ p(z | s) (the structure's
    ``exact_sample``), b the leave-one-out mean of the other draws' losses (unbiased). Returns the estimate and its
    standard error per part, both ``[B, *part_shape]``."""
    gen = torch.Generator().manual_seed(seed)
    s = scores.detach().to(torch.float64)
    mu = structure.marginals(s)
    zs, losses = [], []
    for start in range(0, samples, chunk):
        z = structure.exact_sample(s, generator=gen, num_samples=min(chunk, samples - start)).to(torch.float64)
        zs.append(z)
        losses.append(torch.stack([loss(z_m) for z_m in z]))  # [M, B]
    z, ls = torch.cat(zs), torch.cat(losses)
    m = len(z)
    advantage = (ls - ls.mean(0)) * m / (m - 1)  # L_i minus the mean of the others' losses
    terms = advantage.view(m, -1, *([1] * (z.dim() - 2))) * (z - mu)
    return terms.mean(0), terms.std(0) / math.sqrt(m)


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
    n: int = 0  # the structure's size
    exact: str = "enumeration"  # how g* was computed: enumeration, marginals JVP, or a sampled reference
    reference_se: float = 0.0  # a sampled reference's relative standard error, ||s.e.|| / ||g*|| (mean over B)
    examples: dict = field(default_factory=dict, repr=False)  # per example: cosine, cosine_of_mean, bias, variance


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """cos(a_b, b_b) per example: a ``[..., B, *parts]`` against b ``[B, *parts]`` -> ``[..., B]``."""
    batch, parts = b.shape[0], b[0].numel()
    return F.cosine_similarity(a.reshape(-1, batch, parts), b.reshape(batch, parts), dim=-1, eps=1e-12)


#: sampled references, computed once per (structure, n, loss, batch, seed, samples) and shared by the estimators
_REFERENCES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def target(structure_name: str, n: int, loss_name: str, batch: int, seed: int, reference_samples: int = 10_000):
    """The cell's random scores ``[B, *parts]`` (N(0, 1), seed ``seed``), its loss, and the gradient g* of the
    expected loss with how it was computed and its relative s.e. per example ``[B]``: by enumeration at the
    :data:`STRUCTURES` size, else by :func:`marginal_gradient` for a loss linear on the vertices (exact), else by
    :func:`sampled_gradient` with ``reference_samples`` exact draws."""
    structure, base_n, base_shape = STRUCTURES[structure_name]
    shape = base_shape if n == base_n else part_shape(structure_name, n)
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, *shape, generator=gen, dtype=torch.float64)
    loss = make_loss(loss_name, shape, gen)
    if n == base_n:
        return scores, loss, exact_gradient(scores, structure.enumerate(n), loss), "enumeration", torch.zeros(batch)
    if hasattr(loss, "vertex_weights"):
        return scores, loss, marginal_gradient(scores, structure, loss.vertex_weights), "marginals JVP", \
            torch.zeros(batch)
    key = (structure_name, n, loss_name, batch, seed, reference_samples)
    if key not in _REFERENCES:
        _REFERENCES[key] = sampled_gradient(scores, structure, loss, reference_samples, seed + 1)
    ref, se = _REFERENCES[key]
    relative = se.flatten(1).norm(dim=-1) / ref.flatten(1).norm(dim=-1).clamp_min(1e-300)
    return scores, loss, ref, f"{reference_samples} exact samples", relative


def measure(option: str, estimator, structure_name: str, loss_name: str, batch: int, draws: int,
            seed: int, n: int | None = None, reference_samples: int = 10_000) -> Measurement | str:
    """One cell: the metrics (module docstring) of ``estimator`` on a structure (at its :data:`STRUCTURES` size, or
    at size ``n``) and loss, or why it cannot run."""
    structure, base_n, _ = STRUCTURES[structure_name]
    n = base_n if n is None else n
    if n != base_n and option in _ENUMERATES:
        return _ENUMERATES[option]
    try:
        scores, loss, exact, how, reference_se = target(structure_name, n, loss_name, batch, seed, reference_samples)
    except NotImplementedError as err:
        return f"no reference: {type(err).__name__}: {' '.join(str(err).split())[:100]}"
    torch.manual_seed(seed)
    estimator.train()
    try:
        first = _estimator_gradient(estimator, structure, scores, loss)  # untimed: a first call may import or build
        start = time.perf_counter()
        second = _estimator_gradient(estimator, structure, scores, loss)
        ms = (time.perf_counter() - start) * 1000
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
    examples = {
        "cosine": _cos(g, exact).mean(0),
        "cosine_of_mean": _cos(mean, exact)[0],
        "bias": ((mean - exact).flatten(1).pow(2).sum(-1) / norm2).sqrt(),
        "variance": (g - mean).flatten(2).pow(2).sum(-1).mean(0) / norm2,
    }
    return Measurement(
        option, structure_name, loss_name, **{k: float(v.mean()) for k, v in examples.items()},
        ms=ms, draws=len(grads), deterministic=deterministic, n=n, exact=how,
        reference_se=float(reference_se.mean()), examples={k: v.tolist() for k, v in examples.items()},
    )


#: the slowest estimators past enumeration (SparseMAP's active set grows with n), measured last there
_SLOW = ("sparsemap", "spigot", "spigot_ce")


def run(options: list[str], structures: list[str], losses: list[str], batch: int, draws: int, seed: int,
        log=print, sizes: dict[str, list[int]] | None = None, reference_samples: int = 10_000,
        real_draws: int | None = None, saved=None, enumerable: bool = True
        ) -> tuple[pd.DataFrame, dict[tuple[str, str], str]]:
    """Every cell; the measurements as a frame (a row per estimator, structure, size n and loss; the per-example
    values in the ``ex_<metric>`` columns), and the cells that could not run, with why, keyed (estimator, structure)
    at the :data:`STRUCTURES` sizes and (estimator, ``"<structure> n = <n>"``) at the ``sizes`` beyond them
    (``real_draws``: the draws there, default ``draws``). Every estimator at the enumerable sizes first, then at
    ``sizes``, the slowest (:data:`_SLOW`) last; ``saved(frame, skipped)`` is called after each estimator of each
    pass (so a run stopped part-way leaves what it measured); ``enumerable=False`` skips the first pass."""
    rows, skipped = [], {}

    def cells(option, estimator, structure_name, n):
        base_n = STRUCTURES[structure_name][1]
        for loss_name in losses:
            got = measure(option, estimator, structure_name, loss_name, batch,
                          draws if n == base_n else (real_draws or draws), seed, n, reference_samples)
            if isinstance(got, str):
                skipped[option, structure_name if n == base_n else f"{structure_name} n = {n}"] = got
                return
            row = vars(got).copy()
            row.update({f"ex_{k}": v for k, v in row.pop("examples").items()})
            rows.append(row)

    passes = [("enumerable sizes", options, lambda s: [STRUCTURES[s][1]])] if enumerable else []
    if sizes:
        passes.append(("real sizes", sorted(options, key=lambda o: o in _SLOW), lambda s: sizes.get(s, [])))
    for what, order, ns in passes:
        for option in order:
            estimator = build_estimator(option)
            for structure_name in structures:
                for n in ns(structure_name):
                    cells(option, estimator, structure_name, n)
            log(f"{what}: {option}: {sum(r['estimator'] == option for r in rows)} cells")
            if saved is not None:
                saved(pd.DataFrame(rows), skipped)
    return pd.DataFrame(rows), skipped


def _column(structure: str, n: int) -> str:
    """A measured cell's column: the structure at its :data:`STRUCTURES` size, ``"<structure> n = <n>"`` beyond."""
    return structure if n == STRUCTURES[structure][1] else f"{structure} n = {n}"


def _grid(df: pd.DataFrame, metric: str, options: list[str], columns: list[str], fmt: str,
          headers: list[str] | None = None) -> list[str]:
    """A Markdown table, estimator rows × ``columns`` (of :func:`_column`), of ``metric`` averaged over the losses
    and the examples."""
    if len(df):
        df = df.assign(column=[_column(s, n) for s, n in zip(df.structure, df.n, strict=True)])
        mean = df.groupby(["estimator", "column"])[metric].mean()
    else:
        mean = pd.Series(dtype=float)
    lines = ["| estimator | " + " | ".join(headers or columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for option in options:
        cells = [format(mean[option, c], fmt) if (option, c) in mean.index else "—" for c in columns]
        if all(c == "—" for c in cells) and headers:
            continue
        deterministic = len(df) and bool(df[df.estimator == option].deterministic.all())
        lines.append(f"| `{option}`{' (det.)' if deterministic else ''} | " + " | ".join(cells) + " |")
    return lines


def _with_excess_bias(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``excess_bias`` (and its per-example ``ex_excess_bias``): the relative bias less what D draws of an
    unbiased estimator show, sqrt(max(0, bias² − variance / (D − 1))) (E‖ḡ − g*‖² = ‖E g − g*‖² + tr Cov / D, and
    D/(D−1) · variance estimates tr Cov / ‖g*‖²); the bias itself for a deterministic estimator."""
    def excess(bias, variance, draws):
        return [math.sqrt(max(0.0, b * b - (v / (draws - 1) if draws > 1 else 0.0))) for b, v in
                zip(bias, variance, strict=True)]

    if not len(df):
        return df
    df = df.copy()
    df["ex_excess_bias"] = [excess(b, v, d) for b, v, d in zip(df.ex_bias, df.ex_variance, df.draws, strict=True)]
    df["excess_bias"] = [sum(v) / len(v) for v in df.ex_excess_bias]
    return df


def _examples(df: pd.DataFrame, option: str, structure: str, n: int, metric: str) -> list[float]:
    """The per-example values of ``metric`` of one estimator on a structure at size n, pooled over the losses."""
    part = df[(df.estimator == option) & (df.structure == structure) & (df.n == n)]
    return [v for values in part[f"ex_{metric}"] for v in values]


def size_findings(df: pd.DataFrame, options: list[str], sizes: dict[str, list[int]]) -> list[str]:
    """How each estimator's cosine, bias and variance change from the enumerable size to the largest of ``sizes``,
    per structure: a change counts when the medians over the examples (B per loss, the losses pooled) are more than
    twice their combined standard error (sample std / sqrt(count)) apart, the rule of the matrix's findings."""
    from latentstruct.report.tables import aggregate

    out = []
    df = _with_excess_bias(df)
    for metric, words in (("cosine", ("rises", "falls")), ("excess_bias", ("grows", "shrinks")),
                          ("variance", ("grows", "shrinks"))):
        counts = {words[0]: [], words[1]: [], "no clear change": []}
        for option in options:
            for structure, grown in sizes.items():
                if not grown:
                    continue
                small, large = STRUCTURES[structure][1], max(grown)
                a, b = _examples(df, option, structure, small, metric), _examples(df, option, structure, large, metric)
                if not a or not b:
                    continue
                (ma, sa), (mb, sb) = aggregate(a), aggregate(b)
                gap = mb - ma
                clear = abs(gap) > 2 * math.hypot(sa, sb)
                word = (words[0] if gap > 0 else words[1]) if clear else "no clear change"
                counts[word].append(f"`{option}` {structure} {ma:.3g} → {mb:.3g}")
        total = sum(map(len, counts.values()))
        if not total:
            continue
        label = {"excess_bias": "bias beyond the draws' noise"}.get(metric, metric)
        out.append(f"- **{label}** from the enumerable size to n = {max(max(v) for v in sizes.values() if v)}, "
                   f"{total} estimator × structure pairs: " + "; ".join(
                       f"{word} on {len(pairs)}" for word, pairs in counts.items()) + ".")
        for word, pairs in counts.items():
            if pairs and word != "no clear change":
                out.append(f"  - {word}: " + ", ".join(pairs))
    return out


def report(df: pd.DataFrame, skipped: dict, options: list[str], structures: list[str], args,
           seconds: float, env: dict, sizes: dict[str, list[int]] | None = None) -> list[str]:
    """The Markdown of ``results/lab/gradients.md``; ``env``: :func:`latentstruct.records.environment` at the start
    (before the files are rewritten, which would make the tree look dirty); ``sizes``: the sizes measured beyond
    the enumerable ones, per structure."""
    sizes = {s: v for s, v in (sizes or {}).items() if v and s in structures}
    base = df[[n == STRUCTURES[s][1] for s, n in zip(df.structure, df.n, strict=True)]] if len(df) else df
    listed = ", ".join(f"{s} n = {STRUCTURES[s][1]} ({len(STRUCTURES[s][0].enumerate(STRUCTURES[s][1]))} vertices)"
                       for s in structures)
    command = (f"python -m latentstruct.diagnose --draws {args.draws} --batch {args.batch} --seed {args.seed}"
               + (f" --sizes {' '.join(map(str, args.sizes))} --real-draws {args.real_draws} --reference-samples "
                  f"{args.reference_samples}" if sizes else " --sizes"))
    cells = df.groupby(["estimator", "structure", "n"]).ngroups if len(df) else 0
    lines = [
        "# The gradient microscope: each estimator's gradient against the exact gradient of the expected loss",
        "",
        f"Written by `make table-lab-gradients` (`{command}`); the method is in `latentstruct/diagnose.py`'s "
        "docstring.",
        "",
        f"**Status:** {cells} estimator × structure × size cells measured against the exact gradient (or, for the "
        f"nonlinear loss past the enumerable sizes, a sampled reference with its standard error), {len(skipped)} "
        "not applicable (listed at the end).",
        "",
        f"- git commit: {env['git_commit']}{' (dirty)' if env['git_dirty'] else ''}; torch {env['torch']}; "
        f"hardware: CPU ({platform.machine()}, one thread; the machine's 2 cores shared with other work); generated "
        f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} in {seconds / 60:.1f} min",
        f"- sizes: {listed}",
        f"- protocol: B = {args.batch} random score vectors N(0, 1) per structure (seed {args.seed}), losses "
        f"{', '.join(LOSSES)} (parameters drawn once per structure), {args.draws} draws per stochastic estimator, "
        "1 call for a deterministic one (marked det.: two draws agreed); estimators as `estimator=<option>` builds "
        "them (the configs' defaults); each cell is the mean over the losses and the examples",
        "- a deterministic estimator's variance is 0 by construction: its cosine says how far its direction is from "
        "the expected-loss gradient, which it does not set out to estimate",
        "",
        "## Cosine of one call's gradient with the exact one (mean over draws)", "",
        *_grid(base, "cosine", options, structures, ".3f"),
        "", "## Cosine of the mean gradient (over the draws) with the exact one", "",
        *_grid(base, "cosine_of_mean", options, structures, ".3f"),
        "", "## Relative bias of the mean gradient, ‖ḡ − g*‖ / ‖g*‖", "",
        f"(with {args.draws} draws an unbiased estimator still shows about sqrt(variance / {args.draws}))", "",
        *_grid(base, "bias", options, structures, ".3g"),
        "", "## Relative variance of one call, E‖g − ḡ‖² / ‖g*‖²", "",
        *_grid(base, "variance", options, structures, ".3g"),
        "", f"## Cost of one call (forward and backward, batch of {args.batch}), ms", "",
        *_grid(base, "ms", options, structures, ".2f"),
    ]
    if sizes:
        columns = [_column(s, n) for s in sizes for n in [STRUCTURES[s][1], *sizes[s]]]
        headers = [f"{s} n={n}" for s in sizes for n in [STRUCTURES[s][1], *sizes[s]]]
        grown = df[df.n > [STRUCTURES[s][1] for s in df.structure]] if len(df) else df
        se = (grown[grown.loss == "mlp"].groupby(["structure", "n"]).reference_se.mean() if len(grown)
              else pd.Series(dtype=float))
        lines += [
            "", "## At real sizes: n = " + ", ".join(str(n) for n in sorted({n for v in sizes.values() for n in v})),
            "",
            "Each column is a structure at a size n (the first at its enumerable size, as above). Past enumeration the "
            "exact gradient of a loss linear on the vertices is the Jacobian-vector product of the marginals, "
            "∇_s E[<c, z>] = Cov(z) c (the linear loss, and the quadratic one, which is linear on 0/1 vertices: "
            "½‖z − t‖² = <½ − t, z> + const); the mlp loss is measured against a reference of "
            f"{args.reference_samples} exact samples (the score-function identity with a leave-one-out baseline), "
            "whose relative standard error ‖s.e.‖ / ‖g*‖ (mean over the examples) is "
            + ", ".join(f"{s} {n}: {v:.3f}" for (s, n), v in se.items())
            + f": a floor under the mlp loss's bias at those sizes. Stochastic estimators take {args.real_draws} "
            "draws there. Columns: structure and n.",
            "", "### Cosine of one call's gradient with the exact one", "",
            *_grid(df, "cosine", options, columns, ".3f", headers),
            "", "### Cosine of the mean gradient with the exact one", "",
            *_grid(df, "cosine_of_mean", options, columns, ".3f", headers),
            "", "### Relative bias of the mean gradient", "",
            f"(with {args.real_draws} draws past enumeration, against {args.draws} at the enumerable sizes, an "
            "unbiased estimator shows about sqrt(variance / draws): compare the next table)", "",
            *_grid(df, "bias", options, columns, ".3g", headers),
            "", "### Bias beyond the draws' noise, sqrt(max(0, bias² − variance / (D − 1)))", "",
            "(D draws: the squared bias of the mean of D draws is the estimator's squared bias plus its variance "
            "over D; this removes the second term, so sizes measured with different D compare; for the mlp loss "
            "past enumeration the reference's own error, given above, remains)", "",
            *_grid(_with_excess_bias(df), "excess_bias", options, columns, ".3g", headers),
            "", "### Relative variance of one call", "",
            *_grid(df, "variance", options, columns, ".3g", headers),
            "", f"### Cost of one call (batch of {args.batch}), ms", "",
            *_grid(df, "ms", options, columns, ".2f", headers),
            "", "### Findings: how the gradients change with n", "",
            "A change counts when the medians over the examples (B per loss, the three losses pooled) at the "
            "enumerable size and at the largest n are more than twice their combined standard error apart (sample "
            "std / sqrt(count), the rule of `matrix.md`'s findings). The bias compared is the bias beyond the "
            "draws' noise (the table above), since the draws differ between the sizes. Deterministic estimators "
            "have variance 0 at every size (counted as no change).", "",
            *size_findings(df, options, sizes),
        ]
    lines += ["", "## Not run", ""]
    lines += [f"- `{o}` on {s}: {why}" for (o, s), why in sorted(skipped.items())]
    lines += [f"- `{o}`: {why}" for o, why in _NOT_HERE.items()]
    lines += ["", "The cells per loss are in `gradients.csv` (the per-example values in its `ex_` columns); the figure "
              "`gradients.png` plots the cosine against the cost, a panel per structure (enumerable sizes)."]
    return lines


def _label_points(ax, part: pd.DataFrame) -> None:
    """Each point's estimator name beside it, at the first of a few offsets (right, left, below, above) where it
    overlaps no label placed before (display coordinates); points at the same place share one label ("a = b")."""
    groups: dict[tuple[float, float], list[str]] = {}
    for r in part.itertuples():
        groups.setdefault((round(float(r.ms), 6), round(float(r.cosine), 6)), []).append(r.estimator)
    placed: list[tuple[float, float, float, float]] = []
    for (ms, cos), names in sorted(groups.items(), key=lambda kv: -kv[0][1]):
        text = " = ".join(sorted(names))
        x, y = ax.transData.transform((ms, cos))
        width, height = 3.4 * len(text), 7.0  # fontsize 6, in points ~ pixels at the figure's 100 dpi
        for dx, dy in ((3, 2), (-3 - width, 2), (3, -9), (-3 - width, -9), (3, 10), (-3 - width, 10), (3, -17)):
            box = (x + dx, y + dy, x + dx + width, y + dy + height)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in placed):
                break
        placed.append(box)
        ax.annotate(text, (ms, cos), fontsize=6, xytext=(dx, dy), textcoords="offset points")


def figure(df: pd.DataFrame, structures: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401

    cols = min(4, len(structures))
    rows = math.ceil(len(structures) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    mean = df.groupby(["structure", "estimator"])[["cosine", "ms"]].mean().reset_index()
    for ax, s in zip(axes.flat, structures, strict=False):
        part = mean[mean.structure == s]
        ax.scatter(part.ms, part.cosine, s=14)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # no crowded labels between decades
        ax.set_ylim(min(-0.05, float(part.cosine.min()) - 0.05), 1.02)
        ax.autoscale_view()
        _label_points(ax, part)
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
    parser.add_argument("--sizes", type=int, nargs="*", default=[],
                        help=f"sizes n past enumeration for {', '.join(GROWN)} "
                             f"(make: {' '.join(map(str, REAL_SIZES))})")
    parser.add_argument("--real-draws", type=int, default=20, help="draws per stochastic estimator at those sizes")
    parser.add_argument("--reference-samples", type=int, default=2000,
                        help="exact samples of the nonlinear loss's reference at those sizes")
    parser.add_argument("--out", type=Path, default=Path("results/lab/gradients.md"))
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite the page from the .csv and .json beside it (a finished or stopped run's)")
    parser.add_argument("--real-only", action="store_true",
                        help="measure the --sizes only (a run that shares the work of another; see --merge)")
    parser.add_argument("--merge", type=Path, nargs="*", default=[],
                        help="with --report-only: the pages (.md paths) of --real-only runs whose .csv and .json "
                             "to add (cells already measured are kept from the first)")
    args = parser.parse_args(argv)
    import json

    from latentstruct.records import environment

    sidecar = args.out.with_suffix(".json")
    if args.report_only:
        saved = json.loads(sidecar.read_text())
        for key in ("estimators", "structures", "losses", "batch", "draws", "seed", "sizes", "real_draws",
                    "reference_samples"):
            setattr(args, key, saved["args"][key])
        df = pd.read_csv(args.out.with_suffix(".csv"))
        for column in [c for c in df if c.startswith("ex_")]:
            df[column] = [[float(v) for v in str(text).split()] for text in df[column]]
        skipped = {(o, s): why for o, s, why in saved["skipped"]}
        finished, seconds, options = saved["finished"], saved["seconds"], list(saved["options"])
        for other in args.merge:
            extra = json.loads(other.with_suffix(".json").read_text())
            more = pd.read_csv(other.with_suffix(".csv"))
            for column in [c for c in more if c.startswith("ex_")]:
                more[column] = [[float(v) for v in str(text).split()] for text in more[column]]
            df = pd.concat([df, more]).drop_duplicates(["estimator", "structure", "n", "loss"], keep="first")
            skipped.update({(o, s): why for o, s, why in extra["skipped"] if (o, s) not in skipped})
            finished, seconds = finished and extra["finished"], max(seconds, extra["seconds"])
            options += [o for o in extra["options"] if o not in options]
        df = df.reset_index(drop=True)
        if args.merge:  # the records hold the merged cells from now on: --report-only alone rebuilds the page
            table = df.copy()
            for column in [c for c in df if c.startswith("ex_")]:
                table[column] = [" ".join(f"{v:.6g}" for v in values) for values in df[column]]
            table.to_csv(args.out.with_suffix(".csv"), index=False, float_format="%.6g")
            saved.update(options=options, skipped=[[o, s, why] for (o, s), why in sorted(skipped.items())],
                         seconds=seconds, finished=finished, merged=True)
            sidecar.write_text(json.dumps(saved, indent=1, default=str) + "\n")
        args.merge = args.merge or saved.get("merged", False)
        _write(df, skipped, options, args, seconds, saved["env"], finished)
        return 0
    env = environment(torch.device("cpu"))
    torch.set_num_threads(1)
    options = args.estimators or estimator_options()
    start = time.perf_counter()
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save(df, skipped, finished=False):
        table = df.copy()
        for column in [c for c in df if c.startswith("ex_")]:
            table[column] = [" ".join(f"{v:.6g}" for v in values) for values in df[column]]
        table.to_csv(args.out.with_suffix(".csv"), index=False, float_format="%.6g")
        sidecar.write_text(json.dumps({
            "args": {k: v for k, v in vars(args).items() if k not in ("out", "report_only")}, "options": options,
            "skipped": [[o, s, why] for (o, s), why in sorted(skipped.items())], "env": env,
            "seconds": time.perf_counter() - start, "finished": finished}, indent=1, default=str) + "\n")

    df, skipped = run(options, args.structures, args.losses, args.batch, args.draws, args.seed,
                      log=lambda m: print(f"{m} ({(time.perf_counter() - start) / 60:.1f} min)", file=sys.stderr,
                                          flush=True),
                      sizes=_sizes(args), reference_samples=args.reference_samples, real_draws=args.real_draws,
                      saved=save, enumerable=not args.real_only)
    save(df, skipped, finished=True)
    _write(df, skipped, options, args, time.perf_counter() - start, env, True)
    return 0


def _sizes(args) -> dict[str, list[int]]:
    return {s: list(args.sizes) for s in GROWN if s in args.structures and args.sizes}


def _write(df, skipped, options, args, seconds, env, finished: bool) -> None:
    """The page and the figure from the measurements (``finished``: False for a run stopped part-way)."""
    sizes = _sizes(args)
    lines = report(df, skipped, options, args.structures, args, seconds, env, sizes)
    if args.merge:
        lines[4] += (" Measured in parts: this run and the `--real-only` run(s) merged into it (`--merge`), the work "
                     "shared between processes; each part's cells are its own, none measured twice.")
    if not finished:
        measured = set(df.estimator[df.n > [STRUCTURES[s][1] for s in df.structure]]) if len(df) else set()
        not_applicable = {o for o, where in skipped if " n = " in where}
        missing = [o for o in options if o not in measured and o not in _ENUMERATES and o not in not_applicable]
        if missing:
            lines[4] += (" **Stopped part-way** (the CPU time budget): past the enumerable sizes "
                         f"{', '.join(f'`{o}`' for o in missing)} not measured.")
    args.out.write_text("\n".join(lines) + "\n")
    base = df[[n == STRUCTURES[s][1] for s, n in zip(df.structure, df.n, strict=True)]] if len(df) else df
    figure(base, args.structures, args.out.with_suffix(".png"))
    print(f"wrote {args.out}, {args.out.with_suffix('.csv')}, .json and .png ({seconds:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
