"""Benchmark: latentstruct's structures next to the libraries people use today, and next to an older commit.

    python bench/structures.py --out results/bench/structures.md [--device cuda] [--sizes 10 30 60] [--batch 32]
                               [--baseline REV] [--only projective ...] [--threads T]

For every structure and operation — ``map``, ``map_parts`` (MAP as part indices, the SparseMAP solver's oracle, where
the structure has its own), ``marginals``, ``marginals+backward`` (the marginals, then a backward pass of <μ, g>
through them: a second derivative of the log-partition) and ``sparsemap+backward`` — it reports the median wall time
over repetitions at batch 32 and n ∈ {10, 30, 60}, and, where a reference implementation exists, its time on the
same inputs and the ratio ours/theirs:

* projective trees — SuPar ``DependencyCRF`` (Eisner; ``argmax``, ``marginals``), ``multiroot=True``;
* non-projective trees — SuPar ``MatrixTree`` (Chu-Liu-Edmonds ``argmax``, Matrix-Tree ``marginals``);
* sequence tagging — torch-struct ``LinearChainCRF`` (our layout converted to its edge potentials);
* binary trees — torch-struct ``TreeCRF`` with one nonterminal, if it runs.

The references come from ``pip install --no-deps supar nltk dill regex torch-struct`` into a separate folder on
PYTHONPATH (``make bench-structures`` does this): they are never dependencies of latentstruct. A missing or failing
reference is reported as such. Before timing, each reference is checked to compute the same thing as ours (the
largest absolute difference of the log-partition or the marginals is printed in the table's notes).

**SparseMAP.** For the generic active-set solver it also reports the iterations, the batched MAP calls, the mean
support size, the *oracle share* — iterations × the time of one call of the solver's MAP oracle on the whole batch /
the time of ``sparsemap+backward`` (the definition of issue #17; it over-counts when examples retire early or an
iteration is a drop step) — and the time actually spent inside the oracle's calls, measured (a timer around them).

**Before / now.** ``--baseline REV`` checks REV out into a temporary ``git worktree`` and times the same operations
there: this script re-runs itself in a subprocess (``--worker``) with ``PYTHONPATH`` = that worktree, so that the
older ``latentstruct`` computes on the same inputs (same seeds), interleaved with this tree structure by structure.
A warm-start section compares the solver started cold with one started at the solution of nearby scores.

All examples have full length (no padding). Scores are i.i.d. N(0, 1), except where a note says otherwise; the
SparseMAP solver's work depends on the scale of the scores (how many vertices the solution mixes).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if "--worker" not in sys.argv:  # a worker imports the latentstruct of the tree it runs in (PYTHONPATH)
    sys.path.insert(0, str(ROOT))

from latentstruct.records import environment  # noqa: E402
from latentstruct.structures import (  # noqa: E402
    BinaryTree,
    Matching,
    NonProjectiveDepTree,
    ProjectiveDepTree,
    SequenceTagging,
    Structure,
    TopK,
)
from latentstruct.structures.sparsemap import sparsemap_active_set  # noqa: E402

NUM_TAGS = 17  # BIOES over the four CoNLL-2003 entity types, as in the NER task
TOP_K = 5
OPS = ("map", "map_parts", "marginals", "marginals+backward", "sparsemap+backward")  # in our_ops's order
WARM_N = 30  # the size of the warm-start comparison
WARM_NOISE = (0.01, 0.1)
TIME_LIMIT = "Stopped at the time limit of --max-seconds"


# ---------------------------------------------------------------------------------------------------------- timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn, device: torch.device, budget_s: float = 1.0, min_reps: int = 3, max_reps: int = 25) -> float:
    """Median wall time of ``fn()`` in milliseconds over ≥ ``min_reps`` repetitions, within about ``budget_s``.

    The first call is a warm-up, except for calls slower than the budget (SparseMAP at n = 60 took seconds), where
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


