"""Benchmark: the MAP oracles of non-projective trees and matchings, now and at an earlier revision, in one process.

    python bench/map_oracles.py --before 645b4f9 [--sizes 10 30 60] [--batches 1 4 32] [--threads 2]

The generic SparseMAP solver calls ``map`` about a hundred times per projection, often on a few examples, so the
oracles are timed at small batches as well as at batch 32. ``--before`` loads ``nonprojective.py`` and ``matching.py``
as they were at that git revision (``git show``) next to the current ones; both run on the same inputs (i.i.d. N(0, 1)
float32 scores, full length), are checked to return the same vertices, and are timed in alternation. Reported per
(structure, n, batch): the median wall time of each (ms) and their ratio, and the minimum CPU time of each, which is
steadier when other processes share the cores.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
import types
from pathlib import Path

import torch

from latentstruct.structures import matching, nonprojective

ROOT = Path(__file__).resolve().parents[1]


def load_at(revision: str, module: types.ModuleType) -> types.ModuleType:
    """``module`` as its source file was at ``revision``, executed as a fresh module (its imports are today's)."""
    path = Path(module.__file__).resolve().relative_to(ROOT).as_posix()
    source = subprocess.check_output(["git", "show", f"{revision}:{path}"], cwd=ROOT, text=True)
    old = types.ModuleType(f"{module.__name__}@{revision}")
    exec(compile(source, f"{revision}:{path}", "exec"), old.__dict__)  # noqa: S102 — our own code, from git
    return old


def timings(fns, reps: int = 30) -> list[tuple[float, float]]:
    """(median wall ms, min CPU ms) of each function, the repetitions alternating between them after one warm-up."""
    wall, cpu = [[] for _ in fns], [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(reps):
        for k, fn in enumerate(fns):
            t0, c0 = time.perf_counter(), time.thread_time()
            fn()
            cpu[k].append(time.thread_time() - c0)
            wall[k].append(time.perf_counter() - t0)
    return [(1e3 * statistics.median(w), 1e3 * min(c)) for w, c in zip(wall, cpu, strict=True)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="git revision to compare with")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 30, 60])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 32])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    old_np, old_m = load_at(args.before, nonprojective), load_at(args.before, matching)
    cases = [
        ("nonprojective", nonprojective.NonProjectiveDepTree(), old_np.NonProjectiveDepTree(), 1),
        ("nonprojective single root", nonprojective.NonProjectiveDepTree(False), old_np.NonProjectiveDepTree(False), 1),
        ("matching", matching.Matching(), old_m.Matching(), 0),
    ]
    print(f"map, float32, CPU, {args.threads} threads; before = {args.before}")
    print("| structure | n | batch | before ms | after ms | before / after | min CPU ms before, after | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for name, new, old, extra in cases:
        for n in args.sizes:
            for batch in args.batches:
                scores = torch.randn(batch, n + extra, n + extra, generator=torch.Generator().manual_seed(n + batch))
                if not torch.equal(new.map(scores), old.map(scores)):
                    raise AssertionError(f"{name}, n = {n}, batch {batch}: the two revisions disagree")
                calls = [lambda s=scores, f=old.map: f(s), lambda s=scores, f=new.map: f(s)]
                (wall_old, cpu_old), (wall_new, cpu_new) = timings(calls)
                print(
                    f"| {name} | {n} | {batch} | {wall_old:.2f} | {wall_new:.2f} | {wall_old / wall_new:.1f} "
                    f"| {cpu_old:.2f}, {cpu_new:.2f} | {cpu_old / cpu_new:.1f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
