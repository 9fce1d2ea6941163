"""The config schemas (latentstruct/config.py): every setting declared once, in the signature it configures."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import MISSING

import latentstruct.config as config
from tests.helpers import compose as _compose
from tests.helpers import run_cli

CONFIGS = config.CONFIG_DIR
# Groups whose options are whole compositions (package _global_), not instances of one schema.
COMPOSITIONS = {"experiment", "sweep", "preset", "hydra"}
# Groups typed by the run schema (TrainConf's fields), with no target of their own.
TYPED = {"trainer", "paths"}


def _options() -> list[tuple[str, str, Path]]:
    return sorted(
        (str(p.parent.relative_to(CONFIGS)), p.stem, p)
        for p in CONFIGS.rglob("*.yaml")
        if p.parent != CONFIGS and p.relative_to(CONFIGS).parts[0] not in COMPOSITIONS
    )


@pytest.mark.parametrize(("group", "name", "path"), _options(), ids=lambda x: str(x) if isinstance(x, str) else "")
def test_every_option_names_its_schema_and_only_its_settings(group, name, path):
    names = config.option_schemas(path)
    if group in TYPED:
        assert not names
        return
    raw = yaml.safe_load(path.read_text()) or {}
    if name == "tuned":  # the target an experiment's tuned table gives per dataset (test_knn checks those targets)
        assert raw == {"_target_": f"${{tuned.${{dataset.name}}.{group}}}", "_partial_": True} and not names
        return
    assert len(names) == 1, f"{group}/{name} names {names}: one schema per option"
    node = raw.get("task", {}) if group == "task" else raw
    fields = {f.name for f in dataclasses.fields(config.schema(names[0]))}
    assert set(node) - {"defaults"} <= fields, f"{group}/{name}: {set(node) - fields - {'defaults'}} are not settings"
    assert "_target_" not in node, f"{group}/{name}: the schema carries the target"


def test_every_schema_is_its_signature_with_help():
    """Fields = the settings of the target's signature, with the same defaults, and each one documented."""
    names = config._schema_names(CONFIGS)
    assert names, "no schema named under configs/"
    for name in sorted(names - set(config._EXTERNAL)):
        obj = config.locate(name)
        fields = {f.name: f for f in dataclasses.fields(config.schema(name)) if not f.name.startswith("_")}
        params = config.settings(obj)
        assert list(fields) == list(params), name
        for key, param in params.items():
            default = (
                fields[key].default_factory()
                if fields[key].default_factory is not dataclasses.MISSING
                else fields[key].default
            )
            expected = MISSING if param.default is inspect.Parameter.empty else param.default
            if fields[key].metadata.get("part"):  # a task's model part: a node of its own, null where none is chosen
                expected = None
            assert default == (list(expected) if isinstance(expected, tuple) else expected), f"{name}.{key}"
            assert fields[key].metadata.get("help"), f"{name}.{key} has no help text (an Args: entry)"


def test_help_texts_read_args_sections_through_the_class_hierarchy():
    from latentstruct.estimators import Spigot

    texts = config.help_texts(Spigot)
    assert texts["eta"].startswith("pull-back step size") and texts["eval_latent"].startswith("decoder input")


@pytest.mark.slow
def test_option_lists_hold_no_internal_names():
    done = run_cli("--help", cwd=CONFIGS.parent)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    groups = out.split("== Groups (group=option) ==")[1].split("== Settings")[0]
    assert "base_" not in groups and "common" not in groups
    settings = out.split("== Settings")[1]
    assert "    eta: 1.0  # pull-back step size η." in settings.splitlines()  # each setting, its help (issue 37)


def test_unknown_keys_and_choices_are_refused_naming_the_key():
    with pytest.raises(config.ConfigError, match=r"unknown key 'trainer.max_step'; did you mean trainer.max_steps"):
        config.validate(_compose("+trainer.max_step=10"))
    with pytest.raises(config.ConfigError, match=r"unknown key 'task.scorer.bais'; did you mean task.scorer.bias"):
        config.validate(_compose("+task.scorer.bais=false"))
    with pytest.raises(config.ConfigError, match=r"logger.mode='sometimes' is not one of"):
        config.validate(_compose("logger=wandb", "logger.mode=sometimes"))
    config.validate(_compose())  # the default experiment is valid


def _paper_experiments() -> list[str]:
    """The experiments the table specs' rows name (``match: {choices.experiment: ...}``)."""
    specs = (CONFIGS.parent / "experiments").glob("*/*.yaml")
    rows = [row for spec in specs for row in yaml.safe_load(spec.read_text()).get("rows", [])]
    return sorted({row["match"]["choices.experiment"] for row in rows if "choices.experiment" in row.get("match", {})})


def test_every_paper_row_names_an_experiment_by_its_flat_name():
    names = _paper_experiments()
    assert len(names) > 50 and all("/" not in name for name in names)
    assert set(names) <= {e for family in config.experiments().values() for e in family}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(config.experiments()))