@contextlib.contextmanager
def oracle_timer(structure, device):
    """Time every call of the structure's MAP (``map`` and ``map_parts``, the outermost call only) → ``[seconds]``."""
    spent = [0.0]
    depth = [0]
    originals = {name: getattr(structure, name) for name in ("map", "map_parts") if hasattr(structure, name)}

    def wrap(fn):
        def timed(*args, **kwargs):
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    _sync(device)
                    spent[0] += time.perf_counter() - t0

        return timed

    for name, fn in originals.items():
        setattr(structure, name, wrap(fn))
    try:
        yield spent
    finally:
        for name in originals:
            delattr(structure, name)  # the class's method again


# ------------------------------------------------------------------------------------------------ our operations


def _with_backward(forward, scores, direction):
    def run():
        x = scores.detach().clone().requires_grad_(True)
        (forward(x) * direction).sum().backward()

    return run


def _solver_oracle(structure):
    """The MAP the SparseMAP solver calls: ``map_parts`` where the structure has one (this tree), else ``map``."""
    return getattr(structure, "map_parts", structure.map)


def our_ops(structure, scores) -> dict:
    direction = torch.randn_like(scores)
    ops = {"map": lambda: structure.map(scores)}
    if hasattr(Structure, "map_parts") and type(structure).map_parts is not Structure.map_parts:
        ops["map_parts"] = lambda: structure.map_parts(scores)
    try:
        structure.marginals(scores[:1])
    except NotImplementedError:
        pass  # Matching: #P-hard
    else:
        ops["marginals"] = lambda: structure.marginals(scores)
        ops["marginals+backward"] = _with_backward(structure.marginals, scores, direction)
    ops["sparsemap+backward"] = _with_backward(structure.sparsemap, scores, direction)
    return ops


def solver_stats(structure, scores, total_ms: float, device) -> dict:
    """Iterations, MAP calls, support and oracle shares of one ``sparsemap_active_set`` on ``scores``."""
    sol = sparsemap_active_set(structure, scores)
    one_call = median_ms(lambda: _solver_oracle(structure)(scores), device)
    direction = torch.randn_like(scores)
    inside, total = [], []
    for _ in range(3):
        with oracle_timer(structure, device) as spent:
            t0 = time.perf_counter()
            _with_backward(structure.sparsemap, scores, direction)()
            _sync(device)
            total.append(time.perf_counter() - t0)
        inside.append(spent[0])
    return {
        "iterations": sol.iterations,
        "map_calls": getattr(sol, "map_calls", None),
        "support": (sol.weights > 0).sum(-1).double().mean().item(),
        "oracle_ms": one_call,
        "oracle_share": sol.iterations * one_call / total_ms,
        "in_map": sum(inside) / sum(total),
    }


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


def _inputs(shape, n, batch, device):
    gen = torch.Generator(device=device).manual_seed(n)
    return torch.randn(*shape(batch, n), generator=gen, device=device)


def time_ours(name, structure, shape, n, batch, device) -> dict:
    """Every operation of ours on one structure and size (what a ``--worker`` prints for its tree)."""
    torch.manual_seed(n)
    scores = _inputs(shape, n, batch, device)
    out = {op: median_ms(fn, device) for op, fn in our_ops(structure, scores).items()}
    if not isinstance(structure, TopK):  # TopK: closed form
        out.update(solver_stats(structure, scores, out["sparsemap+backward"], device))
    return out


def _selected(only):
    return [s for s in suite() if not only or any(s[0].startswith(o) for o in only)]


def worker(args) -> int:
    """Time ours for ``--only`` / ``--sizes`` in this process's latentstruct and print one JSON line per size."""
    device = torch.device(args.device)
    for name, structure, shape, _ in _selected(args.only):
        for n in args.sizes:
            print(json.dumps({"structure": name, "n": n, **time_ours(name, structure, shape, n, args.batch, device)}))
    return 0


