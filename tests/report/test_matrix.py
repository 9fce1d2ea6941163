"""latentstruct.report.matrix: the cells of the spec, the grid, the launches, selection on validation, the table."""

import json
import math
import subprocess

import pandas as pd
import pytest
import yaml

from latentstruct.report import matrix
from latentstruct.report.tables import load_runs, load_spec
from tests.helpers import ROOT, compose, run_cli


@pytest.fixture(scope="module")
def spec():
    return load_spec(ROOT / matrix.SPEC)


def test_the_spec_names_real_experiments_and_estimators(spec):
    experiments = {p.stem for p in (ROOT / "configs" / "experiment").glob("planted_*.yaml")}
    assert {s["experiment"] for s in spec["settings"]} == experiments
    estimators = {p.stem for p in (ROOT / "configs" / "estimator").glob("*.yaml")}
    named = {v for r in spec["rows"] for k, v in matrix._pairs(r["overrides"]) if k == "estimator"}
    # perturb_and_map is st_gumbel by another name (a subclass that changes nothing); ppo drives a policy; exact
    # enumerates every vertex (thousands on the planted trees)
    assert named == estimators - {"perturb_and_map", "ppo", "exact"}
    assert all(key in spec["grid"] for r in spec["rows"] for key in r["grid"])


#: each estimator's own key (issue #38), tuned beside the learning rate
OWN_KEYS = {"gumbel_softmax": ["task.estimator.tau"], "st_gumbel": ["task.estimator.tau"],
            "sfe_rloo": ["task.estimator.samples"], "spigot": ["task.estimator.eta"],
            "spigot_ce": ["task.estimator.eta"], "spigot_eg": ["task.estimator.eta"],
            "blackbox": ["task.estimator.lam"], "imle": ["task.estimator.lam"],
            "neuralsort": ["task.estimator.tau"], "neuralsort_stochastic": ["task.estimator.tau"],
            "perturbed": ["task.estimator.sigma", "task.estimator.samples"]}


def test_every_estimator_tunes_its_own_setting_beside_the_learning_rate(spec):
    rows = {r["name"]: r for r in spec["rows"]}
    for name, keys in OWN_KEYS.items():
        assert rows[name]["grid"] == ["optim.lr", *keys], name
        estimator = dict(matrix._pairs(rows[name]["overrides"]))["estimator"]
        for key in keys:  # a setting of that estimator, swept by a launch, with more than one value
            assert key.removeprefix("task.estimator.") in compose(f"estimator={estimator}").task.estimator, (name, key)
            assert key in matrix.SWEPT
            values = (rows[name].get("grid_values") or {}).get(key, spec["grid"][key])
            assert len(values) > 1
    assert set(spec["grid"]) <= set(matrix.SWEPT)
    perturbed = next(c for c in matrix.cells(spec) if c.row == "perturbed" and c.setting == "topk")
    assert len(matrix.grid_points(spec, perturbed)) == 4 * 3 * 2
    rloo = next(c for c in matrix.cells(spec) if c.row == "sfe_rloo" and c.setting == "topk")
    assert {dict(p)["task.estimator.samples"] for p in matrix.grid_points(spec, rloo)} == {"2", "4", "8"}


def test_cells_apply_each_row_where_it_can(spec):
    cells = {(c.row, c.setting) for c in matrix.cells(spec)}
    assert ("marginals", "matching") not in cells and ("sparsemap", "matching") in cells
    assert {s for r, s in cells if r == "neuralsort"} == {"topk"}
    assert {s for r, s in cells if r == "gold"} == {s["name"] for s in spec["settings"]}
    spigot = next(c for c in matrix.cells(spec) if c.row == "spigot" and c.setting == "topk")
    points = matrix.grid_points(spec, spigot)
    assert len(points) == len(spec["grid"]["optim.lr"]) * len(spec["grid"]["task.estimator.eta"])
    assert points[0] == (("optim.lr", repr(spec["grid"]["optim.lr"][0])), ("task.estimator.eta", "0.1"))


def test_launches_sweep_a_product_and_split_the_rest():
    def job(estimator, lr, seed):
        return (("+experiment", "planted_topk"), ("estimator", estimator), ("optim.lr", lr), ("trainer.seed", seed))

    product = [job(e, lr, s) for e in ("a", "b") for lr in ("0.1", "0.01") for s in ("1", "2")]
    assert matrix.launches(product) == [[("+experiment", "planted_topk"), ("estimator", "a,b"),
                                         ("optim.lr", "0.1,0.01"), ("trainer.seed", "1,2")]]
    chosen = [job("a", "0.1", s) for s in "12"] + [job("b", "0.1", s) for s in "12"] + [job("c", "0.01", "1")]
    got = matrix.launches(chosen)  # a and b share their lr: one launch; c another
    assert sorted(dict(g)["estimator"] for g in got) == ["a,b", "c"]
    assert sum(len(dict(g)["trainer.seed"].split(",")) * len(dict(g)["estimator"].split(",")) for g in got) == 5


