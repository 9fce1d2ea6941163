"""Benchmark: one Hydra composition of ``configs/train.yaml``, as Hydra 1.3 comes and with
``latentstruct.compose_cache`` (the ConfigStore shared, each config file's load kept, the interpolation map built only
where read), in one process, interleaved.

    python bench/compose.py --out results/bench/compose.md [--rounds 5] [--cases N]

Each round composes every experiment family's first experiment, the default one and a sweep (``hydra`` node
included, as ``python -m latentstruct.train`` composes), first one way and then the other (the order alternating
between rounds); a row is the median over rounds of the CPU seconds per composition. Both give the same
configurations (tests/test_config.py).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hydra import compose, initialize_config_dir  # noqa: E402

from bench.trees import stamp, write_sheet  # noqa: E402
from latentstruct import compose_cache  # noqa: E402  (installed when latentstruct.config is imported)
from latentstruct.config import CONFIG_DIR, experiments  # noqa: E402


def cases() -> list[list[str]]:
    return [[f"+experiment={names[0]}"] for names in experiments().values()] + [[], ["+sweep=spigot_sst"]]


def per_compose(overrides: list[list[str]]) -> float:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        began = time.process_time()
        for o in overrides:
            compose("train", overrides=o, return_hydra_config=True)
        return (time.process_time() - began) / len(overrides)


def way(label: str) -> contextlib.AbstractContextManager:
    """Hydra as it comes ("hydra") or with the cache, which is installed already ("cached")."""
    return compose_cache.uninstalled() if label == "hydra" else contextlib.nullcontext()


def measure(rounds: int, first: int | None = None) -> dict:
    runs = {"hydra": [], "cached": []}
    todo = cases()[:first]
    for label in runs:  # untimed: imports, first loads
        with way(label):
            per_compose(todo[:2])
    for r in range(rounds):
        for label in (("hydra", "cached") if r % 2 == 0 else ("cached", "hydra")):
            with way(label):
                runs[label].append(per_compose(todo))
            print(f"round {r + 1}: {label} {runs[label][-1]:.3f} CPU-s per composition", flush=True)
    hydra, cached = statistics.median(runs["hydra"]), statistics.median(runs["cached"])
    return {"hydra": hydra, "cached": cached, "speedup": hydra / cached, "cases": len(todo), "runs": runs}


def page(sheet: dict) -> str:
    r = sheet["row"]
    return "\n".join([
        "# One Hydra composition, as Hydra comes and with `latentstruct.compose_cache` (`make bench-compose`)",
        "",
        f"**Status:** a timing benchmark, not a paper table: CPU seconds per composition of `configs/train.yaml` "
        f"(`hydra` node included), median of {sheet['rounds']} rounds over {r['cases']} configurations (each "
        "experiment family's first, the default, a sweep), the two alternating in one process.",
        "",
        f"- git commit: {sheet['commit']}",
        f"- hardware: {sheet['machine']}; hydra-core {sheet['hydra']}; generated {sheet['generated']}",
        "",
        "| Hydra 1.3 as it comes (CPU-s) | with compose_cache (CPU-s) | speed-up |",
        "|---|---|---|",
        f"| {r['hydra']:.3f} | {r['cached']:.3f} | {r['speedup']:.2f}× |",
        "",
        "compose_cache shares the ConfigStore among Hydra's per-composition copies of its repository (Hydra "
        "deep-copies it, and with it every structured config stored) and keeps what each config file loads to, "
        "handing out a deep copy per load (keyed by the file's path, size, time and inode), and builds Hydra's map of "
        "choices, which resolves interpolated defaults, only for a defaults list that has one (Hydra builds it for "
        "every config of the tree). A run composes twice "
        "(the command-line check, then Hydra), a sweep once per job before it starts, the test suite about 950 "
        "times.",
        "",
    ])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the Markdown page (the sheet goes beside it, .json)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of both (default 5)")
    parser.add_argument("--cases", type=int, default=None, help="only the first N configurations (tests)")
    args = parser.parse_args(argv)
    import hydra

    sheet = {**stamp("latentstruct", "bench", "configs"), "hydra": hydra.__version__, "rounds": args.rounds,
             "row": measure(args.rounds, args.cases)}
    write_sheet(args.out, sheet, page(sheet))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
