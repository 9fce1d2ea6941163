"""scripts/gpu_check.py's pieces on the CPU (the whole check is scripts/gpu_check.sh, dry run: make gpu-check-dry) and
scripts/gpu_report.py on made-up results."""

from __future__ import annotations

import json
from pathlib import Path

from latentstruct.config import experiments
from scripts import gpu_check, gpu_report


def test_every_family_has_small_settings_and_a_short_schedule():
    assert set(experiments()) <= set(gpu_check.TINY)
    assert gpu_check._schedule(gpu_check._compose(["+experiment=mlc_cd"])) == [
        "trainer.phases.0.epochs=1", "trainer.phases.1.epochs=1"]
    assert gpu_check._schedule(gpu_check._compose(["+experiment=synthetic_spigot"])) == ["trainer.max_steps=2"]


def test_an_experiment_trains_or_says_its_data_is_absent(tmp_path, monkeypatch):
    done = gpu_check.run_experiment("synthetic_spigot", "cpu", tmp_path / "run")
    assert done["status"] == "completed" and done["steps"] == 2 and done["hardware"] == "cpu"
    monkeypatch.setenv("LATENTSTRUCT_DATA", str(tmp_path))
    blocked = gpu_check.run_experiment("sst_baseline", "cpu", tmp_path / "sst")
    assert blocked["status"] == "blocked" and blocked["error"].startswith("FileNotFoundError: ")


def test_the_report_reads_the_checks_files(tmp_path):
    steps = {"tests": {"status": "ok", "seconds": 50}, "syncs": {"status": "failed", "note": "boom", "seconds": 1}}
    (tmp_path / "env.json").write_text(json.dumps({"gpu": "NVIDIA H100", "torch": "2.11", "steps": steps,
                                                   "determinism": {"cudnn.deterministic": False}}))
    (tmp_path / "experiments.json").write_text(json.dumps({"runs": [
        {"experiment": "sst_spigot", "family": "sst", "status": "completed", "seconds": 3.0},
        {"experiment": "snli_spigot", "family": "snli", "status": "blocked", "seconds": 0.5, "error": "no train"}],
        "repeats": [{"experiment": "sst_spigot", "identical": False, "max_abs_difference": 1e-7}],
        "launcher_sweep": {"status": "ok", "runs": ["NVIDIA H100", "NVIDIA H100"]}}))
    (tmp_path / "timing.json").write_text(json.dumps({"tables": [], "configs": []}))
    (tmp_path / "syncs.json").write_text(json.dumps([{"structure": "projective", "op": "map", "syncs": 0}]))
    (tmp_path / "tests.xml").write_text(
        '<testsuites><testsuite><testcase classname="a" name="t1"/><testcase classname="a" name="t2">'
        '<failure message="wrong">x</failure></testcase><testcase classname="a" name="t3"><skipped/></testcase>'
        '</testsuite></testsuites>')
    (tmp_path / "structures_cuda.md").write_text("# Structures benchmark\n")
    (tmp_path / "check.log").write_text("[gpu_check 1] tests: starting\nKeyError: 'early': not this step's\n"
                                        "[gpu_check 2] syncs: starting\nTraceback\nRuntimeError: no kernel: x\n"
                                        "[gpu_check 3] syncs: failed in 1 s boom\n")
    rerun = tmp_path / "implicit.json"
    rerun.write_text(json.dumps({"gpu": "NVIDIA H200", "commit": "abc1234", "generated": "today", "device": "cuda",
                                 "command": "python bench/implicit.py", "args": {"max_iter": 20}, "datasets": {}}))
    assert gpu_report.main([str(tmp_path), "--out", str(tmp_path / "results"), "--implicit", str(rerun)]) == 0
    text = (tmp_path / "results" / "gpu.md").read_text()
    assert "**Status: not every step ok: syncs failed**" in text and "on NVIDIA H100" in text
    assert "| syncs | failed | 1 | boom; `RuntimeError: no kernel: x` |" in text and "early" not in text
    assert "bench/implicit.py` alone on NVIDIA H200 at commit abc1234 (today), not from this check's step" in text
    assert "1 passed, 1 failed, 1 skipped." in text and "- FAILED a::t2: wrong" in text
    assert "| snli | 0 of 1 | snli_spigot (blocked) | 0 |" in text and "| sst_spigot | no | 1e-07 |" in text
    assert "| projective | 0 |" in text
    assert (tmp_path / "results" / "structures_cuda.md").is_file() and (tmp_path / "results" / "gpu.json").is_file()
    assert gpu_report.main([str(tmp_path / "nothing")]) == 1


def test_the_report_names_the_device_machines_paths_by_what_they_are():
    message = ('SNLI split(s) train not found in /work/x/.device/data/snli (found: valid). File '
               '"/opt/v/lib/python3.12/site-packages/hydra/main.py", File "/srv/co/latentstruct/train.py", '
               '--out /root/out/structures_cuda.md')
    assert gpu_report.scrub(message) == (
        'SNLI split(s) train not found in $LATENTSTRUCT_DATA/snli (found: valid). File '
        '"<site-packages>/hydra/main.py", File "latentstruct/train.py", --out $OUT/structures_cuda.md')


