"""The multi-label energy task of seed 004 (latentstruct/tasks/energy.py): the φ-gradient of the implicit and the
explicit methods, which parameters each step moves, pretraining, resumption through train.py, the threshold chosen
on valid, SPEN's and InfNet's inference, every experiment on tiny generated ARFF files, and a real-bibtex smoke run."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra.errors import ConfigCompositionException, InstantiationException
from hydra.utils import instantiate

import latentstruct.train as train_module
from latentstruct.config import help_texts, parts, settings
from latentstruct.data.conll import conll_dataset
from latentstruct.data.mlc import MULAN_DATASETS, f1_at_threshold, mlc_dataset
from latentstruct.data.twpos import twpos_dataset
from latentstruct.models.energy import (
    BiLSTMFeatures,
    MLCEnergy,
    MLCInferenceNet,
    bernoulli_samples,
    cd_loss,
    dvn_loss,
    multilabel_nll,
    soft_f1_loss,
    ssvm_loss,
)
from latentstruct.models.implicit import grad_or_zeros, implicit_gradient
from latentstruct.records import reads_the_machine
from latentstruct.tasks.energy import MultiLabelEnergy
from latentstruct.tasks.energy_ner import SequenceLabelEnergy
from latentstruct.train import build_model, train
from tests.helpers import compose as _compose
from tests.helpers import methods, one_epoch_per_phase

EXPERIMENTS = methods("mlc")
TINY_TASK = ["+tuned.toy={feature_hidden:[16],global_hidden:4}"]  # the sizes of dataset.name=toy


# ------------------------------------------------------------------------------------------------ helpers


def write_mlc(root: Path, name: str = "toy", n_train: int = 40, n_test: int = 20, num_features: int = 12,
              num_labels: int = 6, seed: int = 0) -> Path:
    """Tiny Mulan files for dataset ``name`` under ``root/name/`` (the first file pair mlc_dataset looks for, sparse
    ARFF, plus ``<name>.xml``); the known Mulan datasets get their real feature and label counts. Only the first 12
    features are ever on; the labels are a noisy function of them and every example has one. Returns ``root``."""
    spec = MULAN_DATASETS.get(name)
    stems = spec.files[0] if spec else (f"{name}-train", f"{name}-test")
    if spec:
        num_features, num_labels = spec.num_features, spec.num_labels
    rng = np.random.RandomState(seed)
    n, active = n_train + n_test, min(num_features, 12)
    x = (rng.rand(n, active) < 0.4).astype(int)
    scores = x @ rng.randn(active, num_labels) + 0.5 * rng.randn(n, num_labels)
    y = scores > np.quantile(scores, 0.8)
    y[np.arange(n), scores.argmax(1)] = True
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    header = [f"@relation {name}"] + [f"@attribute f{i} {{0,1}}" for i in range(num_features)]
    header += [f"@attribute label{j} {{0,1}}" for j in range(num_labels)] + ["@data"]
    rows = ["{" + ",".join([f"{i} 1" for i in np.flatnonzero(x[r])]
                           + [f"{num_features + j} 1" for j in np.flatnonzero(y[r])]) + "}" for r in range(n)]
    for stem, part in zip(stems, (rows[:n_train], rows[n_train:]), strict=True):
        (folder / f"{stem}.arff").write_text("\n".join(header + part) + "\n")
    labels = "".join(f'<label name="label{j}"></label>' for j in range(num_labels))
    (folder / f"{name}.xml").write_text(f'<labels xmlns="http://mulan.sourceforge.net/labels">{labels}</labels>\n')
    return root


def _batch(n: int = 10, features: int = 6, labels: int = 5, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, features, generator=g, dtype=torch.float64)
    y = (torch.rand(n, labels, generator=g, dtype=torch.float64) < 0.4).double()
    y[:, 0] = 1.0
    return {"x": x, "y": y}


def _task(method: str, seed: int = 0, pretrain: bool = False, **settings) -> MultiLabelEnergy:
    """The task as its config builds it: the networks ``method`` trains (E, A, F), from partials, sized by ``dims``."""
    torch.manual_seed(seed)
    energy = None if method == "mbce" else partial(MLCEnergy, feature_hidden=(8,), global_hidden=3)
    infnet = None if method == "spen" else partial(MLCInferenceNet, hidden=(8,))
    cost_net = partial(MLCInferenceNet, hidden=(8,)) if method == "infnet" else None
    task = MultiLabelEnergy.build({"input_dim": 6, "num_labels": 5}, {}, energy, infnet, cost_net, method=method,
                                  phases=2 if pretrain else 0, **settings)
    return task.double()


def _snapshot(params) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


def _all_changed(before, params) -> bool:
    return all(not torch.equal(a, p) for a, p in zip(before, params, strict=True))


def _unchanged(before, params) -> bool:
    return all(torch.equal(a, p) for a, p in zip(before, params, strict=True))


# ---------------------------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("primary", ["ssvm", "dvn", "cd"])
def test_the_phi_gradient_is_the_implicit_gradient_or_the_explicit_one(primary):
    batch, x, y = _batch(), *_batch().values()
    settings = dict(primary=primary, inner_steps=2, neumann_terms=4, neumann_alpha=0.1, lam=0.7, num_samples=3,
                    inverse_solver="neumann")
    grads = {}
    for method in ("implicit", "explicit"):
        task = _task(method, **settings)
        torch.manual_seed(5)  # the inner steps draw nothing: the CD samples are the first draws after this
        out = task(batch)
        out.loss.backward()
        phi, theta = task.energy_parameters(), task.inference_parameters()
        grads[method] = [p.grad.clone() for p in phi]
        # independently, from the losses of models/energy.py at the θ the inner steps left
        energy, logits = task.energy_net, task.infnet.logits(x)
        a = torch.sigmoid(logits)
        aux = (multilabel_nll(logits, y) + 0.7 * energy(x, a)).mean()
        if primary == "ssvm":
            prim = ssvm_loss(energy(x, a), energy(x, y), soft_f1_loss(a, y))
        elif primary == "dvn":
            prim = dvn_loss(energy(x, a), 1 - soft_f1_loss(a, y))
        else:
            torch.manual_seed(5)
            samples = bernoulli_samples(a, 3, straight_through=True)
            prim = cd_loss(energy(x, y), energy(x, samples), soft_f1_loss(samples, y))
        if method == "implicit":
            want = implicit_gradient(prim, aux, theta, phi, terms=4, alpha=0.1)
        else:
            want = grad_or_zeros(prim, phi)
        assert out.loss.item() == pytest.approx(prim.item(), rel=1e-12)
        assert out.primary.item() == pytest.approx(prim.item(), rel=1e-12)
        for got, ref in zip(grads[method], want, strict=True):
            torch.testing.assert_close(got, ref)
        assert all(p.grad is None for p in theta)  # the returned loss reaches φ only
    # L_prim depends on θ, so the implicit term is there
    diff = max(float((a - b).abs().max()) for a, b in zip(grads["implicit"], grads["explicit"], strict=True))
    scale = max(float(g.abs().max()) for g in grads["explicit"])
    assert diff > 1e-4 * scale


def test_without_straight_through_cd_has_no_implicit_term():
    grads = []
    for method in ("implicit", "explicit"):
        task = _task(method, primary="cd", straight_through=False, neumann_alpha=0.1)
        torch.manual_seed(5)
        task(_batch()).loss.backward()
        grads.append([p.grad for p in task.energy_parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


# ------------------------------------------------------------------------------------- who moves what


@pytest.mark.parametrize("method", ["implicit", "explicit", "infnet", "spen", "mbce"])
def test_the_task_moves_theta_and_train_py_moves_phi(method):
    task = _task(method, primary="ssvm", inner_steps=2)
    theta, phi = task.inference_parameters(), task.energy_parameters()
    default = task.param_groups()["default"]
    optimizer = torch.optim.Adam(default, lr=1e-2)
    if method == "mbce":  # A alone, trained by train.py's optimizer
        assert task.energy_net is None and [id(p) for p in default] == [id(p) for p in theta]
        trained, other = theta, []
    else:
        assert [id(p) for p in default] == [id(p) for p in phi]
        trained, other = phi, theta
    if method == "spen":
        assert theta == []
    theta0, phi0 = _snapshot(theta), _snapshot(phi)
    out = task(_batch())
    if method in ("implicit", "explicit", "infnet"):  # the inner / ascent steps: θ only
        assert _all_changed(theta0, theta) and _unchanged(phi0, phi)
    else:
        assert _unchanged(theta0, theta) and _unchanged(phi0, phi)
    assert all(p.grad is None for p in task.parameters())
    before, other_before = _snapshot(trained), _snapshot(other)
    optimizer.zero_grad()
    out.loss.backward()
    assert all(p.grad is None for p in other)
    optimizer.step()
    assert _all_changed(before, trained) and _unchanged(other_before, other)


def test_pretraining_phase_trains_the_local_energy_and_the_inference_network():
    task = _task("implicit", pretrain=True)
    energy = task.energy_net
    local, global_ = energy.feature_parameters(), [*energy.label_proj.parameters(), *energy.label_weight.parameters()]
    task.begin_step(0, 0)
    theta0, phi0 = _snapshot(task.inference_parameters()), _snapshot(task.energy_parameters())
    batch = _batch()
    out = task(batch)
    assert _all_changed(theta0, task.inference_parameters()) and _unchanged(phi0, task.energy_parameters())
    torch.testing.assert_close(out.loss, multilabel_nll(energy.local_logits(batch["x"]), batch["y"]).mean())
    out.loss.backward()
    assert all(p.grad is not None for p in local) and all(p.grad is None for p in global_)
    task.zero_grad()
    task.begin_step(1, 0)  # the method: the inner step draws on L_aux, whose φ-gradient is not taken
    out = task(batch)
    assert out.aux is not None
    out.loss.backward()
    assert all(p.grad is not None for p in global_)
    # without phases, phase 0 is the method
    plain = _task("implicit")
    plain.begin_step(0, 0)
    assert plain(batch).aux is not None


def test_the_inference_optimizer_state_is_part_of_the_state_dict():
    task = _task("implicit", primary="dvn", inner_steps=3)
    task(_batch())
    state = task.state_dict()
    moments = task._inner_opt.state_dict()["state"]
    assert moments and all(s["step"] == 3 for s in moments.values())
    other = _task("implicit", seed=1, primary="dvn", inner_steps=3)
    other.load_state_dict(state)
    for a, b in zip(moments.values(), other._inner_opt.state_dict()["state"].values(), strict=True):
        torch.testing.assert_close(a["exp_avg_sq"], b["exp_avg_sq"])
    # the loaded optimizer still steps the loading task's own parameters
    assert all(a is b for a, b in zip(other._inner_opt.param_groups[0]["params"], other.inference_parameters(),
                                      strict=True))


# -------------------------------------------------------------------------------------------- inference


def test_spen_inference_lowers_the_energy_inside_the_box():
    task = _task("spen", spen_steps=10, spen_lr=0.05)
    with torch.no_grad():  # as in evaluation: the steps switch gradients on for y only
        task.energy_net.local.weight.mul_(20)
        task.energy_net.label_weight.weight.fill_(2.0)
    batch = _batch(n=16)
    y0, y_pred, y_aug = task.spen_start(batch), task.spen_inference(batch), task.spen_inference(batch, augmented=True)
    assert ((y_pred >= 0) & (y_pred <= 1)).all() and not torch.equal(y_pred, y0)
    e0, e_pred = task.energy(batch, y0), task.energy(batch, y_pred)
    assert (e_pred <= e0 + 1e-12).all() and (e0 - e_pred).mean().item() > 1e-3
    aug0 = e0 - task.cost(y0, batch)
    assert (task.energy(batch, y_aug) - task.cost(y_aug, batch) < aug0).all()
    assert all(p.grad is None for p in task.parameters())
    with torch.no_grad():
        torch.testing.assert_close(task.predict(batch), y_pred)


def test_the_infnet_ascent_step_raises_its_objective_and_the_descent_lowers_it():
    task = _task("infnet", inner_optimizer="sgd", inner_lr=1e-3, lam=0.5)
    batch = _batch(n=16)
    before = task.inference_objective(batch).item()
    task.infnet_ascent_step(batch)
    after = task.inference_objective(batch).item()
    assert after > before
    optimizer = torch.optim.SGD(task.param_groups()["default"], lr=1e-3)
    out = task(batch)  # another ascent step, then the objective at the new F(x), A(x) for φ
    assert out.loss.item() > after
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    assert task.inference_objective(batch).item() < out.loss.item()


# ------------------------------------------------------------------------------------------- evaluation


def test_the_threshold_is_chosen_on_valid_and_applied_to_test(monkeypatch):
    # label 0 always on and sure; label 1 on for half the examples. On valid the positives score 0.4, the negatives
    # 0.2 (best thresholds 0.25 .. 0.4); on test 0.8 and 0.6 (best 0.65 .. 0.8).
    def split(pos, neg):
        y = torch.tensor([[1.0, 1.0], [1.0, 0.0]]).repeat(10, 1)
        probs = torch.stack([torch.full((20,), 0.9), torch.where(y[:, 1] > 0, pos, neg)], 1)
        return {"x": probs, "y": y}

    valid, test = split(0.4, 0.2), split(0.8, 0.6)
    task = _task("mbce").float()
    monkeypatch.setattr(task, "predict", lambda batch: batch["x"])
    metrics = task.evaluate_splits({"valid": valid, "test": test}, batch_size=7)
    assert metrics["valid"]["threshold"] == metrics["test"]["threshold"] == 0.25
    assert metrics["valid"]["acc"] == pytest.approx(100.0)
    assert metrics["test"]["acc"] == pytest.approx(100 * f1_at_threshold(test["x"], test["y"], 0.25))
    assert metrics["test"]["acc"] < 100 * f1_at_threshold(test["x"], test["y"], 0.7) - 10  # test's own best
    assert metrics["test"]["f1_05"] == pytest.approx(100 * f1_at_threshold(test["x"], test["y"], 0.5))
    assert metrics["test"]["f1"] == metrics["test"]["acc"]
    mbce = torch.nn.functional.binary_cross_entropy(test["x"], test["y"], reduction="none").sum(-1).mean()
    assert metrics["test"]["infer_seconds"] >= 0 and metrics["test"]["loss"] == pytest.approx(mbce.item())
    # evaluate alone picks the threshold on the split it is given
    assert task.evaluate(test)["threshold"] == 0.65


# ---------------------------------------------------------------------------------------- through train.py


def _toy_cfg(data_dir, out, experiment="cd", *overrides):
    return _compose(f"+experiment=mlc_{experiment}", f"paths.data_dir={data_dir}", f"paths.output_dir={out}",
                    "dataset.name=toy", "dataset.sizes=[30,15,15]", "trainer.batch_size=8", "trainer.progress=false",
                    *TINY_TASK, *overrides)


def check_resume_in_the_method_phase(cfg_for, tmp_path, monkeypatch, steps: int) -> None:
    """A run killed while recording its third evaluation (after the pretraining epoch and one epoch of the method),
    then resumed, ends with the metrics and history of an uninterrupted run (timings aside). ``cfg_for(out, *extra)``
    builds the run's config (two phases: 1 + 3 epochs) writing to ``out``; ``steps``: the run's total."""
    full = train(cfg_for(tmp_path / "full"))
    real, calls = train_module.write_history, {"n": 0}

    def crash_on_third_evaluation(path, history):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")
        real(path, history)

    monkeypatch.setattr(train_module, "write_history", crash_on_third_evaluation)
    with pytest.raises(KeyboardInterrupt):
        train(cfg_for(tmp_path / "crashed"))
    monkeypatch.setattr(train_module, "write_history", real)
    resumed = train(cfg_for(tmp_path / "crashed", "trainer.resume=true"))

    def timeless(metrics):
        return {k: v for k, v in metrics.items() if not k.endswith("infer_seconds")}

    assert timeless(resumed["metrics"]) == timeless(full["metrics"]) and resumed["steps"] == full["steps"] == steps
    a, b = (pd.read_csv(tmp_path / n / "history.csv") for n in ("full", "crashed"))
    a, b = (h.drop(columns=[c for c in h.columns if reads_the_machine(c)]) for h in (a, b))
    assert len(a) == 4
    pd.testing.assert_frame_equal(a, b)


def test_resume_in_the_method_phase_matches_an_uninterrupted_run(tmp_path, monkeypatch):
    data_dir = write_mlc(tmp_path / "data")
    phases = ["trainer.phases.0.epochs=1", "trainer.phases.1.epochs=3", "task.inner_steps=2", "task.neumann_terms=2"]
    check_resume_in_the_method_phase(lambda out, *extra: _toy_cfg(data_dir, out, "cd", *phases, *extra), tmp_path,
                                     monkeypatch, steps=16)


def test_every_experiment_runs_a_few_steps_on_generated_arff(tmp_path):
    data_dir = write_mlc(tmp_path / "data")
    metrics = {f"{s}/{m}" for s in ("valid", "test")
               for m in ("acc", "f1", "f1_05", "threshold", "loss", "infer_seconds")}
    for experiment in EXPERIMENTS:
        cfg = _toy_cfg(data_dir, tmp_path / experiment, experiment, "trainer.batch_size=16", "task.neumann_terms=2",
                       "task.spen_steps=3")
        one_epoch_per_phase(cfg)
        record = train(cfg)
        assert record["status"] == "completed" and record["steps"] == 2 * (1 + bool(cfg.trainer.phases))
        assert set(record["metrics"]) == metrics
        assert record["metrics"]["test/threshold"] == record["metrics"]["valid/threshold"]
        history = pd.read_csv(tmp_path / experiment / "history.csv")
        if cfg.trainer.phases:  # the pretraining epoch is never the one reported
            assert history["valid/acc"].tolist()[0] == history["valid/f1"].tolist()[0] >= 0
            assert record["best_step"] > history["step"].tolist()[0]
            assert record["best_step"] == 4
        assert (history["valid/acc"].tail(1) == history["valid/f1"].tail(1)).all()
    # the per-dataset sizes of the experiments: the energy's F, A and F shaped alike
    for dataset, (hidden, global_hidden) in (("bibtex", ([150, 150], 16)), ("delicious", ([250, 250], 10))):
        cfg = _compose("+experiment=mlc_infnet", f"dataset={dataset}")
        assert (list(cfg.task.energy.feature_hidden), cfg.task.energy.global_hidden) == (hidden, global_hidden)
        assert list(cfg.task.infnet.hidden) == list(cfg.task.cost_net.hidden) == hidden and cfg.dataset.name == dataset
    sweep = _compose("+sweep=energy_mlc", hydra=True)
    assert sorted(sweep.hydra.sweeper.params["+experiment"].split(",")) == [f"mlc_{e}" for e in EXPERIMENTS]
    assert sweep.hydra.sweeper.params["trainer.seed"] == "301,302,303"


# ------------------------------------------------------------------------------------- the parts in the config

TOY_DIMS = {"input_dim": 6, "num_labels": 5}


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_the_config_shows_the_networks_its_method_builds(experiment):
    cfg = _compose(f"+experiment=mlc_{experiment}")
    targets = {"energy": MLCEnergy, "infnet": MLCInferenceNet, "cost_net": MLCInferenceNet}
    needs = dict(zip(targets, MultiLabelEnergy.NETWORKS[cfg.task.method], strict=True))
    for group, cls in targets.items():  # set exactly when the method trains that network, with its target
        assert (cfg.task[group] is not None) == needs[group]
        assert cfg.task[group] is None or cfg.task[group]._target_ == f"{cls.__module__}.{cls.__name__}"
    assert not {"encoder", "scorer", "structure", "estimator", "decoder"} & {*cfg, *cfg.task}  # parts it does not take
    task = build_model(cfg, TOY_DIMS, {})  # no data needed: the sizes come from dims
    built = {"energy": task.energy_net, "infnet": task.infnet, "cost_net": task.cost_net}
    for group, cls in targets.items():
        assert isinstance(built[group], cls) if needs[group] else built[group] is None


@pytest.mark.parametrize("overrides,error", [
    (["+experiment=mlc_mbce", "energy=mlc_energy"], "method=mbce builds no energy"),
    (["+experiment=mlc_spen", "infnet=mlc_inference_net"], "method=spen builds no infnet"),
    (["+experiment=mlc_cd", "cost_net=mlc_inference_net"], "method=implicit builds no cost_net"),
    (["+experiment=mlc_cd", "task.method=infnet"], "method=infnet needs the network cost_net"),
    (["+experiment=mlc_cd", "+encoder=bilstm_features"], "Key 'encoder' not in 'MultiLabelEnergyConf'"),
    (["+experiment=mlc_cd", "+estimator=spigot"], "Key 'estimator' not in 'MultiLabelEnergyConf'"),
    (["+experiment=mlc_cd", "latent=gold"], "no latent source"),
    (["+experiment=mlc_cd", "task.phases=3"], "no trainer.phases, or two"),
    (["+energy=mlc_energy"], "Key 'energy' not in 'LatentClassifierConf'"),  # an energy part on another task
])
def test_a_part_the_task_does_not_build_is_refused(overrides, error):
    """A part the task does not take is refused when composed (not a field of the task's schema); the others when
    the task is built."""
    with pytest.raises((ValueError, ConfigCompositionException), match=error):
        build_model(_compose(*overrides), TOY_DIMS, {})


def test_the_task_option_counts_the_trainer_phases():
    assert _compose("+experiment=mlc_cd").task.phases == 2  # resolved from trainer.phases
    assert _compose("+experiment=mlc_mbce").task.phases == 0
    assert _compose("+experiment=mlc_cd", "trainer.phases=[]").task.phases == 0
    assert build_model(_compose("+experiment=mlc_cd"), TOY_DIMS, {}).pretrain
    assert not build_model(_compose("+experiment=mlc_cd", "trainer.phases=[]"), TOY_DIMS, {}).pretrain


def test_the_energy_tasks_share_their_training_settings_and_document_every_setting():
    mlc, seq = settings(MultiLabelEnergy), settings(SequenceLabelEnergy)
    assert set(seq) - set(mlc) == {"encoder", "normalize_cost"} and set(mlc) <= set(seq)  # + its features' part
    assert {k: seq[k].default for k in mlc} == {k: p.default for k, p in mlc.items()}  # one default each
    targets = [MultiLabelEnergy, SequenceLabelEnergy, MLCEnergy, MLCInferenceNet, BiLSTMFeatures, mlc_dataset,
               conll_dataset, twpos_dataset]
    for target in targets:
        texts = help_texts(target)
        assert all(texts.get(name) for name in settings(target) if name not in parts(target)), target  # a part:
        # the schema's own help (its kinds, its group)


def test_the_dataset_configs_read_their_files(tmp_path):
    for name in ("bibtex", "delicious", "eurlex", "bookmarks"):
        write_mlc(tmp_path, name, n_train=8, n_test=4)
        data = instantiate(_compose(f"dataset={name}", f"paths.data_dir={tmp_path}", "dataset.sizes=[6,3,3]").dataset)
        spec = MULAN_DATASETS[name]
        assert data.dims == {"input_dim": spec.num_features, "num_labels": spec.num_labels}
        assert [data.size(s) for s in ("train", "valid", "test")] == [6, 3, 3]
    with pytest.raises(InstantiationException, match="no published split sizes"):
        instantiate(_compose("dataset=bookmarks", f"paths.data_dir={tmp_path}").dataset)
    with pytest.raises(InstantiationException, match="eurlex-ev-fold1-train.arff"):
        instantiate(_compose("dataset=eurlex", f"paths.data_dir={tmp_path / 'nowhere'}").dataset)


@pytest.mark.real_data("bibtex")
def test_real_bibtex_smoke_run(tmp_path, data_root):
    record = train(_compose("+experiment=mlc_cd", f"paths.data_dir={data_root}", f"paths.output_dir={tmp_path}",
                            "trainer.progress=false", "trainer.threads=1", "trainer.phases.0.epochs=2",
                            "trainer.max_steps=286",
                            "task.neumann_terms=2"))
    assert record["steps"] == 286  # 2 pretraining epochs of 138 batches, then 10 steps of the method
    history = pd.read_csv(tmp_path / "history.csv")
    assert list(history["step"]) == [138, 276, 286]
    # MBCE-pretrained A: far above predicting every label (F1 ≈ 3), far below the paper's 46
    assert 10 < record["metrics"]["test/acc"] < 46


@pytest.mark.parametrize("solver", ["minres", "cg"])
def test_the_inverse_solver_setting_reaches_the_solver_and_solves_the_damped_system(solver):
    """The small MLC networks' H is indefinite and singular (dead ReLUs, 10 examples): H⁻¹ does not exist, so the
    solvers are checked on the damped system (H + μI) w = v, μ above |λ_min|, against a dense solve."""
    from latentstruct.models.implicit import hvp

    mu = 3.0

    def dense_damped(g, theta, v):
        n = sum(p.numel() for p in theta)
        sizes = [p.numel() for p in theta]
        columns = []
        for j in range(n):
            e = torch.zeros(n, dtype=torch.float64)
            e[j] = 1.0
            columns.append(torch.cat([h.reshape(-1) for h in hvp(g, theta, [c.view_as(p) for c, p in zip(
                e.split(sizes), theta, strict=True)])]))
        h = torch.stack(columns, 1) + mu * torch.eye(n, dtype=torch.float64)
        x = torch.linalg.solve(h, torch.cat([t.reshape(-1) for t in v]))
        return [c.view_as(p) for c, p in zip(x.split(sizes), theta, strict=True)]

    batch = _batch()
    settings = dict(primary="dvn", inner_steps=2, neumann_terms=4, neumann_alpha=0.1, lam=0.7)
    grads = {}
    for name in (solver, "dense"):
        task = _task("implicit", inverse_solver=solver, solver_tol=1e-12, solver_max_iter=500, solver_damping=mu,
                     **settings)
        if name == "dense":
            task.inverse_hvp = lambda history=None: dense_damped
        task(batch).loss.backward()
        grads[name] = torch.cat([p.grad.reshape(-1) for p in task.energy_parameters()])
    explicit = _task("explicit", **settings)
    explicit(batch).loss.backward()
    plain = torch.cat([p.grad.reshape(-1) for p in explicit.energy_parameters()])
    assert (grads["dense"] - plain).norm() > 1e-3 * plain.norm()  # the implicit term is there
    torch.testing.assert_close(grads[solver], grads["dense"], rtol=1e-8, atol=1e-10)
    # undamped, the same settings give another gradient (the setting reaches the solver)
    task = _task("implicit", inverse_solver=solver, solver_tol=1e-12, solver_max_iter=500, **settings)
    task(batch).loss.backward()
    assert not torch.allclose(torch.cat([p.grad.reshape(-1) for p in task.energy_parameters()]), grads["dense"])
    with pytest.raises(ValueError, match="inverse_solver"):
        _task("implicit", inverse_solver="lu", **settings)


@pytest.mark.parametrize("solver", ["neumann", "minres"])
def test_the_hvp_setting_reaches_the_products_and_leaves_the_gradient(solver, monkeypatch):
    """task.hvp=forward_over_reverse makes every product (the solver's and the mixed one) by forward-over-reverse,
    and gives the double backward's φ-gradient to round-off; the implicit term's seconds are counted."""
    from latentstruct.models.implicit import HVPS, ForwardOverReverse

    calls = []
    original = ForwardOverReverse._products
    monkeypatch.setattr(ForwardOverReverse, "_products",
                        lambda self, v, wrt_outer: calls.append(wrt_outer) or original(self, v, wrt_outer))
    batch = _batch()
    settings = dict(primary="dvn", inner_steps=2, neumann_terms=4, neumann_alpha=0.1, lam=0.7, inverse_solver=solver,
                    solver_tol=1e-3, solver_max_iter=8)
    grads, used = {}, {}
    for hvp in HVPS:
        task = _task("implicit", hvp=hvp, **settings)
        assert task.timings() == {"implicit": 0.0}
        calls.clear()
        task(batch).loss.backward()
        used[hvp] = list(calls)
        grads[hvp] = torch.cat([p.grad.reshape(-1) for p in task.energy_parameters()])
        assert task.timings()["implicit"] > 0
    assert used["double_backward"] == []
    assert used["forward_over_reverse"].count(True) == 1 and used["forward_over_reverse"].count(False) >= 1
    if solver == "neumann":
        assert used["forward_over_reverse"].count(False) == 4
    torch.testing.assert_close(grads["forward_over_reverse"], grads["double_backward"], rtol=1e-9, atol=1e-12)
    explicit = _task("explicit", **{k: v for k, v in settings.items() if not k.startswith(("solver", "inverse"))})
    explicit(batch).loss.backward()
    plain = torch.cat([p.grad.reshape(-1) for p in explicit.energy_parameters()])
    assert (grads["double_backward"] - plain).norm() > 1e-3 * plain.norm()  # the implicit term is there
    assert explicit.timings() == {}
    with pytest.raises(ValueError, match="hvp"):
        _task("implicit", hvp="finite_difference", **settings)


def test_the_record_and_the_history_carry_the_implicit_share_and_the_products(tmp_path):
    data_dir = write_mlc(tmp_path / "data")
    cfg = _toy_cfg(data_dir, tmp_path / "run", "cd", "trainer.batch_size=16", "task.neumann_terms=2")
    cfg.trainer.phases[0].epochs = cfg.trainer.phases[1].epochs = 1
    record = train(cfg)
    history = pd.read_csv(tmp_path / "run" / "history.csv")
    assert history["time/implicit_share"].tolist()[0] == 0  # pretraining: no implicit term
    assert 0 < history["time/implicit_share"].tolist()[-1] < 1
    assert 0 < record["implicit_share"] < 1
    # the solver's products per step: MINRES (the default) stops by its rule, at least one and at most its cap
    assert history["count/hvp_per_step"].tolist()[0] == 0
    assert 1 <= history["count/hvp_per_step"].tolist()[-1] <= cfg.task.solver_max_iter
    assert record["hvp_per_step"] == history["count/hvp_per_step"].tolist()[-1]  # one window: the method phase
    series = _toy_cfg(data_dir, tmp_path / "series", "cd", "trainer.batch_size=16", "task.neumann_terms=2",
                      "task.inverse_solver=neumann")
    series.trainer.phases[0].epochs = series.trainer.phases[1].epochs = 1
    assert train(series)["hvp_per_step"] == 2  # the series: its terms, every step
    cfg = _toy_cfg(data_dir, tmp_path / "spen", "spen", "trainer.batch_size=16", "task.spen_steps=2")
    cfg.trainer.phases[0].epochs = cfg.trainer.phases[1].epochs = 1
    assert "implicit_share" not in (spen := train(cfg)) and "hvp_per_step" not in spen