def test_a_launch_sweeps_estimators_only_with_their_own_keys_swept_too():
    """The lab's seeds at the chosen points: Gumbel-softmax and ST-Gumbel both at τ = 2 made one launch
    `estimator=gumbel_softmax,st_gumbel task.estimator.tau=2.0`, which Hydra refuses before any run — it composes a
    multirun's configuration first without its sweeps, with the default estimator, which has no τ (the campaign at
    3eaf6cf lost 7 runs so). Such jobs go an estimator at a time; swept values of the key may stay together."""
    with pytest.raises(Exception, match="tau"):  # what Hydra composes first for that launch
        compose("+experiment=planted_topk", "latent=predicted", "task.estimator.tau=2.0")

    def job(estimator, tau, seed):
        return (("+experiment", "planted_topk"), ("estimator", estimator), ("task.estimator.tau", tau),
                ("trainer.seed", seed))

    same = [job(e, "2.0", s) for e in ("gumbel_softmax", "st_gumbel") for s in ("301", "302")]
    assert [dict(launch) for launch in matrix.launches(same)] == [
        {"+experiment": "planted_topk", "estimator": e, "task.estimator.tau": "2.0", "trainer.seed": "301,302"}
        for e in ("gumbel_softmax", "st_gumbel")]
    swept = [job(e, t, "301") for e in ("gumbel_softmax", "st_gumbel") for t in ("0.5", "2.0")]
    assert [dict(launch) for launch in matrix.launches(swept)] == [
        {"+experiment": "planted_topk", "estimator": "gumbel_softmax,st_gumbel", "task.estimator.tau": "0.5,2.0",
         "trainer.seed": "301"}]


def _record(root, name, *, experiment="planted_topk", estimator="spigot", lr=0.01, eta=1.0, seed=301, valid=70.0,
            test=71.0, recovery=40.0, exact=10.0, status="completed", latent="predicted"):
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    config = {"latent": latent, "optim": {"lr": lr}, "estimator": {"eta": eta}, "trainer": {"seed": seed}}
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    decoder = "linear" if latent == "none" else "bilinear"
    choices = {"experiment": experiment, "estimator": estimator, "decoder": decoder}
    (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"runtime": {"choices": choices}}}))
    metrics = {"valid/acc": valid, "test/acc": test, "test/recovery": recovery, "test/exact": exact}
    record = {"status": status, "metrics": metrics if status == "completed" else {}, "seed": seed,
              "git_commit": "abc", "hardware": "cpu", "torch": "2", "wall_seconds": 2.0, "steps": 600}
    (run / "metrics.json").write_text(json.dumps(record))


def test_chance_is_read_from_the_first_run_of_each_setting_that_recorded_it(spec, tmp_path):
    small = _small_spec(spec, settings=("topk", "matching"))
    _record(tmp_path, "a", experiment="planted_topk", latent="none")  # no structure: nothing recorded
    _record(tmp_path, "b", experiment="planted_topk", status="failed")
    (tmp_path / "b" / "report.json").write_text(json.dumps({"chance": {"recovery": 1.0}}))
    _record(tmp_path, "c", experiment="planted_topk")
    (tmp_path / "c" / "report.json").write_text(json.dumps({"chance": {"recovery": 0.5, "exact": 12.5}}))
    # top-k's recovery is its test/exact; matching: no run, left out
    assert matrix.chance(small, load_runs(tmp_path)) == {"topk": 12.5}


def _small_spec(spec, rows=("linear", "spigot", "ste_i"), settings=("topk",)):
    small = {**spec, "rows": [r for r in spec["rows"] if r["name"] in rows],
             "settings": [s for s in spec["settings"] if s["name"] in settings],
             "grid": {"optim.lr": [0.01, 0.1], "task.estimator.eta": [1.0]}, "seeds": [301, 302]}
    return small


def test_selection_uses_validation_only_and_the_selection_seed(spec, tmp_path):
    small = _small_spec(spec)
    cell = next(c for c in matrix.cells(small) if c.row == "spigot")
    assert matrix.select(small, cell, load_runs(tmp_path)) == (None, "not run yet")
    _record(tmp_path, "a", lr=0.01, valid=80.0, test=60.0)
    assert matrix.select(small, cell, load_runs(tmp_path)) == (None, "not run yet")  # lr 0.1 not run yet
    _record(tmp_path, "b", lr=0.1, valid=75.0, test=95.0)
    _record(tmp_path, "c", lr=0.1, valid=99.0, seed=302)  # another seed: not looked at
    _record(tmp_path, "d", lr=0.01, valid=99.0, estimator="ste_i")  # another row
    point, why = matrix.select(small, cell, load_runs(tmp_path))
    assert point == (("optim.lr", "0.01"), ("task.estimator.eta", "1.0")) and why == "valid/acc 80.00"
    # a failed grid point is passed over and said
    _record(tmp_path, "e", lr=0.1, seed=301, estimator="ste_i", status="failed")
    ste = next(c for c in matrix.cells(small) if c.row == "ste_i")
    assert matrix.select(small, ste, load_runs(tmp_path)) == ((("optim.lr", "0.01"),),
                                                              "valid/acc 99.00 (1 points failed)")
    grid, rest = matrix.plan(small, load_runs(tmp_path), [301, 302])
    assert [dict(j).get("latent") for j in grid] == ["none", "none", "predicted"]  # linear's points, the failed run
    assert ("trainer.seed", "302") in rest[0] and all(("optim.lr", "0.01") in job for job in rest)