def test_the_report_shows_the_implicit_steps_two_ways_of_making_products(tmp_path):
    sheet = {"command": "python bench/implicit.py --device cuda --out implicit.md", "device": "cuda",
             "args": {"max_iter": 20},
             "datasets": {"ner": {
                 "timing": {"spen": {"step_seconds": 0.01, "solver_seconds": 0.0, "implicit_seconds": 0.0},
                            "cd minres:0.2": {"step_seconds": 0.05, "solver_seconds": 0.02, "implicit_seconds": 0.03},
                            "cd minres:0.2 forward_over_reverse": {"error": "hvp=forward_over_reverse: no derivative"}},
                 "accuracy": {"cd": {"products": {
                     "double_backward": {"setup_seconds": 0.01, "product_seconds": 0.02, "mixed_seconds": 0.02},
                     "forward_over_reverse": {"setup_seconds": 0.0, "product_seconds": 0.03, "mixed_seconds": 0.03,
                                              "product_difference": 1e-7, "gradient_difference": 2e-7,
                                              "products_used": [2, 2]}}}}}}}
    steps = {"implicit": {"status": "ok", "seconds": 40, "sheet": sheet}}
    (tmp_path / "env.json").write_text(json.dumps({"gpu": "NVIDIA H100", "steps": steps}))
    (tmp_path / "experiments.json").write_text(json.dumps({"runs": []}))
    (tmp_path / "timing.json").write_text("null")
    assert gpu_report.main([str(tmp_path), "--out", str(tmp_path / "results")]) == 0
    text = (tmp_path / "results" / "gpu.md").read_text()
    assert "## Implicit gradient: double backward vs forward-over-reverse" in text and "**ner**" in text
    assert "| cd minres:0.2 | 0.050 | 5.0 | 0.020 | 40 % | 0.030 | 60 % |" in text
    assert "| cd minres:0.2 forward_over_reverse | failed: hvp=forward_over_reverse: no derivative |" in text
    assert "| L_CD | forward_over_reverse | 0.0000 | 0.0300 | 0.0300 | 1.50 | 1e-07 | 2e-07 | 2, 2 |" in text


def test_a_family_cut_at_the_deadline_fails_the_step_only_if_a_run_was_lost(tmp_path, monkeypatch):
    """The citation family trained every run and was killed in its repeat (the first H100 check): not a failure."""
    import latentstruct.config

    monkeypatch.setattr(latentstruct.config, "experiments", lambda: {"whole": ["a", "b"], "cut": ["c", "d"]})
    monkeypatch.setattr(gpu_check, "launcher_sweep", lambda *a: {"status": "ok"})
    monkeypatch.setattr(gpu_check.tempfile, "mkdtemp", lambda prefix: str(tmp_path))

    class Hung:  # a family process that wrote the runs it finished and is still going at the deadline
        def __init__(self, cmd, cwd):
            names = cmd[cmd.index("--out") + 2:]
            done = names if "a" in names else names[:1]
            Path(cmd[cmd.index("--out") + 1]).write_text(json.dumps(
                [{"experiment": n, "status": "completed", "seconds": 1.0} for n in done]))

        def poll(self):
            return None

        def kill(self):
            pass

        def wait(self):
            return -9

    monkeypatch.setattr(gpu_check.subprocess, "Popen", Hung)
    result = gpu_check.experiments("cuda", tmp_path, seconds=0)
    sheet = json.loads((tmp_path / "experiments.json").read_text())
    assert [r["experiment"] for r in sheet["runs"]] == ["a", "b", "c", "cut (family)"]
    assert sheet["repeats"] == [{"experiment": "a", "identical": None, "note": "not finished by the step's deadline"}]
    assert result["status"] == "failed" and result["note"].startswith("3 of 4 experiments")


def test_only_runs_the_steps_asked_for_and_the_report_says_so(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(gpu_check, "environment", lambda device, bundle: {"gpu": "NVIDIA H200", "torch": "2.11",
                                                                           "cuda": "13.0"})
    monkeypatch.setattr(gpu_check, "timing", lambda device, out, clock, more: asked.append(more) or {"status": "ok"})
    for step in ("cuda_tests", "experiments", "structures", "implicit"):
        monkeypatch.setattr(gpu_check, step, lambda *a, step=step: asked.append(step) or {"status": "ok"})
    assert gpu_check.check("cpu", tmp_path, 1e12, None, tmp_path, {"timing"}, ["--tables", "energy/ner"]) == 0
    assert asked == [["--tables", "energy/ner"]]
    steps = json.loads((tmp_path / "env.json").read_text())["steps"]
    assert steps["tests"] == {"status": "skipped", "note": "not asked for (--only)", "seconds": 0.0}
    assert steps["timing"]["status"] == "ok"
    (tmp_path / "timing.json").write_text(json.dumps({"tables": [], "configs": []}))
    assert gpu_report.main([str(tmp_path), "--out", str(tmp_path / "r"), "--name", "gpu_timing"]) == 0
    assert (tmp_path / "r" / "gpu_timing.md").read_text().startswith("# The GPU check: timing alone\n")
    assert "## CUDA tests" not in (tmp_path / "r" / "gpu_timing.md").read_text()
    assert not (tmp_path / "r" / "gpu.md").exists()
    try:
        gpu_check.check("cpu", tmp_path, 1e12, None, tmp_path, {"timeing"})
    except SystemExit as err:
        assert "timeing" in str(err)
    else:
        raise AssertionError("an unknown step must be refused")
