"""One-off: rewrite run records made before the experiments got flat names (``sst/spigot`` → ``sst_spigot``).

    python -m scripts.migrate_experiment_names RUNS [--dry-run]

Every run directory under ``RUNS`` (a folder holding ``.hydra/hydra.yaml``) whose Hydra choice ``experiment`` is a
nested name gets the flat one in ``.hydra/hydra.yaml`` (the choice and the ``+experiment=`` overrides) and in
``.hydra/overrides.yaml``, so that ``latentstruct.report.tables.load_runs`` counts it for its row. Nothing else is
touched; a record with flat names is left as it is. Prints one line per rewritten run and a count.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

#: ``experiment: sst/spigot`` (the choice) and ``experiment=sst/spigot`` (an override), the nested name captured
_CHOICE = re.compile(r"^(\s*experiment: )(\w+)/(\w+)\s*$", re.MULTILINE)
_OVERRIDE = re.compile(r"(experiment=)(\w+)/(\w+)")


def _flat(match: re.Match) -> str:
    return f"{match[1]}{match[2]}_{match[3]}"


def migrate(run_dir: Path, dry_run: bool = False) -> bool:
    """Rewrite one run directory's ``.hydra`` files to the flat experiment name; True if it held a nested one."""
    hydra_file = run_dir / ".hydra" / "hydra.yaml"
    choice = ((yaml.safe_load(hydra_file.read_text()) or {}).get("hydra") or {}).get("runtime", {}).get("choices", {})
    if "/" not in str(choice.get("experiment") or ""):
        return False
    if not dry_run:
        hydra_file.write_text(_OVERRIDE.sub(_flat, _CHOICE.sub(_flat, hydra_file.read_text())))
        overrides = run_dir / ".hydra" / "overrides.yaml"
        if overrides.is_file():
            overrides.write_text(_OVERRIDE.sub(_flat, overrides.read_text()))
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.migrate_experiment_names", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, help="a folder of run directories (searched recursively)")
    parser.add_argument("--dry-run", action="store_true", help="list the runs it would rewrite, change nothing")
    args = parser.parse_args(argv)
    rewritten = 0
    for hydra_file in sorted(args.runs.rglob(".hydra/hydra.yaml")):
        if migrate(hydra_file.parent.parent, args.dry_run):
            rewritten += 1
            print(f"{'would rewrite' if args.dry_run else 'rewrote'} {hydra_file.parent.parent}")
    print(f"{rewritten} run(s) with a nested experiment name")
    return 0


if __name__ == "__main__":
    sys.exit(main())
