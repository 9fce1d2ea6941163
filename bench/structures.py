"""Benchmark: latentstruct's structures next to the libraries people use today, measured in the same process.

    python bench/structures.py --out results/bench/structures.md [--device cuda] [--sizes 10 30 60] [--batch 32]

For every structure and operation — ``map``, ``marginals``, ``marginals+backward`` (the marginals, then a backward
pass of <μ, g> through them: a second derivative of the log-partition) and ``sparsemap+backward`` — it reports the
median wall time over repetitions at batch 32 and n ∈ {10, 30, 60}, and, where a reference implementation exists,
its time on the same inputs and the ratio ours/theirs:

* projective trees — SuPar ``DependencyCRF`` (Eisner; ``argmax``, ``marginals``), ``multiroot=True``;
* non-projective trees — SuPar ``MatrixTree`` (Chu-Liu-Edmonds ``argmax``, Matrix-Tree ``marginals``);
* sequence tagging — torch-struct ``LinearChainCRF`` (our layout converted to its edge potentials);
* binary trees — torch-struct ``TreeCRF`` with one nonterminal, if it runs.

The references come from ``pip install --no-deps supar nltk dill regex torch-struct`` into a separate folder on
PYTHONPATH (``make bench-structures`` does this): they are never dependencies of latentstruct. A missing or failing
reference is reported as such. Before timing, each reference is checked to compute the same thing as ours (the
largest absolute difference of the log-partition or the marginals is printed in the table's notes).

All examples have full length (no padding). Scores are i.i.d. N(0, 1); the SparseMAP solver's work depends on the
scale of the scores (how many vertices the solution mixes), so its iteration count is reported too.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from latentstruct.records import environment
from latentstruct.structures import (
    BinaryTree,
    Matching,
    NonProjectiveDepTree,
    ProjectiveDepTree,
    SequenceTagging,
    TopK,
)
from latentstruct.structures.sparsemap import sparsemap_active_set

NUM_TAGS = 17  # BIOES over the four CoNLL-2003 entity types, as in the NER task
TOP_K = 5


# ---------------------------------------------------------------------------------------------------------- timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn, device: torch.device, budget_s: float = 1.0, min_reps: int = 3, max_reps: int = 25) -> float:
    """Median wall time of ``fn()`` in milliseconds over ≥ ``min_reps`` repetitions, within about ``budget_s``.

    The first call is a warm-up, except for calls slower than the budget (SparseMAP at n = 60 takes seconds), where
    warm-up effects are negligible: it then counts as the first of ``min_reps`` repetitions.
    """
    times: list[float] = []
    t0 = time.perf_counter()
    fn()
    _sync(device)
    first = time.perf_counter() - t0
    if first > budget_s:
        times.append(first)
    start = time.perf_counter()
    while len(times) < min_reps or (len(times) < max_reps and time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


# ------------------------------------------------------------------------------------------------ our operations


def _with_backward(forward, scores, direction):
    def run():
        x = scores.detach().clone().requires_grad_(True)
        (forward(x) * direction).sum().backward()

    return run


def our_ops(structure, scores) -> dict:
    direction = torch.randn_like(scores)
    ops = {"map": lambda: structure.map(scores)}
    try:
        structure.marginals(scores[:1])
    except NotImplementedError:
        pass  # Matching: #P-hard
    else:
        ops["marginals"] = lambda: structure.marginals(scores)
        ops["marginals+backward"] = _with_backward(structure.marginals, scores, direction)
    ops["sparsemap+backward"] = _with_backward(structure.sparsemap, scores, direction)
    return ops


# ---------------------------------------------------------------------------------------------- reference adapters


def _dependency_reference(cls_name: str, structure):
    """SuPar's DependencyCRF / MatrixTree. SuPar indexes scores [batch, modifier, head]: ours transposed."""
    from supar.structs import DependencyCRF, MatrixTree

    cls = {"DependencyCRF": DependencyCRF, "MatrixTree": MatrixTree}[cls_name]

    def dist(s):
        lens = torch.full((s.shape[0],), s.shape[-1] - 1, dtype=torch.long, device=s.device)
        # A copy: SuPar's MatrixTree.argmax edits its scores in place (it would corrupt the shared inputs).
        return cls(s.transpose(1, 2).clone(), lens, multiroot=True)

    def check(scores):
        theirs = dist(scores.double()).marginals.transpose(1, 2)
        return (theirs - structure.marginals(scores.double())).abs().max().item()

    def ops(scores):
        direction = torch.randn_like(scores)
        return {
            "map": lambda: dist(scores).argmax,
            "marginals": lambda: dist(scores).marginals,
            "marginals+backward": _with_backward(lambda x: dist(x).marginals.transpose(1, 2), scores, direction),
        }

    return f"SuPar {cls_name}", check, ops


