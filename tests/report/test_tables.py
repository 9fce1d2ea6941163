"""latentstruct.report.tables and latentstruct.report.figures on fake run records (DESIGN.md §7 formats)."""

import json
import math
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from latentstruct.report import figures, reproduce, tables, trees
from scripts import migrate_experiment_names
from tests.helpers import ROOT as REPO
from tests.helpers import methods

SPECS = sorted(p.relative_to(REPO / "experiments").with_suffix("").as_posix()
               for p in (REPO / "experiments").glob("*/*.yaml"))


def _run(root: Path, name: str, experiment: str, *, k: int = 3, acc: float = 90.0, vm: float = 80.0,
         valid: float | None = None, seed: int = 1, status: str = "completed", steps: int = 1,
         eta: float = 1.0, history: bool = False) -> Path:
    """A run directory as train.py leaves it: .hydra/{config,hydra}.yaml, metrics.json, history.csv."""
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    config = {"seed": seed, "dataset": {"num_clusters": k, "dim": 2, "data_dir": "${paths.data_dir}"},
              "task": {"_target_": "x.Task", "estimator": {"_target_": "x.Y", "eta": eta, "steps": steps}},
              "paths": {"data_dir": "data"}}
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    choices = {"experiment": experiment, "estimator": "spigot", "hydra/launcher": "basic"}
    hydra = {"hydra": {"run": {"dir": "outputs"}, "job": {"name": "train"},
                       "runtime": {"version": "1.3.2", "choices": choices}}}
    (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
    metrics = {} if status != "completed" else {"valid/acc": acc if valid is None else valid,
                                                "valid/v_measure": vm, "test/acc": acc, "test/v_measure": vm}
    record = {"status": status, "metrics": metrics, "best_epoch": 0, "best_step": 100, "seed": seed,
              "git_commit": "abc1234", "hardware": "cpu", "torch": "2.13.0+cpu", "wall_seconds": 10.0 * seed,
              "error": None if status == "completed" else "RuntimeError: boom"}
    (run / "metrics.json").write_text(json.dumps(record))
    if history:
        steps_ = [0, 50, 100]
        pd.DataFrame({"step": steps_, "train/loss": [1.0, 0.5, 0.2], "valid/acc": [50, 70, acc],
                      "valid/v_measure": [0, 40, vm], "test/acc": [50, 70, acc],
                      "test/v_measure": [0, 40, vm]}).to_csv(run / "history.csv", index=False)
    return run


def _spec(tmp_path: Path, paper_acc: float = 92.0, paper_err: float = 0.0) -> Path:
    (tmp_path / "reference.csv").write_text(
        "table,row,setting,metric,value,error,error_kind,n_runs\n"
        f"t1,spigot,K=3,test/acc,{paper_acc},{paper_err},se,4\n"
        "t1,spigot,K=3,test/v_measure,20.53,1.85,se,4\n"
        "t1,other,K=3,test/acc,50.00,0.00,se,4\n")
    spec = {"paper": "p", "table": "t1", "title": "Fake table", "reference": "reference.csv",
            "command": "make table-fake", "aggregate": "median_se",
            "tolerance": {"abs": 3.0, "err_factor": 2.0},
            "metrics": [{"name": "test/acc", "label": "Accuracy"}, {"name": "test/v_measure", "label": "V"}],
            "settings": [{"name": "K=3", "match": {"dataset.num_clusters": 3}}],
            "rows": [{"name": "spigot", "label": "SPIGOT",
                      "match": {"choices.experiment": "synthetic_spigot"}},
                     {"name": "other", "label": "Other", "match": {"choices.experiment": "synthetic_other"}}],
            "notes": ["a protocol deviation"]}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, allow_unicode=True))
    return path


def _four_runs(root: Path, shift: float = 0.0) -> None:
    for seed, acc in enumerate([90.0, 91.0, 93.0, 96.0], start=1):
        _run(root, f"r{seed}", "synthetic_spigot", acc=acc + shift, seed=seed)
    _run(root, "k10", "synthetic_spigot", k=10, acc=10.0)  # another setting: must not leak into K=3


def test_load_runs_flattens(tmp_path):
    _run(tmp_path / "runs", "a/b/0", "synthetic_spigot", acc=91.5, seed=7)
    runs = tables.load_runs(tmp_path / "runs")
    assert len(runs) == 1
    r = runs.iloc[0]
    assert r["dataset.num_clusters"] == 3 and r["task.estimator.eta"] == 1.0 and r["task.estimator._target_"] == "x.Y"
    assert r["dataset.data_dir"] == "${paths.data_dir}"  # interpolations kept as text
    assert r["choices.experiment"] == "synthetic_spigot" and r["choices.hydra/launcher"] == "basic"
    assert r["metric.test/acc"] == 91.5 and r["metric.valid/v_measure"] == 80.0
    assert r["seed"] == 7 and r["git_commit"] == "abc1234" and r["torch"] == "2.13.0+cpu"
    assert r["status"] == "completed" and bool(r["completed"]) and r["best_epoch"] == 0
    assert Path(r["run_dir"]) == tmp_path / "runs" / "a" / "b" / "0"


def test_load_runs_flattens_the_config_as_the_run_records_do(tmp_path):
    """One flatten (latentstruct.records) for tables, resuming and the ListOps report: an empty dict gives no column."""
    run = _run(tmp_path / "runs", "a", "synthetic_spigot")
    config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({**config, "optim_groups": {}, "tuned": {"k3": 0.5}}))
    r = tables.load_runs(tmp_path / "runs").iloc[0]
    assert "optim_groups" not in r and r["tuned.k3"] == 0.5 and r["dataset.num_clusters"] == 3


def _old_layout_run(root: Path, name: str, eta: float, acc: float, seed: int) -> Path:
    """A run record as the code before the nested task wrote it (commit 8eb003f and earlier): the model parts at the
    top level of .hydra/config.yaml and of run.json's identity (a part the task did not take: null), the
    fingerprint of that identity in run.json and metrics.json."""
    from latentstruct.records import fingerprint, identity

    run = _run(root, name, "synthetic_spigot", acc=acc, seed=seed, eta=eta)
    config = {"dataset": {"num_clusters": 3, "dim": 2}, "encoder": {"_target_": "x.Identity"},
              "estimator": {"_target_": "x.Y", "eta": eta, "steps": 1}, "decoder": None, "sigma_net": None,
              "task": {"_target_": "x.Task"}, "trainer": {"seed": seed}, "paths": {"data_dir": "data"}}
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    ident = identity(config)
    fp = fingerprint(ident)
    (run / "run.json").write_text(json.dumps({"fingerprint": fp, "identity": ident}))
    record = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").write_text(json.dumps({**record, "fingerprint": fp}))
    return run