def time_baseline(tree, env, name, n, args) -> dict:
    """Run this script as a worker in the baseline tree for one structure and size; its timings (or the error)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--only", name, "--sizes", str(n)]
    cmd += ["--batch", str(args.batch), "--device", args.device]
    proc = subprocess.run(cmd, cwd=tree.path, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(args, device, before=None, log=print, deadline: float | None = None):
    """The rows (structure, n, op: ours, reference, before) and the notes. ``before`` = (tree, env) or None;
    ``deadline`` (time.monotonic()): nothing more is started after it, and a note says what was left out."""
    rows, notes = [], []
    for index, (name, structure, shape, reference) in enumerate(_selected(args.only)):
        if deadline is not None and time.monotonic() > deadline:
            left = [s[0] for s in _selected(args.only)][index:]
            notes.append(f"{TIME_LIMIT} ({args.max_seconds:.0f} s): not timed: {', '.join(left)}.")
            break
        ref = None
        if reference is not None:
            try:
                ref_name, check, ref_ops = reference(structure)
                diff = check(torch.randn(*shape(2, 6), dtype=torch.float64, device=device))
                notes.append(f"{name}: {ref_name} agrees with ours to {diff:.1e} (float64, n = 6).")
                ref = (ref_name, ref_ops)
            except Exception as err:  # noqa: BLE001 — a broken reference is a result to report, not a crash
                notes.append(f"{name}: reference unavailable ({type(err).__name__}: {err}).")
        for k, n in enumerate(args.sizes):
            theirs, old = {}, {}
            baseline_first = (index + k) % 2 == 0  # interleave: the order alternates
            if before is not None and baseline_first:
                old = time_baseline(*before, name, n, args)
            ours = time_ours(name, structure, shape, n, args.batch, device)
            if before is not None and not baseline_first:
                old = time_baseline(*before, name, n, args)
            if "error" in old:
                notes.append(f"{name}, n = {n}: the baseline failed ({old['error']}).")
            if ref is not None:
                scores = _inputs(shape, n, args.batch, device)
                try:
                    theirs = {op: median_ms(fn, device) for op, fn in ref[1](scores).items()}
                except Exception as err:  # noqa: BLE001
                    notes.append(f"{name}, n = {n}: {ref[0]} failed ({type(err).__name__}: {err}).")
            for op in [op for op in ours if op in OPS]:  # ours also holds the solver's statistics
                row = {
                    "structure": name,
                    "n": n,
                    "op": op,
                    "ours_ms": ours[op],
                    "before_ms": old.get(op),
                    "reference": ref[0] if ref else "—",
                    "theirs_ms": theirs.get(op),
                }
                if op == "sparsemap+backward":
                    stats = ("iterations", "map_calls", "support", "oracle_ms", "oracle_share", "in_map")
                    row |= {key: ours.get(key) for key in stats}
                    row |= {f"before_{key}": old.get(key) for key in stats}
                    row["marginals_ms"] = ours.get("marginals+backward")
                rows.append(row)
                log(_line(row))
    return rows, notes


def warm_start(args, device, log=print) -> list[dict]:
    """Cold vs warm SparseMAP on scores s + ε N(0, 1), the warm one started at the solution for s."""
    rows = []
    for name, structure, shape, _ in _selected(args.only):
        if isinstance(structure, TopK):
            continue
        scores = _inputs(shape, WARM_N, args.batch, device)
        previous = sparsemap_active_set(structure, scores)
        for eps in WARM_NOISE:
            noise = torch.randn(scores.shape, generator=torch.Generator(device=device).manual_seed(1), device=device)
            near = scores + eps * noise
            cold = sparsemap_active_set(structure, near)
            warm = sparsemap_active_set(structure, near, init=previous)
            solve = functools.partial(sparsemap_active_set, structure, near)
            row = {
                "structure": name,
                "eps": eps,
                "cold_calls": cold.map_calls,
                "warm_calls": warm.map_calls,
                "cold_iterations": cold.iterations,
                "warm_iterations": warm.iterations,
                "cold_ms": median_ms(solve, device),
                "warm_ms": median_ms(functools.partial(solve, init=previous), device),
            }
            rows.append(row)
            log(
                f"  warm start {name:22s} ε={eps}: MAP calls {row['cold_calls']} → {row['warm_calls']}, "
                f"{row['cold_ms']:.1f} → {row['warm_ms']:.1f} ms"
            )
    return rows


def batch_scaling(args, device, n=30, batches=(1, 4, 32, 256), log=print):
    """The SparseMAP solver calls MAP on the examples still working, often a handful: the oracle of every structure
    (``map_parts`` where it has one, else ``map``) as the batch grows, and projective marginals+backward."""
    rows = []
    for name, structure, shape, _ in _selected(args.only):
        if isinstance(structure, TopK):
            continue
        oracle = _solver_oracle(structure)
        ops = [("MAP oracle", None)] + ([("marginals+backward", "marginals+backward")] if name == "projective" else [])
        for b in batches:
            scores = _inputs(shape, n, b, device)
            for label, op in ops:
                fn = functools.partial(oracle, scores) if op is None else our_ops(structure, scores)[op]
                rows.append({"structure": name, "n": n, "batch": b, "op": label, "ms": median_ms(fn, device)})
                log(f"  {name:22s} batch {b:4d} {label:20s} {rows[-1]['ms']:9.2f} ms")
    return rows


# ------------------------------------------------------------------------------------------------------------ report


def _fmt(x, digits=1, suffix=""):
    return "—" if x is None else f"{x:.{digits}f}{suffix}"


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def _line(row) -> str:
    extra = ""
    if row["op"] == "sparsemap+backward" and row.get("iterations") is not None:
        extra = f"  ({row['iterations']} it, oracle share {row['oracle_share']:.2f}, in MAP {row['in_map']:.2f})"
    return (
        f"  {row['structure']:22s} n={row['n']:3d} {row['op']:20s} now {row['ours_ms']:9.2f} ms"
        f"  before {_fmt(row['before_ms'], 2):>9s}  theirs {_fmt(row['theirs_ms'], 2):>9s}{extra}"
    )


def write_markdown(path: Path, rows, notes, warm, scaling, args, device, baseline) -> None:
    env = environment(device)
    before = baseline is not None
    lines = [
        "# Structures benchmark",
        "",
        ("**Status: partial** (stopped at its time limit: see the notes; "
         if any(n.startswith(TIME_LIMIT) for n in notes) else "**Status: full benchmark protocol** (")
        + f"every structure and operation at batch {args.batch}, n ∈ "
        f"{{{', '.join(map(str, args.sizes))}}}, i.i.d. N(0, 1) scores) on {device.type.upper()}; a timing "
        "benchmark, not a paper table.",
        "",
        f"Median wall time (ms) per call at batch {args.batch}, float32, {device.type.upper()}, i.i.d. N(0, 1) scores"
        + (
            f"; **before** = commit {baseline['commit'][:12]} ({baseline['subject']}), **now** = this tree, the "
            "same inputs, timed structure by structure in alternation"
            if before
            else ""
        )
        + ". Reference libraries run in the same process on the same inputs; ratio = now / theirs (< 1: ours faster).",
        "",
        f"- git commit: {env['git_commit']}{' (dirty)' if env['git_dirty'] else ''}",
        f"- hardware: {env['hardware']} ({platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} torch threads)",
        f"- torch {torch.__version__}, Python {platform.python_version()}",
        f"- generated: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- regenerate with: `make bench-structures{f' BENCH_BASELINE={args.baseline}' if before else ''}` "
        f"(`{' '.join(sys.argv)}`)",
        "",
        "## SparseMAP + backward",
        "",
        "Iterations, MAP calls (batched) and support (vertices with positive weight, mean over the batch) of the "
        "active-set solver; **oracle share** = iterations × one call of the solver's MAP oracle on the whole batch / "
        "the total (issue #17's definition; the oracle is `map_parts` where the structure has one, else `map`); **in "
        "MAP** = the time measured inside the oracle's calls / the total; **÷ marg.** = the time over the structure's "
        "marginals+backward. TopK has a closed form.",
        "",
    ]
    head = "| structure | n |" + (" before (ms) | before it. |" if before else "")
    head += " now (ms) |" + (" speed-up |" if before else "")
    head += " iterations | MAP calls | support | oracle share | in MAP | ÷ marg. |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if r["op"] != "sparsemap+backward":
            continue
        cells = [r["structure"], str(r["n"])]
        if before:
            cells += [_fmt(r["before_ms"]), str(r.get("before_iterations") or "—")]
        cells.append(_fmt(r["ours_ms"]))
        if before:
            cells.append(_fmt(_ratio(r["before_ms"], r["ours_ms"]), 1, "×"))
        cells += [
            str(r.get("iterations") or "—"),
            str(r.get("map_calls") or "—"),
            _fmt(r.get("support"), 0),
            _fmt(r.get("oracle_share"), 2),
            _fmt(r.get("in_map"), 2),
            _fmt(_ratio(r["ours_ms"], r.get("marginals_ms")), 1, "×"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## MAP and marginals", ""]
    head = "| structure | n | operation |" + (" before (ms) |" if before else "") + " now (ms) |"
    head += (" speed-up |" if before else "") + " reference | theirs (ms) | now / theirs |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if r["op"] == "sparsemap+backward":
            continue
        cells = [r["structure"], str(r["n"]), r["op"]]
        if before:
            cells.append(_fmt(r["before_ms"], 2))
        cells.append(_fmt(r["ours_ms"], 2))
        if before:
            cells.append(_fmt(_ratio(r["before_ms"], r["ours_ms"]), 1, "×"))
        cells += [r["reference"], _fmt(r["theirs_ms"], 2), _fmt(_ratio(r["ours_ms"], r["theirs_ms"]), 2)]
        lines.append("| " + " | ".join(cells) + " |")
    if warm:
        lines += [
            "",
            f"## SparseMAP warm start (n = {WARM_N})",
            "",
            "The solver on scores s + ε N(0, 1), started cold (at MAP) or warm (`init=` the solution for s). Warm "
            "starts save MAP calls only for nearby scores: for distant ones the old vertices must leave one drop step "
            "at a time.",
            "",
            "| structure | ε | MAP calls cold → warm | iterations cold → warm | cold (ms) | warm (ms) |",
            "|---|---|---|---|---|---|",
        ]
        for w in warm:
            lines.append(
                f"| {w['structure']} | {w['eps']} | {w['cold_calls']} → {w['warm_calls']} | "
                f"{w['cold_iterations']} → {w['warm_iterations']} | {w['cold_ms']:.1f} | {w['warm_ms']:.1f} |"
            )
    if scaling:
        lines += [
            "",
            "## Batch scaling (n = 30)",
            "",
            "The MAP oracle the solver calls (`map_parts` where the structure has one, else `map`), which sees fewer "
            "examples as they converge, and projective marginals+backward, as the batch grows.",
            "",
            "| structure | batch | operation | ms | ms per example |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['structure']} | {r['batch']} | {r['op']} | {r['ms']:.2f} | {r['ms'] / r['batch']:.3f} |"
            for r in scaling
        ]
    lines += ["", "## Notes", "", *[f"- {n}" for n in notes]]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(json.dumps({"rows": rows, "warm": warm, "scaling": scaling}, indent=1) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/bench/structures.md"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 30, 60])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--only", nargs="*", help="structure name prefixes to run (default: all)")
    parser.add_argument("--baseline", metavar="REV", help="a git revision to time beside this tree (the 'before')")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--no-scaling", action="store_true", help="skip the batch-scaling section")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-start section")
    parser.add_argument("--max-seconds", type=float, help="start nothing new after this long (a partial table)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        return worker(args)
    from bench.trees import baseline_tree, check_import, tree_env

    device = torch.device(args.device)
    torch.manual_seed(0)
    print(f"benchmarking on {device} with {torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory(prefix="bench-structures-") as work, contextlib.ExitStack() as stack:
        baseline = before = None
        if args.baseline:
            tree, baseline = stack.enter_context(baseline_tree(args.baseline, Path(work)))
            env = tree_env(tree, args.threads)
            print(f"before: {baseline['commit'][:12]} imports {check_import(tree, env)}")
            before = (tree, env)
        deadline = None if args.max_seconds is None else time.monotonic() + args.max_seconds
        rows, notes = run(args, device, before, deadline=deadline)
    late = deadline is not None and time.monotonic() > deadline
    if late and not (args.no_warm and args.no_scaling):
        notes.append(f"{TIME_LIMIT} ({args.max_seconds:.0f} s): the warm-start and batch-scaling sections skipped.")
    warm = [] if args.no_warm or late else warm_start(args, device)
    scaling = [] if args.no_scaling or late else batch_scaling(args, device)
    write_markdown(args.out, rows, notes, warm, scaling, args, device, baseline)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