def _to_linear_chain(scores: torch.Tensor) -> torch.Tensor:
    """Our [B, n, T, T] (scores[b, i, s, t]: tag s at i-1, t at i; start in row 0 of position 0) → torch-struct's
    edge potentials [B, n-1, T, T] with edge[b, i-1, t, s] for the tags (s at i-1, t at i), the start folded in."""
    edge = scores[:, 1:].transpose(-1, -2).clone()
    edge[:, 0] = edge[:, 0] + scores[:, 0, 0].unsqueeze(-2)
    return edge


def _sequence_reference(structure):
    from torch_struct import LinearChainCRF

    def check(scores):
        theirs = LinearChainCRF(_to_linear_chain(scores.double())).partition
        return (theirs - structure.log_partition(scores.double())).abs().max().item()

    def ops(scores):
        direction = torch.randn(scores.shape[0], scores.shape[1] - 1, *scores.shape[2:], dtype=scores.dtype)
        edge = _to_linear_chain(scores)
        return {
            "map": lambda: LinearChainCRF(edge).argmax,
            "marginals": lambda: LinearChainCRF(edge).marginals,
            "marginals+backward": _with_backward(lambda x: LinearChainCRF(x).marginals, edge, direction),
        }

    return "torch-struct LinearChainCRF", check, ops


def _binary_tree_reference(structure):
    from torch_struct import TreeCRF

    def dist(s):
        return TreeCRF(s.unsqueeze(-1))  # one nonterminal; torch-struct's spans include the single leaves

    def check(scores):
        theirs = dist(scores.double()).partition
        ours = structure.log_partition(scores.double()) + scores.double().diagonal(dim1=1, dim2=2).sum(-1)
        return (theirs - ours).abs().max().item()

    def ops(scores):
        direction = torch.randn_like(scores)
        return {
            "map": lambda: dist(scores).argmax,
            "marginals": lambda: dist(scores).marginals,
            "marginals+backward": _with_backward(lambda x: dist(x).marginals.squeeze(-1), scores, direction),
        }

    return "torch-struct TreeCRF", check, ops


# -------------------------------------------------------------------------------------------------------- the suite


def suite():
    """(name, structure, scores shape for (batch, n), reference factory or None)."""
    return [
        (
            "projective",
            ProjectiveDepTree(),
            lambda b, n: (b, n + 1, n + 1),
            lambda s: _dependency_reference("DependencyCRF", s),
        ),
        (
            "nonprojective",
            NonProjectiveDepTree(),
            lambda b, n: (b, n + 1, n + 1),
            lambda s: _dependency_reference("MatrixTree", s),
        ),
        (
            f"sequence (T = {NUM_TAGS})",
            SequenceTagging(NUM_TAGS),
            lambda b, n: (b, n, NUM_TAGS, NUM_TAGS),
            _sequence_reference,
        ),
        ("binary_tree", BinaryTree(), lambda b, n: (b, n, n), _binary_tree_reference),
        ("matching", Matching(), lambda b, n: (b, n, n), None),
        (f"topk (k = {TOP_K})", TopK(TOP_K), lambda b, n: (b, n), None),
    ]


def run(sizes, batch, device, only=None, log=print):
    rows, notes = [], []
    for name, structure, shape, reference in suite():
        if only and not any(name.startswith(o) for o in only):
            continue
        ref = None
        if reference is not None:
            try:
                ref_name, check, ref_ops = reference(structure)
                diff = check(torch.randn(*shape(2, 6), dtype=torch.float64, device=device))
                notes.append(f"{name}: {ref_name} agrees with ours to {diff:.1e} (float64, n = 6).")
                ref = (ref_name, ref_ops)
            except Exception as err:  # noqa: BLE001 — a broken reference is a result to report, not a crash
                notes.append(f"{name}: reference unavailable ({type(err).__name__}: {err}).")
        for n in sizes:
            gen = torch.Generator(device=device).manual_seed(n)
            scores = torch.randn(*shape(batch, n), generator=gen, device=device)
            theirs = {}
            if ref is not None:
                try:
                    theirs = {op: median_ms(fn, device) for op, fn in ref[1](scores).items()}
                except Exception as err:  # noqa: BLE001
                    notes.append(f"{name}, n = {n}: {ref[0]} failed ({type(err).__name__}: {err}).")
            for op, fn in our_ops(structure, scores).items():
                ours = median_ms(fn, device)
                row = {
                    "structure": name,
                    "n": n,
                    "op": op,
                    "ours_ms": ours,
                    "reference": ref[0] if ref else "—",
                    "theirs_ms": theirs.get(op),
                    "ratio": ours / theirs[op] if op in theirs else None,
                }
                if op == "sparsemap+backward" and not isinstance(structure, TopK):  # TopK: closed form
                    row["iterations"] = sparsemap_active_set(structure, scores).iterations
                rows.append(row)
                log(_line(row))
    return rows, notes


