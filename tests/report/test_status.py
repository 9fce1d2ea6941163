"""Status lines, sidecars, results/README.md and the backfill of committed tables (issue #19, finding 5)."""

import json
from pathlib import Path

import pytest
import yaml

from latentstruct.report import report, status, tables
from scripts import backfill
from tests.helpers import ROOT as REPO
from tests.report.test_tables import _four_runs, _run, _spec


def _with(spec_path: Path, **changes) -> Path:
    spec = yaml.safe_load(spec_path.read_text())
    spec.update(changes)
    spec_path.write_text(yaml.safe_dump(spec, allow_unicode=True))
    return spec_path


def _steps(root: Path, steps: int) -> None:
    """Give every run record under ``root`` a training length, as train.py records it."""
    for path in root.rglob("metrics.json"):
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "steps": steps}))


def _table(tmp_path: Path, steps: int = 100, other: bool = True, **protocol) -> tuple[str, dict]:
    """A table written by tables.main; ``other``: the second row has runs too (else its cells are empty)."""
    spec = _with(_spec(tmp_path), paper_protocol={"length": "3 epochs", "steps": 100, "runs": 4, **protocol})
    _four_runs(tmp_path / "runs")
    for seed in range(1, 5) if other else []:
        _run(tmp_path / "runs", f"o{seed}", "synthetic_other", acc=49.0 + seed, seed=seed)
    _steps(tmp_path / "runs", steps)
    out = tmp_path / "results" / "p" / "t1.md"
    assert tables.main([str(spec), "--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    return out.read_text(), json.loads(out.with_suffix(".json").read_text())


def test_a_table_run_as_the_paper_did_is_full_and_opens_with_its_status(tmp_path):
    md, data = _table(tmp_path)
    assert md.splitlines()[2].startswith("**Status: full protocol**") and data["status"] == "full"
    assert data["differs"] == [] and data["source"] == "run records" and data["markdown"] == "t1.md"
    assert data["cells"] == {"total": 4, "with_runs": 4, "with_paper": 3, "compared": 3, "within_tolerance": 2}
    assert data["provenance"]["seeds"] == [1, 2, 3, 4] and data["provenance"]["steps"] == [100]
    assert "- training steps per run: 100 (paper: 3 epochs ≈ 100 steps)" in md
    assert "- seeds: 1, 2, 3, 4 (paper: 4 run(s) per number)" in md
    assert "2 of 3 cells with a paper number within tolerance" in md  # the V-measure: 80 vs the paper's 20.53
    assert data["headline"] == (
        "K=3 Accuracy: best of ours SPIGOT (92.00); on the 2 rows the paper also has, its "
        "best is SPIGOT (92.00) and ours SPIGOT (92.00), and the two orders agree by Kendall "
        "τ = +1.00"
    )


def test_fewer_steps_or_runs_than_the_paper_make_a_reduced_table(tmp_path):
    md, data = _table(tmp_path, steps=40, other=False, runs=5)
    assert data["status"] == "reduced"
    assert data["differs"][:2] == [
        "40 of 100 training steps per run (paper: 3 epochs)",
        "4 run(s) per cell instead of the paper's 5",
    ]
    assert data["differs"][2] == "2 of 4 cells without runs"  # the row `other` has no runs
    assert md.splitlines()[2].startswith("**Status: reduced protocol** — 40 of 100 training steps")


def test_a_metric_the_completed_runs_do_not_record_is_no_cell_without_runs(tmp_path):
    """SST's baseline has no trees: its depth cell has completed runs, no value and no paper number, which is no gap;
    a cell whose runs leave out a metric the paper has a number for is one, said as such."""
    spec = _spec(tmp_path)
    _four_runs(tmp_path / "runs")
    for seed in range(1, 5):
        run = _run(tmp_path / "runs", f"o{seed}", "synthetic_other", acc=49.0 + seed, seed=seed)
        record = json.loads((run / "metrics.json").read_text())
        del record["metrics"]["test/v_measure"]  # the row has no V-measure (nor has the paper)
        (run / "metrics.json").write_text(json.dumps(record))
    out = tmp_path / "t1.md"
    assert tables.main([str(spec), "--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    data, md = json.loads(out.with_suffix(".json").read_text()), out.read_text()
    assert not any("cells" in d for d in data["differs"]) and "Cells without completed runs" not in md
    assert "Cells whose completed runs record no value (the metric does not apply to the row, or was not " \
           "recorded): Other K=3 test/v_measure" in md
    cells = {(c["row"], c["metric"]): c for c in data["long"]}
    assert cells[("other", "test/v_measure")]["n_done"] == 4 and cells[("other", "test/v_measure")]["n_runs"] == 0
    for run in (tmp_path / "runs").glob("o*"):  # now the accuracy, which the paper has, is left out too
        record = json.loads((run / "metrics.json").read_text())
        del record["metrics"]["test/acc"]
        (run / "metrics.json").write_text(json.dumps(record))
    assert tables.main([str(spec), "--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert "1 of 4 cells with a paper number that their runs do not record" in data["differs"]


def test_substituted_data_is_named_and_an_unrecorded_key_is_said(tmp_path):
    entry = {"key": "dataset.dim", "missing": 2, "paper": "the real data", "instead": "toy data"}
    spec = _with(_spec(tmp_path), paper_protocol={"data": [entry]}, provenance_keys={"dataset.dim": "dim"})
    _four_runs(tmp_path / "runs")
    df = tables.build_table(str(spec), tmp_path / "runs")
    found = status.facts(tables.load_runs(tmp_path / "runs"), {"dataset.dim": "dim"})
    result = status.summary(found, status.protocol(tables.load_spec(spec)), df.to_dict("records"), {})
    assert "toy data instead of the real data" in result["differs"]
    unrecorded = status.summary({**found, "data": {}}, {"data": [entry]}, df.to_dict("records"), {})
    assert unrecorded["unknown"] == ["`dataset.dim` (paper: the real data)"]
    # data that stand in for the paper's are named as such, never passed as the paper's
    present = status.summary({**found, "data": {"dataset.dim": ["3"]}}, {"data": [entry]}, df.to_dict("records"), {})
    assert not any("instead of the real data" in d for d in present["differs"])
    stand_in = {**entry, "stand_ins": {3: "a smaller real set"}}
    named = status.summary({**found, "data": {"dataset.dim": ["3"]}}, {"data": [stand_in]}, df.to_dict("records"), {})
    assert "a smaller real set instead of the real data" in named["differs"]
    # the runs' values are read for a protocol's data key without a provenance line (a time table's shared protocol)
    bare = _with(_spec(tmp_path), paper_protocol={"data": [entry]})
    out = tmp_path / "bare.md"
    assert tables.main([str(bare), "--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert "toy data instead of the real data" in data["differs"] and not data["unknown"]


def test_a_table_without_a_completed_run_is_blocked_with_the_runs_error(tmp_path):
    spec = _spec(tmp_path)
    _run(tmp_path / "runs", "f1", "synthetic_spigot", status="failed")
    out = tmp_path / "t1.md"
    tables.main([str(spec), "--runs", str(tmp_path / "runs"), "--out", str(out), "--allow-empty"])
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["status"] == "blocked" and "RuntimeError: boom" in data["differs"][0]
    assert out.read_text().splitlines()[2].startswith("**Status: blocked** — no completed run")


def test_the_report_lists_every_sidecar_and_only_sidecars(tmp_path):
    _table(tmp_path)
    (tmp_path / "results" / "bench").mkdir()
    (tmp_path / "results" / "bench" / "timings.json").write_text('{"rows": []}')
    (tmp_path / "results" / "bench" / "timings.md").write_text("# Timings\n\n**Status: full benchmark** — x.\n")
    (tmp_path / "q").mkdir()
    other = _with(_spec(tmp_path / "q"), table="t2", title="Second table")
    _four_runs(tmp_path / "q" / "runs")
    tables.main([str(other), "--runs", str(tmp_path / "q" / "runs"), "--out", str(tmp_path / "results/q/t2.md")])
    assert report.main(["--results", str(tmp_path / "results")]) == 0
    page = (tmp_path / "results" / "README.md").read_text()
    assert "[Fake table](p/t1.md)" in page and "[Second table](q/t2.md)" in page
    assert "2 tables: 1 full protocol, 1 reduced, 0 blocked;" in page  # t2 has no paper_protocol: not compared
    assert "- [Timings](bench/timings.md): **Status: full benchmark** — x." in page
    assert "## Ablations" not in page
    (tmp_path / "results" / "p" / "t1_ablation.md").write_text(
        "# Why t1's row\n\nStatus: **ablation** of t1's row at the table's code (commit abc). Made by `make x`.\n")
    assert report.main(["--results", str(tmp_path / "results")]) == 0
    page = (tmp_path / "results" / "README.md").read_text()
    assert ("## Ablations: what explains a row\n\n- [Why t1's row](p/t1_ablation.md): Status: **ablation** of t1's "
            "row at the table's code (commit abc).\n") in page
    assert len(report.sidecars(tmp_path / "results")) == 2


def test_the_report_compares_with_the_sidecars_of_an_earlier_commit(tmp_path):
    import shutil
    import subprocess

    _table(tmp_path, steps=40)  # reduced: 2 of 3 cells within tolerance

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("add", "results")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "before")
    sidecar = tmp_path / "results" / "p" / "t1.json"
    data = json.loads(sidecar.read_text())
    assert data["status"] == "reduced" and data["cells"]["within_tolerance"] == 2
    data["status"], data["cells"]["within_tolerance"] = "full", 3
    sidecar.write_text(json.dumps(data))
    (tmp_path / "results" / "p" / "t2.md").write_text((tmp_path / "results" / "p" / "t1.md").read_text())
    sidecar.with_name("t2.json").write_text(json.dumps({**data, "markdown": "t2.md"}))
    assert report.main(["--results", str(tmp_path / "results"), "--before", "HEAD"]) == 0
    page = (tmp_path / "results" / "README.md").read_text()
    kept = json.loads((tmp_path / "results" / report.BEFORE).read_text())
    assert kept["counts"] == {"tables": 1, "full": 0, "reduced": 1, "blocked": 0, "within_tolerance": 2, "compared": 3}
    assert "tables 1 → 2; full 0 → 2; reduced 1 → 0; blocked 0 → 0; cells within tolerance 2 of 3 compared → " \
        "6 of 6 compared." in page
    assert "| 3 / 3 (before: 2 / 3, reduced) |" in page and "| 3 / 3 (new) |" in page
    shutil.rmtree(tmp_path / ".git")  # the page reads the kept snapshot, not git
    assert report.render(tmp_path / "results") == page


def test_the_backfill_reads_a_generated_table_back_to_its_numbers(tmp_path):
    md, written = _table(tmp_path, steps=40)
    path = tmp_path / "results" / "p" / "t1.md"
    path.with_suffix(".json").unlink()
    path.write_text("\n".join(line for line in md.splitlines() if not line.startswith("**Status:")) + "\n")
    parsed = backfill.backfill(path, tmp_path / "spec.yaml")
    assert parsed["source"] == backfill.SOURCE and parsed["status_line"] == written["status_line"]
    for key in ("commits", "hardware", "torch", "seeds", "runs_completed", "runs_failed", "steps"):
        assert parsed["provenance"][key] == written["provenance"][key], key
    for ours, theirs in zip(parsed["long"], written["long"], strict=True):
        for key, value in theirs.items():
            if key == "n_done":  # not in a table's Markdown: a backfilled cell has only the runs with a value
                assert ours[key] is None
                continue
            assert ours[key] == (round(value, 2) if isinstance(value, float) else value), key
    assert path.read_text() == md  # the status line is back where write_markdown puts it
    backfill.backfill(path, tmp_path / "spec.yaml")
    assert path.read_text() == md  # and again: nothing changes


def test_every_spec_says_what_the_paper_ran():
    for spec_path in sorted((REPO / "experiments").glob("*/*.yaml")):
        proto = status.protocol(tables.load_spec(spec_path))
        assert proto and set(proto) <= {"length", "steps", "runs", "hardware", "data"}, spec_path.name
        assert ("steps" in proto) == ("length" in proto), spec_path.name


@pytest.mark.parametrize("md, spec", tables.committed_tables(REPO / "experiments"), ids=lambda x: str(x))
def test_committed_tables_open_with_their_status_and_have_a_sidecar(md, spec):
    md = REPO / md if not md.is_absolute() else md
    if not md.is_file():
        pytest.skip(f"{md} not committed")
    assert md.read_text().splitlines()[2].startswith("**Status: ")
    assert json.loads(md.with_suffix(".json").read_text())["format"] == status.SIDECAR_FORMAT


def test_results_readme_is_current():
    assert (REPO / "results" / "README.md").read_text() == report.render(REPO / "results")


def test_the_papers_figure_goes_beside_ours_once():
    proto = {"length": "10,000 steps", "steps": 10000, "runs": 4}
    lines = status.annotate(["- seeds: 1", "- training steps per run: 5", "- torch: 2"], proto)
    assert lines == [
        "- seeds: 1 (paper: 4 run(s) per number)",
        "- training steps per run: 5 (paper: 10,000 steps)",
        "- torch: 2",
    ]
    assert status.annotate(lines, proto) == lines