def test_a_record_of_the_old_layout_is_read_as_nested_and_matched_by_the_new_keys(tmp_path):
    """Records made before the model parts moved under the task (top-level ``estimator.eta``) are read as the
    current layout (latentstruct.records.nested): a spec's ``task.estimator.eta`` matches them, their run.json still
    agrees with their config, and their null part slots give no column."""
    for seed, (eta, acc) in enumerate([(0.1, 90.0), (0.1, 92.0), (1.0, 50.0)], start=1):
        _old_layout_run(tmp_path / "runs", f"r{seed}", eta, acc, seed)
    runs = tables.load_runs(tmp_path / "runs")
    assert set(runs["task.estimator.eta"]) == {0.1, 1.0} and set(runs["task.encoder._target_"]) == {"x.Identity"}
    assert not {"estimator.eta", "encoder._target_", "decoder", "sigma_net", "task.decoder"} & set(runs.columns)
    assert len(tables.filter_runs(runs, {"task.estimator.eta": 0.1})) == 2
    spec = tables.load_spec(_spec(tmp_path))
    spec["rows"][0]["match"] = {"choices.experiment": "synthetic_spigot", "task.estimator.eta": 0.1}
    cell = tables.build_table(spec, runs).set_index(["row", "metric"]).loc[("spigot", "test/acc")]
    assert cell["n_runs"] == 2 and cell["ours"] == pytest.approx(91.0)
    # a record whose config and run.json disagree is still refused, in either layout
    run = tmp_path / "runs" / "r1"
    config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    config["estimator"]["eta"] = 5.0
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match=r"task.estimator.eta: 0.1 \(run.json\) ≠ 5.0"):
        tables.load_runs(tmp_path / "runs")


def test_median_and_standard_error(tmp_path):
    _four_runs(tmp_path / "runs")
    df = tables.build_table(_spec(tmp_path), tmp_path / "runs")
    cell = df.set_index(["row", "setting", "metric"]).loc[("spigot", "K=3", "test/acc")]
    # values 90, 91, 93, 96: median 92; mean 92.5, squared deviations sum 21, var (ddof=1) 7, se = sqrt(7)/2
    assert cell["ours"] == pytest.approx(92.0)
    assert cell["ours_err"] == pytest.approx(math.sqrt(7) / 2)
    assert cell["n_runs"] == 4 and cell["paper"] == 92.0 and cell["diff"] == pytest.approx(0.0)
    vm = df.set_index(["row", "metric"]).loc[("spigot", "test/v_measure")]
    assert vm["ours_err"] == 0.0 and vm["agrees"] is False  # 80 vs 20.53
    other = df.set_index(["row", "metric"]).loc[("other", "test/acc")]
    assert other["n_runs"] == 0 and other["agrees"] is None
    assert tables.aggregate([5.0]) == (5.0, 0.0)
    assert tables.aggregate([1.0, 3.0], "mean_std") == pytest.approx((2.0, math.sqrt(2)))


@pytest.mark.parametrize("shift, agrees", [(2.9, True), (-2.9, True), (3.1, False), (-3.1, False)])
def test_verdict_flips_outside_tolerance(tmp_path, shift, agrees):
    # median 92 + shift; 2 * se = 2.65 < 3, so the 3-point floor decides
    _four_runs(tmp_path / "runs", shift=shift)
    df = tables.build_table(_spec(tmp_path), tmp_path / "runs")
    assert df.set_index(["row", "metric"]).loc[("spigot", "test/acc"), "agrees"] is agrees


def test_tolerance_widens_with_paper_error(tmp_path):
    _four_runs(tmp_path / "runs", shift=6.0)  # |diff| 6 <= 2 * hypot(1.32, 4) = 8.4
    df = tables.build_table(_spec(tmp_path, paper_err=4.0), tmp_path / "runs")
    cell = df.set_index(["row", "metric"]).loc[("spigot", "test/acc")]
    assert cell["agrees"] is True and cell["tol"] == pytest.approx(2 * math.hypot(math.sqrt(7) / 2, 4.0))


def test_failed_runs_excluded_and_counted(tmp_path):
    _four_runs(tmp_path / "runs")
    _run(tmp_path / "runs", "crashed", "synthetic_spigot", status="failed", seed=9)
    runs = tables.load_runs(tmp_path / "runs")
    assert len(runs) == 6 and (~runs["completed"]).sum() == 1
    df = tables.build_table(_spec(tmp_path), runs)
    cell = df.set_index(["row", "metric"]).loc[("spigot", "test/acc")]
    assert cell["n_runs"] == 4 and cell["n_failed"] == 1 and cell["ours"] == pytest.approx(92.0)
    out = tables.write_markdown(df, tables.load_spec(_spec(tmp_path)), tmp_path / "out" / "t1.md", runs)
    assert "4 completed, 1 failed" in out.read_text() and "(4, 1 failed)" in out.read_text()
    assert "**Failed runs: 1.**" in out.read_text() and "- 1 × RuntimeError: boom" in out.read_text()
    _run(tmp_path / "runs", "stopped", "synthetic_spigot", status="interrupted", seed=10)
    runs = tables.load_runs(tmp_path / "runs")
    df = tables.build_table(_spec(tmp_path), runs)
    assert df.set_index(["row", "metric"]).loc[("spigot", "test/acc"), "n_failed"] == 1  # the crash, not the stop
    text = tables.write_markdown(df, tables.load_spec(_spec(tmp_path)), tmp_path / "out" / "t1.md", runs).read_text()
    assert "4 completed, 1 failed, 1 interrupted (each resumes when run again)" in text
    assert "- host CPU model(s), runs each: not recorded (6)" in text  # the helper's records name no CPU
    assert "**Failed runs: 1.**" in text and "(4, 1 failed)" in text  # an interrupted run is not a failure