def test_every_experiment_composes_and_validates(family):
    """Every experiment (the paper rows' among them) composes and validates: its keys, choices and ranges; each as
    the GPU runs compose it, with trainer.device=cuda (scripts/gpu_table.sh), which none overrides. A family a test
    (the workers share them)."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        for name in config.experiments()[family]:
            cfg = compose("train", overrides=[f"+experiment={name}", "trainer.device=cuda"])
            config.validate(cfg)
            assert cfg.trainer.device == "cuda", name


def test_the_device_does_not_name_a_sweeps_run_directories():
    """A run's directory says what it computes, not where: the same here and on a GPU machine (trainer.device=cuda),
    so that the runs brought back (make gpu-unpack) are the sweep's own, skipped or resumed by make table."""
    from tests.helpers import compose as with_hydra

    keys = with_hydra("+sweep=spigot_sst", "trainer.device=cuda", hydra=True).hydra.job.config.override_dirname
    assert "trainer.device" in keys.exclude_keys


def test_the_old_nested_experiment_names_are_refused_with_the_flat_one_suggested():
    """``sst/spigot`` (before the flat names; scripts/migrate_experiment_names.py rewrites old records) is no alias."""
    with pytest.raises(config.ConfigError, match=r"^unknown experiment 'sst/spigot'; did you mean sst_spigot"):
        config.check_command_line(["-m", "+experiment=sst/spigot,snli/spigot", "trainer.seed=1"])


def test_an_unknown_experiment_lists_every_experiment_by_family():
    with pytest.raises(config.ConfigError) as err:
        config.check_command_line(["+experiment=nope"])
    lines = str(err.value).splitlines()
    assert lines[0] == "unknown experiment 'nope'"  # nothing close
    for family, names in config.experiments().items():
        assert sum(line.split() == [family, *(n + "," for n in names[:-1]), names[-1]] for line in lines) == 1
    assert "--help" in lines[-1] and "docs/configs.md" in lines[-1]
    with pytest.raises(config.ConfigError, match=r"^unknown experiment 'sst/spigt'; did you mean sst_spigot"):
        config.check_command_line(["+experiment=sst/spigt"])
    with pytest.raises(config.ConfigError, match=r"^unknown experiment 'nope'"):  # every value of a sweep
        config.check_command_line(["-m", "+experiment=sst_spigot,nope"])


@pytest.mark.parametrize("args", [["trainer.max_step=10"], ["+trainer.max_step=10"], ["-m", "trainer.max_step=1,2"],
                                  ["+experiment=sst_spigot", "trainer.max_step=10", "--cfg", "job"]])
def test_an_unknown_key_is_refused_at_composition_with_or_without_plus(args):
    with pytest.raises(config.ConfigError, match=r"unknown key 'trainer.max_step'; did you mean trainer.max_steps"):
        config.check_command_line(args)


def test_the_command_line_check_lets_through_what_hydra_accepts():
    """A sweep (its first values are composed), --cfg, --help, a launcher, a deleted group, an added option, a sweep
    config, resumption into a given directory; and what Hydra refuses itself (an unknown option) is left to it."""
    for args in (["-m", "+experiment=sst_spigot,sst_marginals", "trainer.seed=range(301,303)"],
                 ["+experiment=sst_spigot", "--cfg", "job"], ["--help"], ["--hydra-help"],
                 ["-m", "hydra/launcher=joblib", "estimator=ste_i,spigot", "trainer.threads=1"],
                 ["~scorer", "latent=none", "decoder=linear"], ["+experiment=listops_lstm", "+preset=listops_cpu"],
                 ["+sweep=direct_sorting", "trainer.threads=1"], ["trainer.resume=true", "hydra.run.dir=somewhere"],
                 ["+tuned.k3.lr=0.1"], ["dataset=nope"], ["task.estimator.eta=fast"]):
        assert config.check_command_line(args) == args


def test_a_task_is_one_nested_node_with_its_parts_under_it():
    """The parts are nodes under the task (task.estimator), chosen by their groups (estimator=spigot); the run
    config has no part slot of its own."""
    cfg = _compose("+experiment=sst_spigot")
    assert not {"encoder", "scorer", "structure", "estimator", "decoder"} & set(cfg)
    assert cfg.task.estimator._target_ == "latentstruct.estimators.Spigot" and cfg.task.estimator.eta == 0.1
    assert cfg.task.encoder._target_.endswith("BiLSTMEncoder")
    assert _compose("+experiment=sst_spigot", "estimator=spigot_ce").task.estimator._target_.endswith("SpigotCe")
    assert list(config.parts(config.locate(cfg.task._target_))) == ["encoder", "scorer", "structure", "estimator",
                                                                      "decoder"]
    with pytest.raises(config.ConfigError, match=r"unknown key 'estimator': the model parts are nodes under the task, "
                                                 r"task.estimator"):
        config.validate(_compose("+experiment=sst_spigot", "+estimator.eta=0.1"))


