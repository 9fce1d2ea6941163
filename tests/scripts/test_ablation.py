"""scripts/ablation.py: an ablation's runs go at the table's pinned code with the table's protocol, each once; their
records are packed to commit and a fresh machine restores them instead of running again; the citation page reads
each run's trajectory from its history."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from scripts import ablation, campaign

#: a stand-in for a training run: its argv's hydra.run.dir gets a completed record, and the argv itself
FAKE_RUN = (
    "import json, pathlib, sys; "
    "d = pathlib.Path([a for a in sys.argv if a.startswith('hydra.run.dir=')][0].split('=', 1)[1]); "
    "d.mkdir(parents=True, exist_ok=True); "
    "(d / 'metrics.json').write_text(json.dumps({'status': 'completed', 'argv': sys.argv[1:]}))"
)


@pytest.fixture
def fake_campaign(tmp_path, monkeypatch):
    state, code = tmp_path / "state", tmp_path / "code"
    code.mkdir()
    monkeypatch.setenv("LATENTSTRUCT_CAMPAIGN", str(tmp_path / "root"))
    monkeypatch.setattr(campaign, "STATE", state)
    monkeypatch.setattr(campaign, "plan", lambda table: {"table": table, "commit": "c0ffee" * 6, "args": "a=1 b=2"})
    monkeypatch.setattr(campaign, "code_dir", lambda commit: code)
    return tmp_path


def test_an_ablation_runs_each_run_once_at_the_table_protocol_and_a_fresh_machine_restores_it(fake_campaign, capsys):
    runs = {"lam0-1": ["-c", FAKE_RUN, "x=0"], "lam0-2": ["-c", FAKE_RUN, "x=0", "seed=2"]}
    with pytest.raises(SystemExit, match="2 runs of the ablation t not completed"):
        ablation.ensure("t", "paper/table", runs, only_summary=True, minutes="1")
    where, entry = ablation.ensure("t", "paper/table", runs, only_summary=False, minutes="1")
    record = json.loads((where / "lam0-2" / "metrics.json").read_text())
    assert record["argv"] == ["x=0", "seed=2", "a=1", "b=2", "trainer.progress=False", "trainer.resume=True",
                              f"hydra.run.dir={where / 'lam0-2'}"]
    assert (fake_campaign / "state" / "ablations-t" / "records.tar.gz").is_file()
    assert capsys.readouterr().out.count("(1 of 2)") == 1
    ablation.ensure("t", "paper/table", runs, only_summary=False, minutes="1")
    assert "of 2)" not in capsys.readouterr().out  # nothing runs twice

    shutil.rmtree(fake_campaign / "root")  # a fresh machine: the committed records only
    where, _ = ablation.ensure("t", "paper/table", runs, only_summary=True, minutes="1")
    assert ablation.carry.run_status(where / "lam0-1") == "completed"


#: a stand-in for a run that leaves its weights: metrics (its argv's acc=, a timing that differs) and checkpoint.pt
FAKE_WEIGHTED_RUN = (
    "import json, pathlib, sys, time; "
    "d = pathlib.Path([a for a in sys.argv if a.startswith('hydra.run.dir=')][0].split('=', 1)[1]); "
    "acc = float([a for a in sys.argv if a.startswith('acc=')][0].split('=')[1]); "
    "d.mkdir(parents=True, exist_ok=True); (d / 'checkpoint.pt').write_text('w'); "
    "(d / 'metrics.json').write_text(json.dumps({'status': 'completed', 'metrics': {'valid/acc': acc, "
    "'valid/infer_seconds': time.time()}}))"
)


def test_a_run_without_its_weights_here_is_remade_at_the_tables_code_and_checked_against_its_record(fake_campaign,
                                                                                                  capsys):
    entry = ablation.campaign.plan("paper/table")
    record = fake_campaign / "runs" / "cd-1"
    record.mkdir(parents=True)
    (record / "metrics.json").write_text(json.dumps({"metrics": {"valid/acc": 40.0, "valid/infer_seconds": 0.1}}))
    argv = ["-c", FAKE_WEIGHTED_RUN, "acc=40.0"]
    where, again = ablation.last_state("cd-1", record, argv, "probe", entry)
    assert again and (where / "checkpoint.pt").is_file() and where.parent.name == "remade"
    assert capsys.readouterr().out.count("re-making") == 1
    assert ablation.last_state("cd-1", record, argv, "probe", entry) == (where, True)  # made once
    with pytest.raises(SystemExit, match="keeps no weights here"):  # --only summary re-makes nothing
        ablation.last_state("cd-9", record, argv, "probe", entry, make=False)
    assert "re-making" not in capsys.readouterr().out
    (record / "checkpoint.pt").write_text("w")  # this machine ran it: its own directory, nothing re-made
    assert ablation.last_state("cd-1", record, argv, "probe", entry) == (record, False)
    other = fake_campaign / "runs" / "cd-2"
    shutil.copytree(record, other)
    (other / "checkpoint.pt").unlink()
    with pytest.raises(SystemExit, match="differs from its record"):  # the code computes differently now
        ablation.last_state("cd-2", other, ["-c", FAKE_WEIGHTED_RUN, "acc=41.0"], "probe", entry)


#: a stand-in for a run that fails: with its record (status failed, the error), or without one
FAKE_FAILED_RUN = (
    "import json, pathlib, sys; "
    "d = pathlib.Path([a for a in sys.argv if a.startswith('hydra.run.dir=')][0].split('=', 1)[1]); "
    "d.mkdir(parents=True, exist_ok=True); "
    "'record' in sys.argv and (d / 'metrics.json').write_text(json.dumps({'status': 'failed', "
    "'error': 'non-finite value at step 89'})); sys.exit(1)"
)


def test_a_run_that_fails_with_its_record_is_done_and_one_without_stops_the_ablation(fake_campaign, capsys):
    runs = {"series-1": ["-c", FAKE_FAILED_RUN, "record"], "ok-1": ["-c", FAKE_RUN]}
    where, _ = ablation.ensure("f", "paper/table", runs, only_summary=False, minutes="1")
    assert ablation.carry.run_status(where / "series-1") == "failed"
    assert ablation.carry.run_status(where / "ok-1") == "completed"  # the next run went on
    assert "series-1 failed: non-finite value at step 89" in capsys.readouterr().out
    ablation.ensure("f", "paper/table", runs, only_summary=True, minutes="1")  # done: not run again
    assert "of 2)" not in capsys.readouterr().out
    with pytest.raises(SystemExit, match="without a record of its failure"):
        ablation.ensure("f", "paper/table", {"crash-1": ["-c", FAKE_FAILED_RUN]}, only_summary=False, minutes="1")


def test_the_citation_trajectory_and_page(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"identity": {"trainer.phases": [{"epochs": 2}, {"epochs": 3}]}}))
    pd.DataFrame({"epoch": [1.0, 2.0, 3.0, 4.0, 5.0], "valid/acc": [30.0, 40.0, 45.0, 42.0, 20.0],
                  "valid/author_share": [30.0, 30.0, 40.0, 60.0, 97.5]}).to_csv(run / "history.csv", index=False)
    t = ablation.citation_trajectory(run)
    assert t == {"pretrained": 40.0, "best": 45.0, "best_epoch": 1, "last": 20.0, "author_last": 97.5,
                 "method_epochs": 3}
    row = {"row": "L_CD, λ = 0", "labelled": 5, "seeds": [301], "commits": ["a810499c8551"], "wall_seconds": [90],
           "valid/acc": [45.0], "valid/acc mean": 45.0, "valid/acc sd": 0.0, "test/acc": [],
           "test/acc mean": float("nan"), "test/acc sd": 0.0, "trajectory": [t], "_dirs": [str(run)]}
    out = tmp_path / "page"
    ablation.write({"commit": "a810499c8551" + "0" * 28, "args": "", "rows": [row]}, out, ablation.citation_page)
    page = (tmp_path / "page.md").read_text()
    assert "| 5 | L_CD, λ = 0 | 301 | 45.00 ± 0.00 (45.00) | – | 40.0 → 45.0 (1) → 20.0, 98 % | 90 |" in page
    assert "_dirs" not in (tmp_path / "page.json").read_text()


def test_the_vae_curve_reads_the_bound_and_the_runs_own_schedule(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"identity": {"task.anneal_rate": 1e-4, "task.anneal_floor": 0.1}}))
    pd.DataFrame({"epoch": [1.0, 5.0, 10.0], "step": [500, 2500, 5000], "valid/bound": [200.0, 180.0, 170.0],
                  "valid/runner_up_log_q": [-20.0, -5.0, -4.0], "valid/kl": [0.5, 1.0, 2.0]}).to_csv(
        run / "history.csv", index=False)
    c = ablation.vae_curve(run)
    assert c["epochs"] == [1, 5, 10] and c["valid/bound"] == [200.0, 180.0, 170.0]
    assert c["temperature"] == pytest.approx([0.951229, 0.778801, 0.606531], abs=1e-6)  # exp(-1e-4 * step)
    row = {"row": "direct, rate 1e-4, 20 epochs", "size": 10, "seeds": [301], "commits": ["a810499c8551"],
           "wall_seconds": [300], "test/bound": [168.5], "test/bound mean": 168.5, "test/bound sd": 0.0,
           "curve": [c]}
    page = ablation.vae_page({"commit": "a810499c8551" + "0" * 28, "args": "", "rows": [row]})
    assert ("| 10 | direct, rate 1e-4, 20 epochs | 168.50 ± 0.00 (168.50) | 200.0 / 180.0 / 170.0 | "
            "-20.0 / -5.0 / -4.0 | 0.50 / 1.00 / 2.00 | 0.95 / 0.78 / 0.61 | 300 |") in page


def test_the_sigma_path_reads_the_runs_valid_sigma_and_the_page_sets_it_per_seed(tmp_path):
    run, fixed = tmp_path / "learned", tmp_path / "sigma0"
    for d in (run, fixed):
        d.mkdir()
    pd.DataFrame({"step": [50, 100, 150], "valid/sigma": [0.3, 0.5, 0.04]}).to_csv(run / "history.csv", index=False)
    pd.DataFrame({"step": [50, 100], "valid/acc": [1.0, 2.0]}).to_csv(fixed / "history.csv", index=False)
    path = ablation.sigma_path(run)
    assert path == {"first": 0.3, "last": 0.04, "min": 0.04, "max": 0.5} and ablation.sigma_path(fixed) == {}
    rows = [{"row": name, "seeds": [301], "commits": ["39124fcac386"], "wall_seconds": [200], "sigma": [p],
             "test/acc": [93.3], "test/acc mean": 93.3, "test/acc sd": 0.0, "test/prop_wrong": [0.28],
             "test/prop_wrong mean": 0.28, "test/prop_wrong sd": 0.0} for name, p in (("σ=0", {}), ("lr 1e-4", path))]
    page = ablation.sorting_page({"commit": "39124fcac386" + "0" * 28, "args": "", "rows": rows})
    assert "| σ=0 | 301 | 93.30 ± 0.00 (93.30) | 0.28 ± 0.00 (0.28) | – | 200 |" in page
    assert "| lr 1e-4 | 301 | 93.30 ± 0.00 (93.30) | 0.28 ± 0.00 (0.28) | 0.300 → 0.040 [0.040, 0.500] | 200 |" in page


def test_the_energies_page_sets_each_split_per_row_and_leaves_the_floors_a_out(tmp_path):
    probe = {"citations": 100, "tokens": 2515, "acc_A": 25.0, "acc_E": 28.0, "author_A": 97.0, "author_E": 85.0,
             "gold_below_A": 9.0, "gold_below_author": 10.0, "gap_gold": 3.17, "gap_A": 0.13, "step": 240}
    floor = {**probe, **{k: None for k in ("acc_A", "author_A", "gold_below_A", "gap_A")}, "acc_E": 39.0}
    rows = []
    for label, p in (("floor (BiLSTM-CRF)", floor), ("L_CD, λ = 1 (the table's)", probe)):
        row = {"row": label, "labelled": 5, "seeds": [301, 302], "commits": ["a810499c8551"], "wall_seconds": [1, 2],
               "probe": {split: [p, {**p, "acc_E": p["acc_E"] + 2}] for split in ("train", "valid", "test")}}
        rows.append(row)
    ablation.write({"commit": "a810499c8551" + "0" * 28, "args": "", "remade": 0, "rows": rows}, tmp_path / "page",
                   ablation.energies_page)
    page = (tmp_path / "page.md").read_text()
    assert page.count("| 5 | floor (BiLSTM-CRF) | 301, 302 | – | 40.0 (39.0 / 41.0) | – / 85 (85 / 85) |") == 3
    assert ("| 5 | L_CD, λ = 1 (the table's) | 301, 302 | 25.0 (25.0 / 25.0) | 29.0 (28.0 / 30.0) | 97 (97 / 97) / "
            "85 (85 / 85) | 10 (10 / 10) | 9 (9 / 9) | 3.17 (3.17 / 3.17) / 0.13 (0.13 / 0.13) |") in page
    assert page.index("## Valid") < page.index("## The labelled training") < page.index("## Test")


def test_the_ner_infnet_ablation_forks_at_a_commit_that_can_and_its_page_sets_the_arms_by_epoch():
    import subprocess

    config = subprocess.run(["git", "-C", str(ablation.ROOT), "show", f"{ablation.FORK_COMMIT}:latentstruct/config.py"],
                            capture_output=True, text=True)
    assert config.returncode == 0 and "init_from" in config.stdout  # the pinned commit exists and forks
    assert ablation.infnet_steps(439) == (4390, 7024)  # NER: 10 epochs of pretraining, then 6

    pre = list(range(1, 11))

    def run(valid, method=(), test=0.0):
        return {"fingerprint": "039a58209336", "cpu": "Xeon", "commit": "8ba1b42", "wall_seconds": 100,
                "epochs": pre + list(range(11, 11 + len(method))), "valid": [70.0 + e for e in pre] + list(method),
                "test_at_best": test}

    def seed(n, shift):
        arms = {"base": run(pre)} | {label: run(pre, [80.0 + shift + i, 79.0 + shift], test=70.0 + shift)
                                     for i, label in enumerate(ablation.INFNET_ARMS)}
        return {"seed": n, "arms": arms, "table_run": {**run(pre, [80.0 + shift, 79.0 + shift]),
                                                       "commit": "cb8c1918d7a4"}}

    summary = {"task": "ner", "commit": ablation.FORK_COMMIT, "table_commit": "cb8c1918d7a4" + "0" * 28,
               "args": "x=1", "rows": [], "seeds": [seed(301, 0.0), seed(302, 1.0)]}
    page = ablation.infnet_page(summary)
    assert ("Made by `make ablation-ner-infnet SEEDS=301,302` (`python -m scripts.ablation ner-infnet --seeds "
            "301,302`); seed 303 of the ablation not run yet (`make ablation-ner-infnet`).") in page
    assert "| base: pretraining | – | epoch 10: 80.00 | 80.00 / 80.00 | – |" in page
    # energy frozen, the second arm: 81 then 79 at seed 301, 82 then 80 at seed 302
    assert ("| energy frozen (its lr 1e-12) | `optim.lr=1e-12` | 81.50, 79.50 | 81.00 (11) / 82.00 (11) | "
            "70.50 ± 0.71 (70.00 / 71.00) |") in page
    assert "| 302 | the table's run (commit cb8c1918d7a4) | 81.00, 80.00, –, –, –, – | – | – |" in page
    assert ("- seed 301: base fingerprint 039a58209336, the table's run's; valid at epochs 1-10 equal to that run's; "
            "the as-run arm at epochs 11-16 equal to it") in page
    summary["seeds"][1]["table_run"]["valid"][3] = 1.0  # the table's run computed pretraining differently: said so
    summary["seeds"][1]["table_run"]["valid"][-1] = 1.0
    page = ablation.infnet_page(summary)
    assert "- seed 302: base fingerprint 039a58209336, the table's run's; valid at epochs 1-10 **differ**" in page
    assert "the as-run arm at epochs 11-16 **differ** from it" in page
    pos = ablation.infnet_page({**summary, "task": "pos", "seeds": [{**seed(301, 0.0), "table_run": {}}]})
    assert "# Twitter POS (seed 004 Table 9)" in pos and "Valid: token accuracy" in pos
    assert "- seed 301: base fingerprint 039a58209336, no table run here to compare" in pos


def test_a_fork_still_to_run_has_its_source_run_again_where_the_records_kept_no_checkpoint(fake_campaign, capsys):
    base = {"base": ["-c", FAKE_RUN, "x=0"]}
    ablation.ensure("t", "paper/table", base, only_summary=False, minutes="1")  # packed without a checkpoint
    shutil.rmtree(fake_campaign / "root")  # a fresh machine: the committed records only
    capsys.readouterr()
    runs = {**base, "fork": ["-c", FAKE_RUN, "x=1"]}
    with pytest.raises(SystemExit, match=r"1 runs of the ablation t not completed \(fork\)"):
        ablation.ensure("t", "paper/table", runs, only_summary=True, minutes="1", sources={"fork": "base"})
    ablation.ensure("t", "paper/table", runs, only_summary=False, minutes="1", sources={"fork": "base"})
    out = capsys.readouterr().out
    assert "base (1 of 2)" in out and "fork (2 of 2)" in out  # the source first, then its fork


def test_with_weights_a_run_restored_without_them_is_made_again_and_checked_against_its_record(fake_campaign,
                                                                                                 capsys):
    runs = {"base": ["-c", FAKE_WEIGHTED_RUN, "acc=40.0"], "fork": ["-c", FAKE_WEIGHTED_RUN, "acc=41.0"]}
    where, _ = ablation.ensure("w", "paper/table", runs, only_summary=False, minutes="1", weights=True)
    ablation.ensure("w", "paper/table", runs, only_summary=True, minutes="1", weights=True)  # weights here: nothing
    shutil.rmtree(fake_campaign / "root")  # a fresh machine: the committed records (no checkpoints) only
    capsys.readouterr()
    ablation.ensure("w", "paper/table", runs, only_summary=False, minutes="1")  # a page without a probe: enough
    assert "of 2)" not in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"2 runs of the ablation w keep no weights here \(base, fork\)"):
        ablation.ensure("w", "paper/table", runs, only_summary=True, minutes="1", weights=True)
    ablation.ensure("w", "paper/table", runs, only_summary=False, minutes="1", weights=True)
    out = capsys.readouterr().out
    assert "base (1 of 2)" in out and "fork (2 of 2)" in out and (where / "fork" / "checkpoint.pt").is_file()
    shutil.rmtree(fake_campaign / "root")
    changed = {**runs, "fork": ["-c", FAKE_WEIGHTED_RUN, "acc=42.0"]}  # the code computes differently now
    with pytest.raises(SystemExit, match="fork made again at c0ffeec0ffee differs from its record"):
        ablation.ensure("w", "paper/table", changed, only_summary=False, minutes="1", weights=True)


def test_the_infnet_energies_runs_stop_the_as_run_arm_at_each_epoch_and_the_page_sets_them(tmp_path, monkeypatch):
    monkeypatch.setenv("LATENTSTRUCT_CAMPAIGN", str(tmp_path))
    runs, sources, entry = ablation.infnet_runs("pos", (301,), (11, 12))
    assert list(runs) == ["base-301", *(f"{a}-301" for a in ablation.INFNET_ARMS), "as_run_e11-301", "as_run_e12-301"]
    assert "trainer.max_steps=504" in runs["as_run_e12-301"] and "trainer.max_steps=672" in runs["as_run-301"]
    assert runs["as_run_e12-301"][-1].startswith("trainer.init_from=") and sources["as_run_e12-301"] == "base-301"
    assert entry["commit"] == ablation.FORK_COMMIT and "+experiment" not in entry["args"]

    def probed(acc_a, acc_e):
        split = dict.fromkeys(ablation.PROBE_KEYS, 0.5) | {"acc_A": acc_a, "acc_E": acc_e, "step": 1}
        return {s: split for s in ("train", "valid", "test")}

    made = []
    curve = [70.0, 71.0, 72.0]  # the as-run arm's valid curve (short: a stand-in)
    for seed, shift in ((301, 0.0), (302, 2.0)):
        made += [{"arm": arm, "seed": seed, "epoch": 3, "step": 1, "valid_reported": 80.0 + shift, "cpu": "Xeon",
                  "valid_curve": curve, "probe": probed(80.0 + shift, 78.0 - shift)}
                 for arm in ["base", *ablation.INFNET_ARMS]]
        made += [{"arm": f"as_run_e{e}", "seed": seed, "epoch": 2, "step": 1, "valid_reported": 80.0 + shift,
                  "cpu": "Xeon", "valid_curve": curve[:2], "probe": probed(80.0 + shift, 70.0)}
                 for e in ablation.INFNET_PROBE_EPOCHS["pos"]]
    arms = {label: list(arm) for label, arm in ablation.INFNET_ARMS.items()}
    page = ablation.infnet_energies_page({"task": "pos", "commit": ablation.FORK_COMMIT, "args": "x=1", "rows": [],
                                          "runs": made, "arms": arms})
    assert "Made by `make ablation-pos-infnet-energies`" in page and "20 runs on Xeon" in page
    assert "Which of the energy's parameters" not in page  # no swaps: no section
    for r in made:
        if r["arm"] == "as_run":
            split = {"run": 70.0, "base": 90.0 + r["seed"] - 301, "back.bilstm": 89.0, "only.bilstm": 72.0,
                     "steps_between": 84, "step_mean.bilstm": 0.1, "step_max.bilstm": 0.9 + (r["seed"] - 301) / 10}
            r["swap"] = {"train": split, "valid": split}
    swapped = ablation.infnet_energies_page({"task": "pos", "commit": ablation.FORK_COMMIT, "args": "x=1",
                                             "rows": [], "runs": made, "arms": arms})
    assert "| arm (epoch) | split | the run | the base | bilstm back | only bilstm |" in swapped
    assert "| as_run (3) | valid | 70.00 ± 0.00 | 90.50 ± 0.71 | 89.00 ± 0.00 | 72.00 ± 0.00 |" in swapped
    assert "| arm (epoch) | method steps | bilstm: mean | bilstm: largest |" in swapped
    assert "| as_run (3) | 84 | 0.100 ± 0.000 | 0.950 ± 0.071 |" in swapped
    assert ("| as run (E: Adam 1e-3, A and F: Adam 1e-3) (epoch 16) | 81.00 ± 1.41 | 77.00 ± 1.41 | 0.50 ± 0.00 "
            "| 0.50 ± 0.00 | 0.50 ± 0.00 | 0.50 ± 0.00 |") in page
    assert "| energy frozen (its lr 1e-12) (`optim.lr=1e-12`, epoch 16) |" in page and "probe's own" not in page
    assert "| 12 | 81.00 ± 1.41 | 70.00 ± 0.00 |" in page and "| 10 | 81.00 ± 1.41 | 77.00 ± 1.41 |" in page
    assert "equals each run's last evaluation (its `history.csv`): all 20 runs" in page
    assert "Each stopped fork's valid curve equals the as-run arm's to its epoch (two decimals): all." in page
    made[-1]["valid_curve"], made[0]["valid_reported"] = [70.0, 75.0], 1.0  # a fork off its arm; a probe off its run
    made += [{**made[0], "arm": "lam0"}]
    arms |= {"lam0": ["A's term dropped (λ = 0)", ["task.lam=0"]]}
    page = ablation.infnet_energies_page({"task": "pos", "commit": ablation.FORK_COMMIT, "args": "x=1", "rows": [],
                                          "runs": made, "arms": arms})
    assert "| A's term dropped (λ = 0) (`task.lam=0`, epoch 16) |" in page and "this probe's own" in page
    assert "**not** for base-301" in page and "**not** for as_run_e15-302" in page
    ner = ablation.infnet_energies_page({"task": "ner", "commit": ablation.FORK_COMMIT, "args": "x=1", "rows": [],
                                         "runs": [{**r, "probe": {s: {**p, "f1_A": 1.0, "f1_E": 2.0}
                                                                  for s, p in r["probe"].items()}}
                                                  for r in made if r["arm"] in ("base", "as_run_e11", *arms)],
                                         "arms": arms})
    assert "| arm | A: F1 | argmin E: F1 | A: token acc |" in ner
    assert "| epoch | valid: A F1 | valid: argmin E F1 |" in ner
    assert "| 11 | 1.00 ± 0.00 | 2.00 ± 0.00 | 81.00 ± 1.41 | 70.00 ± 0.00 |" in ner and "| 12 |" not in ner