def test_the_table_marks_the_best_and_the_cells_with_fewer_seeds(spec, tmp_path):
    small = _small_spec(spec)
    for seed, (acc, rec) in zip((301, 302), ((80.0, 30.0), (82.0, 34.0)), strict=True):
        for lr in (0.01, 0.1):
            _record(tmp_path, f"s{seed}{lr}", lr=lr, seed=seed, valid=acc - (lr > 0.05), test=acc, exact=rec)
            _record(tmp_path, f"i{seed}{lr}", estimator="ste_i", lr=lr, seed=seed, valid=70.0, test=70.0, exact=50.0)
    for lr in (0.01, 0.1):
        _record(tmp_path, f"lin{lr}", latent="none", lr=lr, valid=65.0 + lr, test=65.0, exact=math.nan)
    out = matrix.write(small, load_runs(tmp_path), [301, 302], tmp_path / "lab" / "matrix.md", 1.0, "make x")
    text = out.read_text()
    assert "| SPIGOT | **81.0** ± 1.0 | 32.0 ± 2.0 |" in text  # median of 80, 82; recovery = exact for top-k
    assert "| STE-I | 70.0 ± 0.0 | **50.0** ± 0.0 |" in text
    assert "| Linear model (no latent) | 65.0 (1)† | — |" in text  # one seed; no latent, no recovery
    assert "**Status:** 2 of 3 cells with all 2 seeds; 1 with fewer (marked †)." in text
    assert "SPIGOT recovers the latent worse" in text and "| SPIGOT | lr 0.01, η 1 |" in text
    table = pd.read_csv(out.with_suffix(".csv"))
    assert list(table["point"]) == ["lr 0.1", "lr 0.01", "lr 0.01, η 1"]  # linear: its best valid/acc
    assert "an edge of its grid (there the best setting may lie beyond the grid): lr: 1 at the largest value, 2 at " \
           "the smallest, of 3 cells." in text  # a grid of two learning rates; η, one value, is not tuned
    assert out.with_suffix(".png").stat().st_size > 1000
    runs = load_runs(tmp_path)
    cost = json.loads(out.with_suffix(".json").read_text())  # results/bench/cpu.md's lab line reads it
    assert cost["runs"] == len(runs) == 10 and cost["completed"] == int(runs["completed"].sum())
    assert cost["wall_seconds"] == pytest.approx(runs["wall_seconds"].fillna(0).sum(), abs=0.1)


@pytest.mark.slow
def test_the_command_runs_the_grid_then_the_seeds_and_skips_what_is_done(spec, tmp_path, monkeypatch, capsys):
    """End to end on one planted structure (a few steps): grid at seed 301, selection, seed 302, then nothing; a row
    tuning its own key (blackbox's λ) on a structure read through the data's fixed read-out (issue #38)."""
    small = {**_small_spec(spec, rows=("blackbox",), settings=("topk",)),
             "grid": {"optim.lr": [0.01], "task.estimator.lam": [1.0, 10.0]}, "notes": ["a note"]}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(small))
    monkeypatch.setattr(matrix, "LAUNCHER", ("hydra/launcher=basic", "trainer.threads=1", "trainer.progress=false",
                                             "trainer.resume=true"))
    launched, real = [], subprocess.run

    def launch(argv, *args, **kwargs):  # a launch runs as `python -m latentstruct.train ...` would, in this process
        if argv[1:3] != ["-m", "latentstruct.train"]:
            return real(argv, *args, **kwargs)
        launched.append(run_cli(*argv[3:], cwd=tmp_path))
        return launched[-1]

    monkeypatch.setattr(subprocess, "run", launch)
    tiny = ("dataset.n_train=60 dataset.n_valid=20 dataset.n_test=20 trainer.max_steps=3 trainer.eval_every=3 "
            "trainer.batch_size=30")
    argv = ["--spec", str(path), "--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "res"),
            "--args", tiny]
    assert matrix.main(argv) == 0
    said = capsys.readouterr().out
    assert "topk grid: 2 runs to go in 1 launches" in said and "seed 302: 1 runs to go" in said
    assert [done.returncode for done in launched] == [0, 0]
    runs = load_runs(tmp_path / "runs" / small["sweep_dir"])
    assert len(runs) == 3 and runs["completed"].all()
    assert set(runs["choices.decoder"]) == {"known_readout"} and set(runs["task.estimator.lam"]) == {1.0, 10.0}
    text = (tmp_path / "res" / "lab" / "matrix.md").read_text()
    assert "**Status:** 1 of 1 cells with all 2 seeds." in text and "- a note" in text
    assert matrix.main(argv) == 0
    said = capsys.readouterr().out
    assert "topk grid: 0 runs to go" in said and "seed 302: 0 runs to go" in said