def test_a_part_the_task_does_not_take_is_refused():
    """``decoder=linear`` on a task without a decoder (knn: encoder, estimator, sigma_net) is an error, not a
    no-op: Hydra cannot place it under the task's schema, and the command line says so in one line."""
    with pytest.raises(config.ConfigError, match=r"^task KNN takes no decoder \(its parts: encoder, estimator, "
                                                 r"sigma_net\): remove the decoder override"):
        config.check_command_line(["+experiment=knn_direct_sigma1", "+decoder=linear"])
    with pytest.raises(Exception, match=r"Key 'decoder' not in 'KNNConf'"):
        _compose("+experiment=knn_direct_sigma1", "+decoder=linear")
    with pytest.raises(config.ConfigError, match=r"unknown key 'task.decoder'"):
        config.validate(_compose("+experiment=knn_direct_sigma1", "++task.decoder.hidden=3"))


def test_a_part_of_another_kind_or_without_an_option_is_refused():
    with pytest.raises(config.ConfigError, match=r"^task.structure: task LatentTreeSST takes as structure "
                                                 r"ProjectiveDepTree or NonProjectiveDepTree, not "
                                                 r"latentstruct.structures.Categorical"):
        config.validate(_compose("task=sst", "structure=categorical"))
    with pytest.raises(config.ConfigError, match=r"^task.sigma_net holds settings \(hidden\) but no option: choose "
                                                 r"one \(sigma_net=<option>\)"):
        config.validate(_compose("+experiment=knn_direct_sigma1", "++task.sigma_net.hidden=3"))


def test_a_task_without_a_latent_source_refuses_one():
    from latentstruct.tasks.base import build_task

    with pytest.raises(ValueError, match="task KNN has no latent source to choose: remove latent=gold"):
        build_task(_compose("+experiment=knn_direct_sigma1", "latent=gold"), {}, {})


def test_the_option_reference_is_current():
    """docs/configs.md is generated from the schemas: regenerate it with `python -m latentstruct.config`."""
    assert (CONFIGS.parent / "docs" / "configs.md").read_text() == config.reference(), (
        "docs/configs.md is stale: python -m latentstruct.config > docs/configs.md"
    )


def test_composition_without_hydras_fixed_costs_gives_what_hydra_gives():
    """latentstruct.compose_cache (installed on import) keeps each config file's load and shares the ConfigStore:
    the configurations it composes, the ``hydra`` node included, are Hydra's own, each composed after others that
    load the same files (so a load that one composition changed would show in the next)."""
    from omegaconf import OmegaConf

    from latentstruct import compose_cache

    cases = [[f"+experiment={names[0]}"] for names in config.experiments().values()]
    cases += [["+sweep=spigot_sst"], ["estimator=sfe", "trainer.seed=3"], []]
    ours = [OmegaConf.to_yaml(_compose(*c, hydra=True)) for c in cases]
    with compose_cache.uninstalled():
        hydras = [OmegaConf.to_yaml(_compose(*c, hydra=True)) for c in cases]
    assert ours == hydras


def test_an_edited_config_file_is_read_again(tmp_path):
    """A config file kept by compose_cache is read again once it changes (its size, time or inode)."""
    (tmp_path / "model").mkdir()
    (tmp_path / "train.yaml").write_text("defaults:\n  - model: small\n  - _self_\n")
    (tmp_path / "model" / "small.yaml").write_text("width: 8\n")

    def width() -> int:
        with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
            return compose("train").model.width

    assert width() == 8
    assert width() == 8  # kept
    (tmp_path / "model" / "small.yaml").write_text("width: 16\n")
    assert width() == 16


def test_an_interpolated_default_is_still_resolved(tmp_path):
    """compose_cache builds Hydra's map of choices only for a defaults list with an interpolated default; where there
    is one, it resolves as Hydra resolves it (the choice overridden on the command line included)."""
    from latentstruct import compose_cache

    for group, options in {"data": ["a", "b"], "model": ["for_a", "for_b"]}.items():
        (tmp_path / group).mkdir()
        for option in options:
            (tmp_path / group / f"{option}.yaml").write_text(f"name: {option}\n")
    (tmp_path / "train.yaml").write_text("defaults:\n  - data: a\n  - model: for_${data}\n  - _self_\n")

    def models() -> list[str]:
        with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
            return [compose("train", overrides=o).model.name for o in ([], ["data=b"])]

    assert models() == ["for_a", "for_b"]
    with compose_cache.uninstalled():
        assert models() == ["for_a", "for_b"]


def test_a_sweep_configs_own_experiments_are_composed_with_the_command_line():
    """``+sweep=listops_chart`` names its experiments in its sweeper params, not on the command line: a setting of a
    part that those experiments choose (the chart's composer) is theirs, not a part without an option; and a value
    out of range under them is refused as the command line's own sweeps are. (Before: "task.composer holds settings
    (checkpoint) but no option" refused the ListOps table's reduced run, which Hydra runs. Its ``++``: Hydra applies
    a multirun's plain overrides to its base configuration too, where no experiment chose the composer.)"""
    ok = ["-m", "+sweep=listops_chart", "trainer.seed=301", "+preset=listops_cpu", "++task.composer.checkpoint=false"]
    assert config.check_command_line(ok) == ok
    with pytest.raises(config.ConfigError, match=r"out of range"):
        config.check_command_line(["-m", "+sweep=listops_chart", "optim.lr=-1e-3"])