def batch_scaling(device, n=30, batches=(1, 32, 256), log=print):
    """marginals+backward and map of projective trees as the batch grows (sub-linear on a GPU)."""
    rows = []
    for name, structure, shape, _ in suite()[:1]:
        for b in batches:
            scores = torch.randn(*shape(b, n), device=device)
            ops = our_ops(structure, scores)
            for op in ("map", "marginals+backward"):
                rows.append({"structure": name, "n": n, "batch": b, "op": op, "ms": median_ms(ops[op], device)})
                log(f"  batch {b:4d} {op:20s} {rows[-1]['ms']:9.2f} ms")
    return rows


def _fmt(x, digits=1):
    return "—" if x is None else f"{x:.{digits}f}"


def _line(row) -> str:
    extra = f"  ({row['iterations']} iterations)" if "iterations" in row else ""
    return (
        f"  {row['structure']:22s} n={row['n']:3d} {row['op']:20s} ours {row['ours_ms']:9.2f} ms"
        f"  theirs {_fmt(row['theirs_ms'], 2):>9s} ms  ratio {_fmt(row['ratio'], 2)}{extra}"
    )


def write_markdown(path: Path, rows, notes, scaling, args, device) -> None:
    env = environment(device)
    lines = [
        "# Structures benchmark",
        "",
        f"Median wall time (ms) per call at batch {args.batch}, float32, {device.type.upper()}; ratio = ours / theirs "
        "(< 1: ours faster). Both sides run in the same process on the same inputs.",
        "",
        f"- git commit: {env['git_commit']}{' (dirty)' if env['git_dirty'] else ''}",
        f"- hardware: {env['hardware']} ({platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} torch threads)",
        f"- torch {torch.__version__}, Python {platform.python_version()}",
        f"- generated: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- regenerate with: `make bench-structures` (`{' '.join(sys.argv)}`)",
        "",
        "| structure | n | operation | ours (ms) | reference | theirs (ms) | ours / theirs | SparseMAP iterations |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['structure']} | {r['n']} | {r['op']} | {_fmt(r['ours_ms'], 2)} | {r['reference']} | "
            f"{_fmt(r['theirs_ms'], 2)} | {_fmt(r['ratio'], 2)} | {r.get('iterations', '')} |"
        )
    lines += [
        "",
        "## SparseMAP vs marginals (ours)",
        "",
        "sparsemap+backward time / marginals+backward time, same structure and n.",
        "",
    ]
    by = {(r["structure"], r["n"], r["op"]): r["ours_ms"] for r in rows}
    for (structure, n, op), ms in by.items():
        if op == "sparsemap+backward" and (structure, n, "marginals+backward") in by:
            lines.append(f"- {structure}, n = {n}: {ms / by[(structure, n, 'marginals+backward')]:.1f}×")
    if scaling:
        lines += [
            "",
            "## Batch scaling (projective trees, n = 30)",
            "",
            "| batch | operation | ms | ms per example |",
            "|---|---|---|---|",
        ]
        lines += [f"| {r['batch']} | {r['op']} | {r['ms']:.2f} | {r['ms'] / r['batch']:.3f} |" for r in scaling]
    lines += ["", "## Notes", "", *[f"- {n}" for n in notes]]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/bench/structures.md"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 30, 60])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--only", nargs="*", help="structure name prefixes to run (default: all)")
    parser.add_argument("--no-scaling", action="store_true", help="skip the batch-scaling section")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    print(f"benchmarking on {device} with {torch.get_num_threads()} threads")
    rows, notes = run(args.sizes, args.batch, device, args.only)
    scaling = [] if args.no_scaling else batch_scaling(device)
    write_markdown(args.out, rows, notes, scaling, args, device)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
