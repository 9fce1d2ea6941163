"""Ranges of numeric settings (latentstruct/ranges.py): declared in the signature, refused at composition."""

from __future__ import annotations

import dataclasses
import math

import pytest

import latentstruct.config as config
from latentstruct.ranges import Above, AtLeast, Between, NonNegative, NonZero, Positive, Probability, constraint_of
from reliability import values
from tests.helpers import compose as _compose
from tests.helpers import run_cli


@pytest.mark.parametrize(("allowed", "text", "inside", "outside"), [
    (Positive, "> 0", [1e-9, 1, 3.5], [0, 0.0, -1e-3, math.nan]),
    (NonNegative, ">= 0", [0, 0.0, 2], [-1, -1e-9]),
    (AtLeast(1), ">= 1", [1, 7], [0, -3, 0.5]),
    (Above(1), "> 1", [1.1], [1, 1.0, 0]),
    (Probability, "in [0, 1]", [0, 0.5, 1], [-0.1, 1.5]),
    (Between(0, 1, hi_open=True), "in [0, 1)", [0, 0.99], [1, -0.1]),
    (Between(0, 1, lo_open=True, hi_open=True), "in (0, 1)", [0.2], [0, 1]),
    (NonZero(), "!= 0", [-12, 0.5], [0, 0.0, math.nan]),
])
def test_each_kind_of_range_refuses_what_is_outside_it(allowed, text, inside, outside):
    assert str(allowed) == text
    assert all(v in allowed for v in inside), inside
    assert not any(v in allowed for v in outside), outside
    assert "1" not in allowed and True not in allowed and None not in allowed  # numbers only (null: by validate)


def test_the_schema_keeps_the_plain_type_and_puts_the_range_in_the_metadata():
    from typing import Annotated

    assert constraint_of(Annotated[float, Positive]) is Positive
    assert constraint_of(Annotated[int | None, AtLeast(1)]) == AtLeast(1)
    assert constraint_of(float) is None
    fields = {f.name: f for f in dataclasses.fields(config.schema("latentstruct.estimators.Spigot"))}
    assert fields["eta"].type is float and fields["eta"].metadata["range"] == Positive
    assert fields["steps"].type is int and fields["steps"].metadata["range"] == AtLeast(1)
    assert str(fields["eta"].metadata["help"]).startswith("pull-back step size")
    fields = {f.name: f for f in dataclasses.fields(config.schema("latentstruct.structures.ProjectiveDepTree"))}
    assert config.range_text(fields["sparsemap_max_iter"].metadata["range"], True) == ">= 1 or null"


def test_validate_refuses_a_value_out_of_range_in_one_line_naming_the_key():
    with pytest.raises(config.ConfigError) as err:
        config.validate(_compose("optim.lr=-1e-3"))
    assert str(err.value) == "optim.lr = -0.001 is out of range: must be > 0"
    with pytest.raises(config.ConfigError, match=r"^trainer.batch_size = 0 is out of range: must be >= 1 or null$"):
        config.validate(_compose("trainer.batch_size=0"))
    # the edges and null are in range: validation is not a refusal of everything
    config.validate(_compose("trainer.batch_size=null", "trainer.max_steps=1", "optim.weight_decay=0",
                             "trainer.log_seconds=null", "dataset.noise=0"))
    config.validate(_compose("+experiment=sst_spigot", "task.encoder.dropout=1", "task.decoder.dropout=0",
                             "task.structure.sparsemap_max_iter=null", "dataset.subset=0"))


def test_an_interpolated_value_is_checked_resolved_and_a_list_item_by_item():
    # knn_direct_sigma1: estimator.samples = ${tuned.samples.${k:${task.k}}}
    cfg = _compose("+experiment=knn_direct_sigma1", "task.k=1", "tuned.samples.k1=0")
    with pytest.raises(config.ConfigError, match=r"^task.estimator.samples = 0 is out of range: must be >= 1$"):
        config.validate(cfg)
    with pytest.raises(config.ConfigError, match=r"^task.energy.feature_hidden.1 = 0 is out of range"):
        config.validate(_compose("+experiment=mlc_cd", "task.energy.feature_hidden=[150,0]"))


def test_a_sweep_is_refused_up_front_for_any_of_its_jobs():
    for args in (["-m", "optim.lr=1e-3,-1e-3"], ["-m", "trainer.seed=1,2", "optim.lr=range(-2,2)"],
                 ["-m", "+experiment=synthetic_gumbel_softmax,synthetic_st_gumbel", "task.estimator.tau=1,0"]):
        with pytest.raises(config.ConfigError, match=r"out of range"):
            config.check_command_line(args)
    # every combination of the groups' values is composed; beyond MAX_COMPOSED, each value once
    assert config._sweep_jobs([["a=1", "a=2"], ["b=1", "b=2"]]) == [("a=1", "b=1"), ("a=1", "b=2"), ("a=2", "b=1"),
                                                                    ("a=2", "b=2")]
    wide = [[f"a={i}" for i in range(config.MAX_COMPOSED)], ["b=1", "b=2"]]
    assert config._sweep_jobs(wide) == [("a=0", "b=1"), *((f"a={i}", "b=1") for i in range(1, config.MAX_COMPOSED)),
                                        ("a=0", "b=2")]
    ok = ["-m", "+experiment=synthetic_spigot,synthetic_spigot_ce", "task.estimator.eta=0.5,2", "trainer.seed=1,2,3"]
    assert config.check_command_line(ok) == ok


@pytest.mark.slow
def test_the_command_line_refuses_before_hydra_and_reads_no_data(tmp_path):
    """``sst_spigot`` reads its data from paths.data_dir: an empty folder would fail the run, but the range check
    comes first, in one line, with exit status 2, and no run directory is made."""
    out = run_cli("+experiment=sst_spigot", f"paths.data_dir={tmp_path}/none", "optim.lr=-1e-3", cwd=tmp_path,
                  env={"PATH": ""})
    assert out.returncode == 2
    assert out.stderr == "error: optim.lr = -0.001 is out of range: must be > 0\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_every_fault_injection_case_is_refused_clearly():
    outcomes = values.run()
    assert len(outcomes) == len(values.CASES) >= 30
    assert [o for o in outcomes if o.verdict != "clear"] == []
    assert all(o.message.count("\n") == 0 and "out of range" in o.message for o in outcomes)


def test_the_verdicts_tell_clear_unclear_and_accepted_apart():
    assert values.check((None, "optim.lr=0.01", "in range")).verdict == "accepted"
    assert values.check((None, "+optim.nope=1", "an unknown key")).verdict == "clear"
    unclear = values.check(("nope_experiment", "optim.lr=1", "an unknown experiment: several lines"))
    assert unclear.verdict == "unclear" and "nope_experiment" in unclear.message