def test_provenance_counts_the_runs_of_each_host_cpu():
    used = pd.DataFrame({"run_dir": list("abcd"), "status": ["completed"] * 3 + ["interrupted"],
                         "completed": [True] * 3 + [False], "cpu": ["Xeon", "EPYC", "Xeon", None],
                         "wall_seconds": [1.0, 2.0, 3.0, None]})
    assert "- host CPU model(s), runs each: Xeon (2), EPYC (1), not recorded (1)" in tables.provenance(used, "make x")


def test_a_table_of_failed_runs_only_needs_allow_empty_and_lists_their_errors(tmp_path):
    _run(tmp_path / "runs", "crashed", "synthetic_spigot", status="failed", seed=9)
    args = [str(_spec(tmp_path)), "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "o.md")]
    with pytest.raises(SystemExit, match="no completed run"):
        tables.main(args)
    assert tables.main([*args, "--allow-empty"]) == 0
    text = (tmp_path / "o.md").read_text()
    assert "0 completed, 1 failed" in text and "RuntimeError: boom" in text


def test_provenance_keys_list_the_values_the_runs_used(tmp_path):
    _four_runs(tmp_path / "runs")
    spec = tables.load_spec(_spec(tmp_path))
    spec["provenance_keys"] = {"dataset.dim": "feature size", "dataset.absent": "absent key"}
    runs = tables.load_runs(tmp_path / "runs")
    text = tables.write_markdown(tables.build_table(spec, runs), spec, tmp_path / "o.md", runs).read_text()
    assert "- feature size (`dataset.dim`): 2" in text and "- absent key (`dataset.absent`): —" in text


def test_markdown_has_paper_numbers_and_provenance(tmp_path):
    _four_runs(tmp_path / "runs", shift=10.0)
    spec_path = _spec(tmp_path)
    out = tmp_path / "results" / "p" / "t1.md"
    assert tables.main([str(spec_path), "--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# Fake table")
    for needle in ("92.00 ± 0.00", "20.53 ± 1.85", "**102.00** ± 1.32 (4)", "abc1234", "cpu", "2.13.0+cpu",
                   "make table-fake", "a protocol deviation", "✗", "SPIGOT, K=3, test/acc", "per seed:",
                   "100.00 total, 25.00 median"):
        assert needle in text, needle
    assert "Other" in text  # a row without runs is still shown


def test_the_provenance_gives_the_cpu_share_of_the_runs_that_recorded_it(tmp_path):
    """A run's record has its process's CPU time beside its wall clock; the provenance sums them over the runs that
    recorded both (older runs did not), so that a table built from runs that other work starved says so."""
    _four_runs(tmp_path / "runs")
    for seed, cpu in ((1, 5.0), (2, 5.0)):  # of 10 and 20 wall seconds; runs 3 and 4 recorded none
        path = tmp_path / "runs" / f"r{seed}" / "metrics.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "cpu_seconds": cpu}))
    out = tmp_path / "t1.md"
    assert tables.main([str(_spec(tmp_path)), "--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert ("100.00 total, 25.00 median per run; CPU seconds 10.00 over the 2 run(s) that recorded them (0.33 of "
            "their wall clock)") in out.read_text()
    done = pd.DataFrame({"wall_seconds": [10.0], "cpu_seconds": [None]})
    assert tables._cpu_share(done) == tables._cpu_share(done.drop(columns="cpu_seconds")) == ""


def test_cli_fails_without_matching_runs(tmp_path):
    _run(tmp_path / "runs", "x", "synthetic_unrelated")
    with pytest.raises(SystemExit) as exc:
        tables.main([str(_spec(tmp_path)), "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "o.md")])
    assert exc.value.code not in (0, None) and "no completed run" in str(exc.value.code)


def test_spigot_spec_covers_reference():
    spec = tables.load_spec(REPO / "experiments" / "spigot" / "table2.yaml")
    ref = pd.read_csv(spec["reference_path"], dtype=str)
    ref = ref[ref["table"] == "table2"]
    assert len(ref) == 52 and set(ref["error_kind"]) == {"se"} and set(ref["n_runs"]) == {"4"}
    cells = {(r["name"], s["name"], m["name"])
             for r in spec["rows"] for s in spec["settings"] for m in spec["metrics"]}
    assert cells == set(zip(ref["row"], ref["setting"], ref["metric"], strict=True))
    df = tables.build_table(spec, pd.DataFrame())  # no runs: every cell known to the paper, none judged
    assert df["paper"].notna().all() and df["agrees"].isna().all()


@pytest.mark.parametrize("name", ["table3_sst", "table3_snli"])
def test_table3_specs_cover_the_reference(name):
    """Table 3 (seed 001): 9 rows × valid / test accuracy, mean ± std over 3 runs; Table 4's runtimes."""
    spec = tables.load_spec(REPO / "experiments" / "spigot" / f"{name}.yaml")
    ref = pd.read_csv(spec["reference_path"], dtype=str)
    acc = ref[ref["table"] == name]
    assert len(acc) == 18 and set(acc["error_kind"]) == {"std"} and set(acc["metric"]) == {"valid/acc", "test/acc"}
    df = tables.build_table(spec, pd.DataFrame())
    judged = df[df["metric"] != "test/depth"]
    assert judged["paper"].notna().all() and df[df["metric"] == "test/depth"]["paper"].isna().all()
    time = tables.build_table(tables.load_spec(REPO / "experiments" / "spigot" / f"{name}_time.yaml"), pd.DataFrame())
    assert time["paper"].notna().sum() == (8 if name == "table3_sst" else 9)  # SST baseline: "< 1 min"


def test_figures_write_png(tmp_path):
    root = tmp_path / "runs"
    for exp in ("synthetic_marginals", "synthetic_ste_i", "synthetic_spigot", "synthetic_spigot_ce"):
        for seed in (1, 2):
            _run(root / "curves", f"{exp}_{seed}", exp, k=10, acc=80 + seed, seed=seed, history=True)
    for exp in ("synthetic_ste_i", "synthetic_spigot"):
        for steps in (1, 5):
            for eta in (0.1, 1.0):
                for seed in (1, 2):
                    valid = 90.0 if eta == 1.0 else 60.0  # eta = 1 wins on validation accuracy
                    _run(root / "sweep", f"{exp}_{steps}_{eta}_{seed}", exp, k=10, steps=steps, eta=eta,
                         acc=70 + steps + seed, valid=valid, seed=seed)
    png = figures.learning_curves(root / "curves", tmp_path / "fig" / "curves.png")
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    picked = figures.inner_steps(root / "sweep", tmp_path / "fig" / "inner.png")
    assert (tmp_path / "fig" / "inner.png").read_bytes()[:4] == b"\x89PNG"
    assert len(picked) == 4 and set(picked["eta"]) == {1.0} and set(picked["n_runs"]) == {2}
    assert picked.set_index(["method", "k"]).loc[("STE-I", 5), "acc"] == pytest.approx(76.5)
    assert "| SPIGOT | 5 | 1 |" in (tmp_path / "fig" / "inner.md").read_text()


def test_row_curves_draw_a_panel_per_setting_with_runs(tmp_path):
    root = tmp_path / "runs"
    for seed in (1, 2):
        _run(root, f"a{seed}", "synthetic_spigot", acc=80 + seed, seed=seed, history=True)
    _run(root, "b1", "synthetic_other", k=10, acc=60, history=True)  # K=10: a setting the spec does not have
    spec = tables.load_spec(_spec(tmp_path))
    curves = figures.row_curves(spec, root, "valid/acc", tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert set(zip(curves["setting"], curves["row"], curves["n_runs"], strict=True)) == {("K=3", "spigot", 2)}
    assert curves["step"].tolist() == [0, 50, 100]
    assert curves["median"].tolist() == [50, 70, 81.5] and curves["max"].tolist() == [50, 70, 82]
    with pytest.raises(ValueError, match="no completed run with valid/nope"):
        figures.row_curves(spec, root, "valid/nope", tmp_path / "none.png")


def test_row_curves_against_epochs_and_training_seconds(tmp_path):
    """x=epoch+seconds: a row of panels per axis; the seconds are epoch × the run's seconds_per_epoch (median over
    the runs at each epoch)."""
    root = tmp_path / "runs"
    for seed, per_epoch in ((1, 10.0), (2, 30.0)):
        run = _run(root, f"a{seed}", "synthetic_spigot", acc=80 + seed, seed=seed, history=True)
        history = pd.read_csv(run / "history.csv").assign(epoch=[0.0, 1.0, 2.0])
        history.to_csv(run / "history.csv", index=False)
        record = json.loads((run / "metrics.json").read_text())
        (run / "metrics.json").write_text(json.dumps({**record, "seconds_per_epoch": per_epoch}))
    spec = tables.load_spec(_spec(tmp_path))
    curves = figures.row_curves(spec, root, "valid/acc", tmp_path / "both.png", x="epoch+seconds")
    data = json.loads((tmp_path / "both.data.json").read_text())
    assert data["columns"] == 1 and [p["xlabel"].split(" ")[0] for p in data["panels"]] == ["epoch", "training"]
    timed = curves.dropna(subset=["seconds"])
    assert timed["seconds"].tolist() == [0.0, 20.0, 40.0] and timed["median"].tolist() == [50, 70, 81.5]
    assert (tmp_path / "both.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="x must be one of"):
        figures.row_curves(spec, root, "valid/acc", tmp_path / "bad.png", x="minutes")


def test_inner_steps_skips_points_whose_eta_grid_is_incomplete(tmp_path):
    for steps in (1, 5):
        for eta in (0.1, 1.0):
            if (steps, eta) == (5, 1.0):
                continue  # the run that would have won k = 5 has not finished
            _run(tmp_path / "sweep", f"r_{steps}_{eta}", "synthetic_ste_i", k=10, steps=steps, eta=eta)
    spec = {"paper": "spigot", "table": "figure3_inner_steps", "paper_protocol": {"runs": 1},
            "reproduce": {"steps": [{"figure": "inner-steps", "out": str(tmp_path / "inner.png")}]}}
    (tmp_path / "f3.yaml").write_text(yaml.safe_dump(spec))
    picked = figures.inner_steps(tmp_path / "sweep", tmp_path / "inner.png", spec=tmp_path / "f3.yaml")
    assert list(picked["k"]) == [1]
    text = (tmp_path / "inner.md").read_text()
    assert "STE-I, k=5: η completed [0.1] of [0.1, 1.0]" in text and "SPIGOT: no completed run" in text
    # the protocol's runs were all there, but a figure with points missing is not the paper's figure
    status = json.loads((tmp_path / "inner.json").read_text())
    assert status["status"] == "reduced" and status["differs"] == [
        "not drawn: STE-I, k=5: η completed [0.1] of [0.1, 1.0]; SPIGOT: no completed run; "
        "SPIGOT-CE: no completed run; SPIGOT-EG: no completed run"]


def test_record_fields_as_metrics_without_reference_or_verdict(tmp_path):
    """``record.<field>`` reads a record field; a spec without a reference prints ours only; ``verdict: false``
    compares with the paper but gives no ✓/✗ (e.g. timings on other hardware)."""
    for seed in (1, 2, 3):
        run = _run(tmp_path / "runs", f"r{seed}", "synthetic_spigot", acc=90.0 + seed, seed=seed)
        record = json.loads((run / "metrics.json").read_text())
        (run / "metrics.json").write_text(json.dumps({**record, "seconds_per_step": 0.1 * seed}))
    spec = tables.load_spec(_spec(tmp_path))
    spec["metrics"] = [{"name": "record.seconds_per_step", "label": "s/step"}, {"name": "test/acc"}]
    spec["aggregate"] = "mean_std"
    df = tables.build_table(spec, tmp_path / "runs").set_index(["row", "metric"])
    assert df.loc[("spigot", "record.seconds_per_step"), "ours"] == pytest.approx(0.2)
    assert df.loc[("spigot", "record.seconds_per_step"), "ours_err"] == pytest.approx(0.1)
    assert df.loc[("spigot", "test/acc"), "agrees"] is not None

    text = tables.write_markdown(df.reset_index(), spec, tmp_path / "a.md", tables.load_runs(tmp_path / "runs"))
    assert "mean ± std" in text.read_text() and "Cells outside tolerance" in text.read_text()

    no_verdict = {**spec, "verdict": False}
    df = tables.build_table(no_verdict, tmp_path / "runs")
    assert df["agrees"].isna().all() and df["paper"].notna().any()
    md = tables.write_markdown(df, no_verdict, tmp_path / "b.md", tables.load_runs(tmp_path / "runs")).read_text()
    assert "✓" not in md and "✗" not in md and "Cells outside tolerance" not in md and "92.00" in md

    ours_only = {k: v for k, v in spec.items() if k not in ("reference", "reference_path")}
    df = tables.build_table(ours_only, tmp_path / "runs")
    md = tables.write_markdown(df, ours_only, tmp_path / "c.md", tables.load_runs(tmp_path / "runs")).read_text()
    assert "no paper column" in md and "**92.00** ± 1.00 (3)" in md and " · " not in md.split("| SPIGOT")[1]


def test_setting_curves_and_the_direct_specs(tmp_path):
    _four_runs(tmp_path / "runs")
    png = figures.setting_curves(_spec(tmp_path), tmp_path / "runs", "test/acc", tmp_path / "s.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="not a metric"):
        figures.setting_curves(_spec(tmp_path), tmp_path / "runs", "test/nope", tmp_path / "s.png")
    with pytest.raises(ValueError, match="no completed run"):
        figures.setting_curves(_spec(tmp_path), tmp_path / "none", "test/acc", tmp_path / "s.png")
    # The paper's running times are all cells of the timing spec, and no reference row is left unused.
    spec = tables.load_spec(REPO / "experiments" / "direct" / "sorting_time.yaml")
    df = tables.build_table(spec, pd.DataFrame())
    ref = pd.read_csv(spec["reference_path"])
    assert df["paper"].notna().sum() == (ref["table"] == "sorting_time").sum() == 6
    assert df["agrees"].isna().all()


def test_knn_spec_covers_the_papers_table_3():
    spec = tables.load_spec(REPO / "experiments" / "direct" / "knn.yaml")
    df = tables.build_table(spec, pd.DataFrame())
    ref = pd.read_csv(spec["reference_path"])
    assert df["paper"].notna().sum() == (ref["table"] == "knn").sum() == 5 * 3 * 4
    assert df.set_index(["row", "setting"]).loc[("direct_sigma1", "mnist k=5"), "paper"] == 14.25


def test_per_metric_layout_and_digits(tmp_path):
    _four_runs(tmp_path / "runs")
    spec = tables.load_spec(_spec(tmp_path))
    spec["layout"] = "per_metric"
    spec["metrics"][1]["digits"] = 4
    df = tables.build_table(spec, tmp_path / "runs")
    md = tables.write_markdown(df, spec, tmp_path / "t.md", tables.load_runs(tmp_path / "runs")).read_text()
    assert "## Accuracy" in md and "## V" in md and "| Model | K=3 |" in md
    assert "**80.0000** ± 0.0000 (4)" in md and "**92.00** ± 1.32 (4)" in md


def test_sections_split_the_settings_into_titled_tables(tmp_path):
    _four_runs(tmp_path / "runs")
    spec = tables.load_spec(_spec(tmp_path))
    spec["metrics"] = spec["metrics"][:1]
    spec["settings"].append({"name": "K=10", "match": {"dataset.num_clusters": 10}})
    spec["sections"] = [{"title": "Small", "settings": ["K=3"]}, {"title": "Large", "settings": ["K=10"]}]
    df = tables.build_table(spec, tmp_path / "runs")
    md = tables.write_markdown(df, spec, tmp_path / "t.md", tables.load_runs(tmp_path / "runs")).read_text()
    assert "## Small\n\n| Model | K=3 |" in md and "## Large\n\n| Model | K=10 |" in md
    assert "**10.00** ± 0.00 (1)" in md.split("## Large")[1]


def test_cells_mixing_run_lengths_are_flagged(tmp_path):
    for seed, steps in ((1, 150), (2, 150), (3, 2000)):
        run = _run(tmp_path / "runs", f"r{seed}", "synthetic_spigot", seed=seed)
        record = json.loads((run / "metrics.json").read_text())
        (run / "metrics.json").write_text(json.dumps({**record, "steps": steps}))
    spec = tables.load_spec(_spec(tmp_path))
    df = tables.build_table(spec, tmp_path / "runs")
    assert df.set_index(["row", "metric"]).loc[("spigot", "test/acc"), "steps"] == "150, 2000"
    md = tables.write_markdown(df, spec, tmp_path / "t.md", tables.load_runs(tmp_path / "runs")).read_text()
    assert "Cells mixing runs of different lengths" in md and "SPIGOT K=3 test/acc (150, 2000)" in md
    assert "training steps per run: 150, 2000" in md
    _four_runs(tmp_path / "same")  # no steps recorded: nothing flagged
    df = tables.build_table(spec, tmp_path / "same")
    md = tables.write_markdown(df, spec, tmp_path / "u.md", tables.load_runs(tmp_path / "same")).read_text()
    assert "mixing" not in md


def test_derived_metrics_and_a_per_metric_max(tmp_path):
    """``derived.<key>`` reads the run's derived.json (absent: no value); a metric's own ``aggregate: max`` takes the
    best run and prints no ±, while the other metrics keep the spec's aggregate."""
    for seed, acc in ((1, 90.0), (2, 94.0), (3, 95.0)):
        run = _run(tmp_path / "runs", f"r{seed}", "synthetic_spigot", acc=acc, seed=seed)
        if seed < 3:
            (run / "derived.json").write_text(json.dumps({"self_f1": 40.0 + seed}))
    spec = tables.load_spec(_spec(tmp_path))
    spec["aggregate"] = "mean_std"
    spec["metrics"] = [{"name": "test/acc"}, {"name": "test/acc", "aggregate": "max", "label": "max"},
                       {"name": "derived.self_f1"}]
    runs = tables.load_runs(tmp_path / "runs")
    assert runs.sort_values("seed")["derived.self_f1"].tolist()[:2] == [41.0, 42.0]
    df = tables.build_table(spec, runs)
    spigot = df[df["row"] == "spigot"].reset_index(drop=True)
    assert spigot["metric"].tolist() == ["test/acc", "test/acc:max", "derived.self_f1"]
    assert spigot.loc[0, "ours"] == pytest.approx(93.0) and spigot.loc[0, "ours_err"] == pytest.approx(2.6458, 1e-3)
    assert (spigot.loc[1, "ours"], spigot.loc[1, "ours_err"]) == (95.0, 0.0)
    assert spigot.loc[2, "ours"] == pytest.approx(41.5) and spigot.loc[2, "n_runs"] == 2
    md = tables.write_markdown(df, spec, tmp_path / "t.md", runs).read_text()
    assert "**95.00** (3)" in md and "**93.00** ± 2.65 (3)" in md
    with pytest.raises(ValueError, match="unknown aggregate"):
        tables.aggregate([1.0], "min")


def test_listops_spec_covers_the_reference_and_every_experiment():
    """Issue #7: every ListOps experiment is a row; every paper number lands in a cell (incl. ``test/acc:max``)."""
    spec = tables.load_spec(REPO / "experiments" / "listops" / "table.yaml")
    experiments = set(methods("listops")) - {
        "common", "chart_common"}  # (root-level configs since issue #18; kept out in any case)
    assert {r["match"]["choices.experiment"] for r in spec["rows"]} == {f"listops_{e}" for e in experiments}
    ref = pd.read_csv(spec["reference_path"], dtype=str)
    cells = {(r["name"], s["name"], tables.metric_id(m))
             for r in spec["rows"] for s in spec["settings"] for m in spec["metrics"]}
    assert set(zip(ref["row"], ref["setting"], ref["metric"], strict=True)) <= cells
    df = tables.build_table(spec, pd.DataFrame())
    assert df["paper"].notna().sum() == len(ref) == 13


@pytest.mark.parametrize("name", ["mlc", "mlc_time", "ner", "pos"])
def test_energy_specs_cover_the_reference_and_every_experiment(name):
    """Issue #6: every MLC (NER) experiment is a row of the MLC (NER, POS) tables; every paper number of Tables 1,
    5, 3 and 9 lands in a cell."""
    spec = tables.load_spec(REPO / "experiments" / "energy" / f"{name}.yaml")
    group = "mlc" if name.startswith("mlc") else "ner"
    experiments = set(methods(group)) - {"common"}
    assert {r["match"]["choices.experiment"] for r in spec["rows"]} == {f"{group}_{e}" for e in experiments}
    ref = pd.read_csv(spec["reference_path"], dtype=str)
    ref = ref[ref["table"] == name]
    cells = {(r["name"], s["name"], tables.metric_id(m))
             for r in spec["rows"] for s in spec["settings"] for m in spec["metrics"]}
    assert set(zip(ref["row"], ref["setting"], ref["metric"], strict=True)) <= cells
    known = tables.build_table(spec, pd.DataFrame())["paper"].notna().sum()
    assert known == len(ref) == {"mlc": 20, "mlc_time": 8, "ner": 10, "pos": 5}[name]


# ---------------------------------------------------------------- reproductions (latentstruct.report.reproduce)


def _argv(name: str, **kwargs) -> list[list[str]]:
    """The reproduction's commands, each without the interpreter (``python -m``)."""
    return [c.argv[2:] for c in reproduce.commands(name, **kwargs)]


def _table_steps(name: str) -> list[str | None]:
    plan = tables.load_spec(reproduce.spec_path(name)).get("reproduce") or {}
    return [step.get("table") for step in plan.get("steps", [])]


@pytest.mark.parametrize("name", SPECS)
def test_every_spec_reproduces_its_table_or_names_the_spec_that_does(name, monkeypatch):
    """Every spec's sweeps are configs/sweep files, its steps name real specs and report modules, and every output
    follows --results; a spec without a reproduce block (a _time companion) is a table step of exactly one spec."""
    monkeypatch.chdir(REPO)
    spec = tables.load_spec(reproduce.spec_path(name))
    plan = spec.get("reproduce")
    if plan is None:
        folder, table = name.split("/")
        makers = [other for other in SPECS if other.startswith(f"{folder}/") and table in _table_steps(other)]
        assert len(makers) == 1, f"{name}: no reproduce block and made by {makers}"
        with pytest.raises(ValueError, match=f"make table T={makers[0]}"):
            reproduce.commands(name)
        return
    for sweep in plan["sweeps"]:
        assert (REPO / "configs" / "sweep" / f"{sweep['sweep']}.yaml").is_file()
    argv = _argv(name, runs="R", results="elsewhere", jobs=3)
    sweeps, steps = argv[: len(plan["sweeps"])], argv[len(plan["sweeps"]) :]
    for command, sweep in zip(sweeps, plan["sweeps"], strict=True):
        assert command[:3] == ["latentstruct.train", "--multirun", f"+sweep={sweep['sweep']}"]
        assert "paths.multirun_dir=R" in command and f"hydra.launcher.n_jobs={sweep.get('jobs', 3)}" in command
    assert len(steps) == len(plan.get("steps", [])) and all(c[0].startswith("latentstruct.report.") for c in steps)
    for command in steps:
        if command[0] == "latentstruct.report.tables":
            assert "rows" in tables.load_spec(command[1])
        outs = [command[i + 1] for i, a in enumerate(command) if a in ("--out", "--out-dir")]
        assert all(o.startswith("elsewhere/") for o in outs) and "results/" not in " ".join(command)
    assert reproduce.main([name, "--runs", "R", "--dry-run"]) == 0


def test_figure3_is_drawn_with_its_spec_so_that_its_markdown_opens_with_the_status_line(monkeypatch):
    monkeypatch.chdir(REPO)
    assert _argv("spigot/figure3_inner_steps", runs="R")[-1] == [
        "latentstruct.report.figures", "inner-steps", "--spec", "experiments/spigot/figure3_inner_steps.yaml",
        "--runs", "R/spigot_inner_steps", "--out", "results/spigot/figure3_inner_steps.png"]


def test_only_sweeps_or_only_steps_splits_a_reproduction_where_the_runs_and_the_tables_are_made_apart(monkeypatch):
    """A GPU machine runs the sweeps alone (scripts/gpu_table.sh); here the steps alone make the tables of the runs
    that came back (make table ONLY=steps)."""
    monkeypatch.chdir(REPO)
    every = _argv("spigot/table3_sst", runs="R")
    assert _argv("spigot/table3_sst", runs="R", only="sweeps") == every[:1]
    assert _argv("spigot/table3_sst", runs="R", only="steps") == every[1:]
    assert reproduce.sweep_root("spigot/table3_sst", "R") == "R/spigot_sst"


def test_table3_sst_runs_what_its_make_target_ran(monkeypatch, capsys):
    """The commands of `make table-spigot-sst` before the table specs drove it, except the tree drawings, now one
    command that selects each method's seed-301 run from the run records."""
    monkeypatch.chdir(REPO)
    launcher = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "trainer.progress=false",
                "trainer.resume=true", "paths.multirun_dir=multirun"]
    assert _argv("spigot/table3_sst", jobs=2) == [
        ["latentstruct.train", "--multirun", "+sweep=spigot_sst", "trainer.seed=301,302,303", *launcher],
        ["latentstruct.report.tables", "experiments/spigot/table3_sst.yaml", "--runs", "multirun/spigot_sst",
         "--out", "results/spigot/table3_sst.md"],
        ["latentstruct.report.tables", "experiments/spigot/table3_sst_time.yaml", "--runs", "multirun/spigot_sst",
         "--out", "results/spigot/table3_sst_time.md"],
        ["latentstruct.report.trees", "--runs", "multirun/spigot_sst", "--spec", "experiments/spigot/table3_sst.yaml",
         "--seed", "301", "--rows", "marginals,sparsemap,perturb_and_map,ste_s,ste_i,spigot,spigot_ce,spigot_eg",
         "--out-dir", "results/spigot/trees", "A taut, intelligent psychological drama."]]
    assert reproduce.main(["spigot/table3_sst", "--jobs", "2", "--dry-run"]) == 0
    printed = capsys.readouterr().out.splitlines()
    made = "python -m latentstruct.report.reproduce spigot/table3_sst"
    assert [shlex.split(line)[2:] for line in printed[:-2]] == _argv("spigot/table3_sst", jobs=2, command=made)
    assert shlex.split(printed[-2])[2:] == ["latentstruct.report.report", "--results", "results"]
    assert printed[-1] == "would write the tables and figures under results/ (the spec's own protocol)"


def test_a_trial_writes_into_a_scratch_folder_unless_told_and_says_where(monkeypatch, capsys):
    """Issue 37: `make table T=spigot/table2 SEEDS=301 ARGS=...` (the README's example) replaced the committed
    full-protocol table; anything but the spec's protocol now goes to the git-ignored scratch folder."""
    monkeypatch.chdir(REPO)

    def outs(**kwargs):
        return [c[c.index("--out") + 1] for c in _argv("spigot/table2", **kwargs) if "--out" in c]

    assert outs() == ["results/spigot/table2.md", "results/spigot/figure2_learning_curves.png"]
    for trial in ({"seeds": "301"}, {"args": "trainer.max_steps=100"}, {"args": "+preset=listops_cpu"}):
        assert all(o.startswith(f"{reproduce.SCRATCH}/") for o in outs(**trial)), trial
    assert outs(seeds="301", results="results") == outs()  # RESULTS=results: on purpose
    assert reproduce.main(["spigot/table2", "--seeds", "301", "--args", "trainer.max_steps=100", "--made-by", "make",
                           "--dry-run"]) == 0
    printed = capsys.readouterr().out.splitlines()
    table = shlex.split(next(line for line in printed if "latentstruct.report.tables" in line))
    assert table[table.index("--command") + 1] == "make table T=spigot/table2 SEEDS=301 ARGS=trainer.max_steps=100"
    assert printed[-2].endswith(f"latentstruct.report.report --results {reproduce.SCRATCH}")
    assert printed[-1].startswith(f"would write the tables and figures under {reproduce.SCRATCH}/ (not the spec's")
    assert "RESULTS=results" in printed[-1]
    assert f"/{reproduce.SCRATCH.split('/')[0]}/" in (REPO / ".gitignore").read_text().split()
    quoted = reproduce.made_by("listops/table", "301", "+preset=listops_cpu listops_chart:trainer.seed=301")
    assert shlex.split(quoted) == ["make", "table", "T=listops/table", "SEEDS=301",
                                   "ARGS=+preset=listops_cpu listops_chart:trainer.seed=301"]


def test_a_tables_regenerate_line_and_sidecar_name_the_command_that_made_it(tmp_path):
    _four_runs(tmp_path / "runs")
    out = tmp_path / "t.md"
    command = "make table T=fake/t1 SEEDS=1 ARGS='trainer.max_steps=100'"
    assert tables.main([str(_spec(tmp_path)), "--runs", str(tmp_path / "runs"), "--out", str(out),
                        "--command", command]) == 0
    assert f"- regenerate with: `{command}`" in out.read_text().splitlines()
    assert json.loads(out.with_suffix(".json").read_text())["command"] == command
    tables.main([str(_spec(tmp_path)), "--runs", str(tmp_path / "runs"), "--out", str(out)])
    assert json.loads(out.with_suffix(".json").read_text())["command"] == "make table-fake"  # the spec's


def test_a_figure_with_nothing_to_draw_is_not_written_and_the_command_says_why(tmp_path, capsys):
    """One evaluation per run (a 100-step trial) drew an empty figure2_learning_curves.png without a word."""
    for seed in (1, 2):
        run = _run(tmp_path / "runs", f"r{seed}", "synthetic_spigot", k=10, seed=seed)
        pd.DataFrame({"step": [100], "valid/acc": [60.0], "valid/v_measure": [1.0], "test/acc": [60.0],
                      "test/v_measure": [1.0]}).to_csv(run / "history.csv", index=False)
    out = tmp_path / "fig" / "curves.png"
    with pytest.raises(figures.NothingToDraw, match="one evaluation per run"):
        figures.learning_curves(tmp_path / "runs", out)
    assert figures.main(["learning-curves", "--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert "not written: nothing to draw" in capsys.readouterr().out and not out.exists()


def test_seeds_and_args_replace_the_specs_defaults_and_scope_to_one_sweep(monkeypatch):
    monkeypatch.chdir(REPO)
    knn = _argv("direct/knn", seeds="1,2", args="dataset=cifar10 'trainer.max_steps=150'")[0]
    assert knn[3:6] == ["trainer.seed=1,2", "dataset=cifar10", "trainer.max_steps=150"] and "dataset=mnist" not in knn
    assert "dataset=semisupervised_mnist,semisupervised_fashion_mnist" in _argv("direct/vae")[0]  # both datasets
    assert _argv("spigot/table2")[0][3] == "hydra/launcher=joblib"  # no seeds in the spec: the sweep's own
    chart_only = "listops_chart:trainer.seed=301 listops_chart:trainer.max_steps=500"
    chart, merge = _argv("listops/table", seeds="301,302", args=f"+preset=listops_cpu {chart_only}")[:2]
    assert chart[3:6] == ["trainer.seed=301", "+preset=listops_cpu", "trainer.max_steps=500"]
    assert merge[3:5] == ["trainer.seed=301,302", "+preset=listops_cpu"] and "trainer.max_steps=500" not in merge
    assert "embedding.pretrained=a:b" in _argv("spigot/table3_sst", args="embedding.pretrained=a:b")[0]
    with pytest.raises(ValueError, match="'listops' is not a sweep of this table"):
        reproduce.commands("spigot/table3_sst", args="listops:trainer.seed=1")
    snli = reproduce.commands("spigot/table3_snli")
    assert snli[0].may_fail and "--allow-empty" in snli[1].argv and not snli[1].may_fail


def test_a_failed_sweep_stops_the_reproduction_unless_its_runs_may_fail(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    ran = []

    def run(argv):
        ran.append(argv[2])
        return subprocess.CompletedProcess(argv, int(argv[2] == "latentstruct.train"))

    monkeypatch.setattr(reproduce.subprocess, "run", run)
    assert reproduce.main(["spigot/table3_snli"]) == 0  # SNLI: the tables list the failed runs
    assert ran == ["latentstruct.train", "latentstruct.report.tables", "latentstruct.report.tables",
                   "latentstruct.report.report"]
    assert "*** some runs of this sweep failed" in capsys.readouterr().out
    ran.clear()
    assert reproduce.main(["spigot/table3_sst"]) == 1 and ran == ["latentstruct.train"]


def test_a_figure_only_spec_is_refused_by_the_tables(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit, match="no rows"):
        tables.main(["experiments/spigot/figure3_inner_steps.yaml", "--runs", str(tmp_path)])


def _sst_run(root: Path, name: str, experiment: str, seed: int, status: str = "completed") -> Path:
    run = _run(root, name, experiment, seed=seed, status=status)
    config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({**config, "trainer": {"seed": seed}}))
    return run


def test_records_under_the_nested_experiment_names_count_for_their_flat_rows_once_migrated(tmp_path):
    """Records written before the experiments' flat names (``choices.experiment: sst/spigot``) fill the row of
    ``sst_spigot``, beside those written under the flat name, once ``scripts/migrate_experiment_names.py`` has
    rewritten them (its overrides too); a flat record is left byte for byte."""
    before = _run(tmp_path, "before", "sst/spigot", acc=81.0)
    (before / ".hydra" / "overrides.yaml").write_text("- +experiment=sst/spigot\n- trainer.seed=1\n")
    after = _run(tmp_path, "after", "sst_spigot", acc=83.0, seed=2)
    flat = (after / ".hydra" / "hydra.yaml").read_bytes()
    spec = tables.load_spec(REPO / "experiments" / "spigot" / "table3_sst.yaml")
    row = next(r for r in spec["rows"] if r["name"] == "spigot")
    assert len(tables.filter_runs(tables.load_runs(tmp_path), row["match"])) == 1
    assert migrate_experiment_names.main([str(tmp_path)]) == 0
    runs = tables.load_runs(tmp_path)
    assert list(runs["choices.experiment"]) == ["sst_spigot", "sst_spigot"]
    assert len(tables.filter_runs(runs, row["match"])) == 2
    assert (before / ".hydra" / "overrides.yaml").read_text() == "- +experiment=sst_spigot\n- trainer.seed=1\n"
    assert (after / ".hydra" / "hydra.yaml").read_bytes() == flat


def test_tree_runs_are_selected_by_their_records_not_their_directory_names(tmp_path):
    """The seed-301 run of each row: the first completed run whose config and choices match, whatever its
    directory is called (the Makefile used to glob `<method>,*trainer.seed=301`)."""
    root = tmp_path / "runs"
    _sst_run(root, "+experiment=sst_marginals,trainer.seed=301", "sst_spigot", 301)  # a name that lies
    _sst_run(root, "a", "sst_marginals", 301, status="failed")
    _sst_run(root, "b", "sst_marginals", 302)
    _sst_run(root, "c", "sst_marginals", 301)
    _sst_run(root, "d", "sst_marginals", 301)
    spec = tables.load_spec(REPO / "experiments" / "spigot" / "table3_sst.yaml")
    chosen = trees.seed_runs(spec, root, 301, ["marginals", "spigot", "sparsemap"])
    assert chosen == {"marginals": str(root / "c"), "spigot": str(root / "+experiment=sst_marginals,trainer.seed=301")}
    assert list(trees.seed_runs(spec, root, 302)) == ["marginals"]
    assert trees.seed_runs(spec, tmp_path / "none", 301) == {}
    with pytest.raises(ValueError, match="not rows of table3_sst"):
        trees.seed_runs(spec, root, 301, ["marginal"])


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_make_aliases_run_the_generic_target_and_refuse_the_old_variables():
    """`make -n <alias>` goes through `make table T=...` and prints the runner's commands; an old per-table variable
    stops make instead of silently running the full protocol."""
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    bin_ = f"BIN={Path(sys.executable).parent}"
    done = subprocess.run(["make", "-n", "table-spigot-snli", bin_, "SEEDS=301", "ARGS=trainer.max_epochs=1 a=b c"],
                          capture_output=True, text=True, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr
    sweep = next(line for line in done.stdout.splitlines() if "+sweep=spigot_snli" in line and "reproduce" not in line)
    assert shlex.split(sweep)[5:8] == ["trainer.seed=301", "trainer.max_epochs=1", "a=b"]
    assert "latentstruct.report.tables experiments/spigot/table3_snli_time.yaml" in done.stdout
    old = subprocess.run(["make", "-n", "table-spigot-sst", bin_, "SST_SEEDS=301"], capture_output=True, text=True,
                         cwd=REPO, env=env)
    assert old.returncode != 0 and "SST_SEEDS is gone" in old.stderr
