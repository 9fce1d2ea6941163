"""bench/tables.py without timing anything that matters: the grids it times are the sweeps' jobs, one configuration
is timed through train.py's parts on the CPU, and the sheet renders (the benchmark itself runs in gpu_check.sh)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from scripts import campaign
from tests.helpers import ROOT

_spec = importlib.util.spec_from_file_location("bench_tables", ROOT / "bench" / "tables.py")
bench = sys.modules["bench_tables"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.mark.parametrize("table,configs,runs", [
    ("spigot/table3_sst", 9, 27),  # 9 methods x 3 seeds
    ("spigot/table2", 26, 104),  # glob(synthetic_*) = 13 methods x K in {3, 10} x 4 seeds
    ("energy/mlc", 14, 42),  # the spec's dataset=bibtex,delicious replaces the sweep's default
    ("direct/sorting", 24, 480),  # seeds range(301,321)
    ("listops/table", 14, 42),  # two sweeps
])
def test_the_grid_is_the_sweeps_jobs_without_their_seeds(table, configs, runs):
    cells = bench.cells(table)
    assert len(cells) == configs and sum(c.seeds for c in cells) == runs
    assert len({tuple(c.overrides) for c in cells}) == configs and all(c.experiment for c in cells)
    if table == "energy/mlc":
        assert {o for c in cells for o in c.overrides if o.startswith("dataset=")} == {"dataset=bibtex",
                                                                                      "dataset=delicious"}


def test_a_configuration_is_timed_per_phase_and_the_sheet_renders():
    args = argparse.Namespace(warmup=1, min_seconds=0.0, max_steps=2)
    cell = bench.cells("spigot/table2")[0]
    cell.overrides += ["dataset.n_train=200", "dataset.n_valid=50", "dataset.n_test=50"]
    bench.time_cell(cell, torch.device("cpu"), {}, args)
    assert cell.status == "timed" and cell.steps == [10000] and cell.evaluations == 20  # eval every 500 steps
    assert cell.s_per_step[0] > 0 and cell.run_seconds == pytest.approx(10000 * cell.s_per_step[0]
                                                                        + 20 * cell.s_eval)
    other = bench.Cell("spigot/table2", cell.sweep, ["+experiment=x"], 4, cell.experiment)  # a sibling, untimed
    lost = bench.Cell("spigot/table2", cell.sweep, ["+experiment=y"], 4, "y")
    everything = [cell, other, lost]
    bench._estimate(everything)
    assert other.status == "estimated" and other.run_seconds == cell.run_seconds and lost.status == "untimed"
    (summary,) = bench.summarise(everything)
    assert summary["runs"] == 12 and not summary["complete"] and summary["sessions_at_least"] is None
    assert summary["device_hours"] == pytest.approx(8 * cell.run_seconds / 3600)
    sheet = {"tables": [summary], "configs": [vars(c) for c in everything]}
    lines = bench.render(sheet)
    assert lines[2].startswith("| spigot/table2 | 12 | 4 / 4 / 0 / 0 / 0 / 4 |") and "(lower bound)" in lines[2]
    assert any(line.startswith("| +experiment=x | 4 |") and "≈ " in line for line in lines)


def test_a_configuration_over_its_memory_or_time_is_killed_and_said(tmp_path):
    """The watch that keeps one configuration from taking the machine down (its own process, capped)."""
    hog = [sys.executable, "-c", "import time; b = bytearray(600 * 2**20); time.sleep(30)"]
    code, killed, peak = bench.watch(hog, {}, tmp_path / "log", memory_gib=0.25, timeout=20)
    assert killed == "memory" and peak > 0.25 and code != 0
    code, killed, _ = bench.watch([sys.executable, "-c", "import time; time.sleep(30)"], {}, tmp_path / "log",
                                  memory_gib=1, timeout=0.5)
    assert killed == "time" and code != 0
    code, killed, _ = bench.watch(hog, {}, tmp_path / "log", memory_gib=8, timeout=20, hard_gib=0.3)
    assert killed is None and code == 1 and "MemoryError" in (tmp_path / "log").read_text()  # the address space cap


def test_a_configuration_killed_for_time_is_estimated_from_its_steps_and_rendered(monkeypatch):
    cell = bench.Cell("spigot/table2", "s", ["+experiment=e"], 3, "e")
    args = argparse.Namespace(device="cpu", warmup=2, min_seconds=1.0, max_steps=40, threads=1, memory_gib=8.0)

    def child(cmd, env, log, memory_gib, timeout, hard_gib):  # killed in phase 2 after 2 steps of 10 s
        done = bench.Cell(**{**json.loads(Path(cmd[cmd.index("--one") + 1]).read_text()), "steps": [100, 50],
                             "s_per_step": [0.5], "partial": [1, 2, 20.0], "peak_rss_gib": 1.5})
        Path(cmd[cmd.index("--one") + 1]).write_text(json.dumps(vars(done)))
        return -9, "time", 1.2

    monkeypatch.setattr(bench, "watch", child)
    bench.time_isolated(cell, args, timeout=300)
    assert cell.status == "time" and cell.run_seconds == pytest.approx(100 * 0.5 + 50 * 10.0)
    assert cell.error == "over 300 s (1 phase(s) timed); phase 2: 2 step(s) in 20 s" and cell.peak_rss_gib == 1.5
    (summary,) = bench.summarise([cell])
    assert summary["runs_time"] == 3 and summary["over_time"] == ["+experiment=e"] and not summary["complete"]
    lines = bench.render({"tables": [summary], "configs": [vars(cell)]})
    assert lines[-1].endswith("| 1.5 | ~ 9.2 (over 300 s (1 phase(s) timed); phase 2: 2 step(s) in 20 s) |")


def test_the_cpu_plan_page_says_the_load_what_does_not_fit_and_what_we_will_run(monkeypatch, tmp_path):
    timed = bench.Cell("spigot/table2", "s", ["+experiment=a"], 4, "a", status="timed", steps=[100], per_epoch=[10],
                       s_per_step=[0.9], evaluations=2, s_eval=5.0, run_seconds=100.0, peak_rss_gib=0.5,
                       load=[3.0, 7.5])
    hog = bench.Cell("spigot/table2", "s", ["+experiment=b"], 4, "b", status="memory", error="over 8 GiB",
                     peak_rss_gib=8.1, load=[7.5, 2.0])
    monkeypatch.setattr(bench, "_plan_of", lambda table: {"run": "1 of 4 seeds", "cpu_hours": 0.25,
                                                          "note": "steps timed at initialisation"})
    monkeypatch.setattr(campaign, "STATE", tmp_path / "no campaign")
    cells = [timed, hog]
    sheet = {"tables": bench.summarise(cells), "configs": [vars(c) for c in cells], "cpu_cores": 2, "cpu": "AMD EPYC",
             "options": {"memory_gib": 8.0, "config_seconds": 600.0}, "git_commit": "abc", "seconds": 60}
    lines = bench.page(sheet)
    assert lines[2].startswith("**Status: 1 of 2 configurations timed** (0 failed, 1 over 8 GiB, 0 over 600 s, "
                               "0 not reached) on 2 shared CPU cores (AMD EPYC), load average 2.0–7.5")
    assert "## What the campaign's runs took, against this plan" not in lines  # none here
    row = next(line for line in lines if line.startswith("| spigot/table2 |"))
    assert row == "| spigot/table2 | 8 | 4 / 0 / 0 / 4 / 0 / 0 | 0.1 (lower bound) | 0.03 | 1 of 4 seeds | 0.2 |"
    assert "- spigot/table2 `+experiment=b`: over 8 GiB, peak 8.1 GiB resident" in lines
    assert lines[lines.index(row) + 2] == "- spigot/table2: steps timed at initialisation"  # the plan's note
    lab = lines[lines.index("## The lab") + 2]  # the lab's runs counted from its grid, its hours from its spec
    assert "1,375 runs" in lab and "3.1 CPU-hours" in lab
    cost = tmp_path / "matrix.json"  # and what it cost, when make table-lab-matrix has written it
    monkeypatch.setattr(bench, "LAB_COST", cost)
    assert "Measured" not in bench.page(sheet)[lines.index("## The lab") + 2]
    cost.write_text(json.dumps({"runs": 1375, "completed": 1370, "wall_seconds": 19800.0, "commits": ["abc"]}))
    lab = bench.page(sheet)[lines.index("## The lab") + 2]
    assert "Measured (results/lab/matrix.md, `make table-lab-matrix`, commit(s) abc): 1,375 runs (1,370 completed), " \
           "5.5 hours of training summed over the runs" in lab


def test_the_plan_hours_come_from_the_configurations_the_plan_runs():
    """A spec's cpu_plan: its own cpu_hours where it states a number, else the sheet's times of the configurations
    its `only` patterns match, `seeds` runs each where it says; unknown while one of them has no time."""
    def config(table, overrides, status="timed", seconds=3600.0, seeds=3):
        return {"table": table, "overrides": overrides, "status": status, "run_seconds": seconds, "seeds": seeds}

    configs = [config("a/t", ["+experiment=x_crf"]), config("a/t", ["+experiment=x_cd"], seconds=36000.0),
               config("b/t", ["+experiment=y"], status="memory", seconds=None)]
    assert bench._plan_hours(configs, "a/t", {"run": "all"}) == 33.0
    assert bench._plan_hours(configs, "a/t", {"run": "crf", "only": ["*x_crf*"]}) == 3.0
    assert bench._plan_hours(configs, "a/t", {"run": "crf", "only": ["*x_crf*"], "seeds": 20}) == 20.0
    assert bench._plan_hours(configs, "a/t", {"run": "said", "cpu_hours": 1.5}) == 1.5
    assert bench._plan_hours(configs, "b/t", {"run": "all"}) is None  # over memory: no time
    assert bench._plan_hours(configs, "a/t", {}) is None  # no plan


def test_one_configuration_per_experiment_is_timed_its_siblings_estimated_and_skipped_ones_left(monkeypatch):
    def timed(cell, args, timeout):
        cell.status, cell.run_seconds = "timed", 60.0

    monkeypatch.setattr(bench, "time_isolated", timed)
    args = argparse.Namespace(device="cpu", tables=["energy/mlc"], max_configs=None, deadline=None, out=None,
                              skip=["*mlc_mbce*"], resume=False, max_per_experiment=1, config_seconds=600.0,
                              warmup=2, min_seconds=1.0, max_steps=40, memory_gib=8.0, threads=1)
    sheet = bench.run(args)
    statuses = [c["status"] for c in sheet["configs"]]  # 7 methods x bibtex, delicious
    assert statuses.count("timed") == 6 and statuses.count("estimated") == 6 and statuses.count("untimed") == 2
    assert sheet["tables"][0]["device_hours"] == pytest.approx(36 * 60 / 3600) and not sheet["tables"][0]["complete"]


def test_the_evaluation_can_be_timed_on_the_first_examples_and_scaled():
    split = {"x": torch.zeros(50, 3), "y": torch.zeros(50), "table": torch.zeros(7)}
    heads, scale = bench._heads({"valid": split, "test": {"x": torch.zeros(30, 2)}}, 10)
    assert heads["valid"]["x"].shape == (10, 3) and heads["valid"]["table"].shape == (7,) and scale == 4.0
    assert bench._heads({"valid": split}, None)[1] == 1.0 and bench._heads({"valid": split}, 80)[1] == 1.0
    args = argparse.Namespace(warmup=1, min_seconds=0.0, max_steps=1, eval_examples=10)
    cell = bench.cells("spigot/table2")[0]
    cell.overrides += ["dataset.n_train=200", "dataset.n_valid=50", "dataset.n_test=50"]
    bench.time_cell(cell, torch.device("cpu"), {}, args)
    assert cell.status == "timed" and cell.eval_scale == 5.0


def test_a_resumed_sheet_keeps_the_earlier_sheets_tables_and_times_only_those_asked(monkeypatch, tmp_path):
    """Resuming with other --tables keeps the earlier sheet's tables as measured (an earlier table's untimed
    configurations stay untimed) and names the sheet it resumed."""
    calls = []

    def mlc(sheet):
        return [c["status"] for c in sheet["configs"] if c["table"] == "energy/mlc"]

    def timed(cell, args, timeout):
        calls.append(cell.table)
        cell.status, cell.run_seconds = "timed", 60.0

    monkeypatch.setattr(bench, "time_isolated", timed)
    out = tmp_path / "timing.json"
    args = argparse.Namespace(device="cpu", tables=["energy/mlc"], max_configs=1, deadline=None, out=out,
                              skip=None, resume=False, max_per_experiment=None, config_seconds=600.0,
                              warmup=2, min_seconds=1.0, max_steps=40, memory_gib=8.0, threads=1)
    bench.run(args)
    first = json.loads(out.read_text())
    assert calls == ["energy/mlc"] and first["resumed"] == []
    args.tables, args.resume, args.max_configs, calls[:] = ["direct/sorting"], True, 2, []
    sheet = bench.run(args)
    assert calls == ["direct/sorting"] * 2
    assert [t["table"] for t in sheet["tables"]] == ["energy/mlc", "direct/sorting"]
    assert mlc(sheet) == mlc(first) and mlc(sheet).count("timed") == 1 and "untimed" in mlc(sheet)
    assert sheet["resumed"] == [{k: first[k] for k in ("git_commit", "hardware", "cpu", "generated")}]
    assert first["git_commit"] in bench.resumed_note(sheet) and bench.resumed_note(first) == ""


def test_retime_times_the_matching_configurations_again_and_the_page_names_their_commit(monkeypatch, tmp_path):
    """--retime PATTERN with --resume: the asked table's configurations matching it are timed again (the others are
    kept), each records the commit it was timed at, and the note names the configurations timed at a later one."""
    calls = []

    def timed(cell, args, timeout):
        calls.append(" ".join(cell.overrides))
        cell.status, cell.run_seconds = "timed", 60.0

    monkeypatch.setattr(bench, "time_isolated", timed)
    monkeypatch.setattr(bench, "_commit", lambda env: "a" * 12)
    out = tmp_path / "timing.json"
    args = argparse.Namespace(device="cpu", tables=["energy/ner"], max_configs=None, deadline=None, out=out,
                              skip=None, resume=False, max_per_experiment=1, config_seconds=600.0, retime=None,
                              warmup=2, min_seconds=1.0, max_steps=40, memory_gib=8.0, threads=1)
    first = bench.run(args)
    bench._write(out, first)
    assert len(calls) == 9 and {c["commit"] for c in first["configs"] if c["status"] == "timed"} == {"a" * 12}
    monkeypatch.setattr(bench, "_commit", lambda env: "b" * 12)
    args.resume, args.retime, calls[:] = True, ["*ner_infnet*"], []
    sheet = bench.run(args)
    assert calls == [f"+experiment={name} dataset.features=False" for name in ("ner_infnet", "ner_infnet_plus")]
    commits = {" ".join(c["overrides"]): c["commit"] for c in sheet["configs"] if c["status"] == "timed"}
    assert commits["+experiment=ner_infnet dataset.features=False"] == "b" * 12
    assert commits["+experiment=ner_mbce dataset.features=False"] == "a" * 12  # kept as timed
    sheet["resumed"][-1]["git_commit"] = "a" * 12  # the first sheet's commit (here a test's checkout)
    note = bench.resumed_note(sheet)
    assert f"Timed at {'b' * 12} (" in note and "energy/ner `ner_infnet` (1 configuration)" in note
    assert "ner_mbce" not in note.split("Timed at")[1]


def test_the_campaigns_runs_are_set_against_the_plan_for_the_same_configurations(tmp_path):
    """cpu.md's campaign section: each completed run in a table's committed records is matched to the sheet's
    configuration it ran (its overrides among the run's), and its wall clock summed against that configuration's
    planned run; a configuration more than twice off is listed; an interrupted run is not counted."""
    import io
    import tarfile

    state = tmp_path / "direct-sorting"
    state.mkdir()
    (state / "plan.json").write_text(json.dumps({"table": "direct/sorting", "commit": "a" * 40}))
    method = "+experiment=sorting_direct_sigma0"
    runs = {"d5,s1": ([method, "dataset.num_items=5", "trainer.seed=1"], "completed", 10),
            "d5,s2": ([method, "dataset.num_items=5", "trainer.seed=2"], "completed", 14),
            "d100,s1": ([method, "dataset.num_items=100", "trainer.seed=1"], "completed", 300),
            "d100,s2": ([method, "dataset.num_items=100", "trainer.seed=2"], "interrupted", 9999)}
    with tarfile.open(state / "records.tar.gz", "w:gz") as tar:
        for name, (overrides, status, seconds) in runs.items():
            for path, text in ((f"runs/{name}/metrics.json", json.dumps({"status": status, "wall_seconds": seconds})),
                               (f"runs/{name}/.hydra/overrides.yaml", "".join(f"- {o}\n" for o in overrides))):
                info = tarfile.TarInfo(path)
                info.size = len(text.encode())
                tar.addfile(info, io.BytesIO(text.encode()))
    configs = [{"table": "direct/sorting", "overrides": [method], "run_seconds": 1.0,
                "status": "timed"}]  # matches too, with fewer overrides: the closer configuration wins
    configs += [{"table": "direct/sorting", "overrides": [method, f"dataset.num_items={d}"],
                 "run_seconds": 12.0, "status": "timed" if d == 5 else "estimated"} for d in (5, 100)]
    (cost,) = bench.campaign_costs(configs, state=tmp_path)
    assert cost["runs"] == 3 and cost["hours"] == 324 / 3600 and cost["planned"] == 36 / 3600 and cost["ratio"] == 9
    lines = bench.campaign_spent([cost])
    assert f"| direct/sorting | 3 | {324 / 3600:.1f} | {324 / 3600:.1f} | {36 / 3600:.1f} | 9.0× | 9.0× |" in lines
    (off,) = [line for line in lines if "num_items=" in line]  # d=5 took 12 s, as planned
    assert "num_items=100` | 1 | 300 | 12 (estimated) | 25.0× |" in off
    assert bench.campaign_costs(configs, state=tmp_path / "none") == [] and bench.campaign_spent([]) == []


def test_what_remains_is_the_plans_runs_less_the_completed_ones_forecast_from_their_runs(tmp_path, monkeypatch):
    """cpu.md's last campaign section: per table the plan's runs (configurations × its seeds), those completed in the
    committed records (a GPU machine's too), and the rest's CPU-hours, a configuration's median run where it has one,
    else its sheet time scaled by the table's took / plan; untimed configurations leave the forecast open."""
    import io
    import tarfile

    def pack(folder, runs):
        folder.mkdir(parents=True)
        with tarfile.open(folder / "records.tar.gz", "w:gz") as tar:
            for name, (overrides, seconds) in runs.items():
                # four evaluations 100 steps apart, one of them slowed 5x by other work: its steady pace is the rest's
                paces = [1.0, 5.0, 1.0, 1.0] if seconds == 720 else [seconds / 400] * 4
                walls = [sum(paces[:i + 1]) * 100 for i in range(4)]
                history = "step,wall_seconds\n" + "".join(f"{100 * (i + 1)},{w}\n" for i, w in enumerate(walls))
                for path, text in ((f"{name}/metrics.json",
                                    json.dumps({"status": "completed", "wall_seconds": seconds})),
                                   (f"{name}/history.csv", history),
                                   (f"{name}/.hydra/overrides.yaml", "".join(f"- {o}\n" for o in overrides))):
                    info = tarfile.TarInfo(path)
                    info.size = len(text.encode())
                    tar.addfile(info, io.BytesIO(text.encode()))

    a, b, c = ([f"+experiment={x}"] for x in "abc")
    pack(tmp_path / "p-t", {"a1": ([*a, "trainer.seed=1"], 360), "a2": ([*a, "trainer.seed=2"], 720)})
    (tmp_path / "p-t" / "plan.json").write_text(json.dumps({"table": "p/t"}))
    pack(tmp_path / "device" / "p-t", {"b1": ([*b, "trainer.seed=1"], 5)})  # a GPU's run: counted, not timed
    configs = [{"table": "p/t", "overrides": o, "run_seconds": 180.0, "status": "timed", "seeds": 2} for o in (a, b)]
    configs += [{"table": "p/t", "overrides": c, "run_seconds": None, "status": "untimed", "seeds": 2}]
    monkeypatch.setattr(bench, "_plan_of", lambda table: {"run": "all", "seeds": 3})
    costs = bench.campaign_costs(configs[:2], state=tmp_path)
    assert costs[0]["ratio"] == pytest.approx(3.0)  # 1,080 s of wall clock against 2 × 180 s planned
    # at their steady pace, a2 took 400 s, not 800 (its history's slowed interval does not count): 760 s, not 1,080
    assert costs[0]["steady_ratio"] == pytest.approx(760 / 360)
    (row,) = bench.campaign_remains(configs[:2], [{"table": "p/t"}], costs, state=tmp_path)
    assert (row["runs"], row["completed"], row["left"]) == (6, 3, 3)
    assert row["sheet_hours"] == pytest.approx(3 * 180 / 3600)
    # a: its median run at its steady pace (360 and 400 s); b: the sheet × the steady took / plan
    assert row["forecast_hours"] == pytest.approx((380 + 2 * 180 * 760 / 360) / 3600)
    assert bench._basis(row) == "1 from their runs; 1 by the sheet × 2.1"
    (row,) = bench.campaign_remains(configs, [{"table": "p/t"}], costs, state=tmp_path)
    assert row["left"] == 6 and row["forecast_hours"] is None and bench._basis(row).endswith("1 not timed")
    lines = bench.campaign_left([row])
    assert "| p/t | 9 | 3 | 6 | — | — | 1 from their runs; 1 by the sheet × 2.1; 1 not timed |" in lines

    # a plan at a budget the sheet did not time states its runs and hours: compared with those, as a whole
    monkeypatch.setattr(bench, "_plan_of", lambda table: {"run": "short", "runs": 10, "cpu_hours": 1.0})
    costs = bench.campaign_costs(configs[:2], state=tmp_path)
    assert costs[0]["configs"] == [] and costs[0]["planned"] == pytest.approx(0.2)  # 2 of its 10 runs
    assert costs[0]["steady_each"] == pytest.approx(380)
    (row,) = bench.campaign_remains(configs, [{"table": "p/t"}], costs, state=tmp_path)
    assert (row["runs"], row["completed"], row["left"]) == (10, 2, 8) and row["sheet_hours"] == pytest.approx(0.8)
    assert row["forecast_hours"] == pytest.approx(8 * 380 / 3600)
    assert bench._basis(row) == "8 runs at the median of its runs"
    (row,) = bench.campaign_remains(configs, [{"table": "p/t"}], [], state=tmp_path)
    assert row["forecast_hours"] == pytest.approx(1.0) and bench._basis(row) == "10 runs at the plan's hours"
    # a pinned table the sheet did not time counts where its plan states its runs and hours
    assert bench.unsheeted([{"table": "q/u"}], state=tmp_path) == [{"table": "p/t"}]
    assert bench.unsheeted([{"table": "p/t"}], state=tmp_path) == []


def test_a_runs_steady_pace_is_its_median_interval_not_its_slowed_ones():
    """steady_seconds: the run's steps at the median seconds per step of its evaluation intervals; its wall clock
    when it has fewer than three intervals to take a median of."""
    history = "step,valid/acc,wall_seconds\n10,1,10\n20,1,20\n30,1,130\n40,1,140\n50,1,150\n"
    assert bench.steady_seconds(history, 150.0) == pytest.approx(50.0)
    assert bench.steady_seconds("step,wall_seconds\n10,10\n20,90\n", 90.0) == 90.0
    assert bench.steady_seconds("", 7.0) == 7.0
