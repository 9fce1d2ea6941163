"""The semi-supervised VAE task of seed 003 end to end: trainer.phases (labelled, then unlabelled), the ε / τ
schedules, the direct update's sign on labelled data and its value on unlabelled data (the Direct estimator fed θ),
the model parts as config groups, resumption inside the phases, and a real-MNIST smoke run."""

from __future__ import annotations

import functools

import pandas as pd
import pytest
import torch
from hydra.errors import ConfigCompositionException

import latentstruct.train as train_module
from latentstruct.config import ConfigError, validate
from latentstruct.data.semisupervised import semisupervised_dataset
from latentstruct.estimators import Direct, GumbelSoftmax
from latentstruct.models.vae import GMVAE, Decoder, DiscreteHead, Encoder, kl_uniform
from latentstruct.records import MACHINE_COLUMNS
from latentstruct.structures import gumbel_like
from latentstruct.tasks.vae import SemiSupervisedVAE
from latentstruct.train import build_model, train
from tests.data.test_images import write_mnist
from tests.helpers import compose, methods

SMALL = ["task.gaussian_dim=4", "task.encoder.hidden=[32,16]", "task.scorer.hidden=8", "task.decoder.hidden=32"]


def _task(estimator, **settings) -> SemiSupervisedVAE:
    """A small GM-VAE on 784 pixels and 10 components (the sizes of SMALL) trained through ``estimator``."""
    vae = GMVAE(functools.partial(Encoder, hidden=(32, 16)), functools.partial(DiscreteHead, hidden=8),
                functools.partial(Decoder, hidden=32), input_dim=784, num_components=10, gaussian_dim=4)
    return SemiSupervisedVAE(vae, estimator, **settings)


@pytest.fixture
def data_dir(tmp_path):
    for name in ("mnist", "fashion_mnist"):
        write_mnist(tmp_path / "data" / name, n_train=200, n_test=40, seed=len(name))
    return tmp_path / "data"


def _cfg(data_dir, out, *overrides, method="direct", small=True):
    return compose(
        f"+experiment=vae_{method}", f"paths.data_dir={data_dir}", f"paths.output_dir={out}",
        "dataset.n_valid=50", "dataset.n_labelled=20", "trainer.batch_size=16", "trainer.progress=false",
        "trainer.phases.0.epochs=3", "trainer.phases.1.epochs=2", "trainer.eval_every=null",
        *(SMALL if small else []), *overrides)


@pytest.mark.parametrize("method", ["direct", "gsm"])
def test_phases_train_on_the_labelled_images_then_on_all_images_without_labels(data_dir, tmp_path, monkeypatch,
                                                                                method):
    seen = []
    real_forward = SemiSupervisedVAE.forward

    def spy(self, batch):
        if self.training:
            seen.append((self._phase_step, len(batch["x"]), "y" in batch))
        return real_forward(self, batch)

    monkeypatch.setattr(SemiSupervisedVAE, "forward", spy)
    record = train(_cfg(data_dir, tmp_path / "run", method=method))
    # labelled: 20 images in batches of 16 = 2 steps per epoch × 3 epochs; then 150 images = 10 steps × 2 epochs
    assert seen[:6] == [(0, 16, True), (1, 4, True), (2, 16, True), (3, 4, True), (4, 16, True), (5, 4, True)]
    assert [s for s, _, _ in seen[6:]] == list(range(20)) and not any(y for _, _, y in seen[6:])
    assert record["steps"] == 26 and record["status"] == "completed"
    history = pd.read_csv(tmp_path / "run" / "history.csv")
    assert list(history["step"]) == [2, 4, 6, 16, 26]  # one evaluation per epoch of either phase
    assert list(history["epoch"]) == [1, 2, 3, 4, 5]
    assert set(record["metrics"]) == {f"{s}/{m}" for s in ("valid", "test") for m in ("acc", "bound", "rec", "kl")}
    m = record["metrics"]
    assert m["test/bound"] == pytest.approx(m["test/rec"] + m["test/kl"])
    assert 0 <= m["test/acc"] <= 100 and m["test/kl"] > 0


def test_resume_inside_the_second_phase_matches_an_uninterrupted_run(data_dir, tmp_path, monkeypatch):
    full = train(_cfg(data_dir, tmp_path / "full"))
    real, calls = train_module.write_history, {"n": 0}

    def crash_on_fourth_evaluation(path, history):  # the 4th evaluation is in the unlabelled phase
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt("killed")
        real(path, history)

    monkeypatch.setattr(train_module, "write_history", crash_on_fourth_evaluation)
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(data_dir, tmp_path / "crashed"))
    monkeypatch.setattr(train_module, "write_history", real)
    resumed = train(_cfg(data_dir, tmp_path / "crashed", "trainer.resume=true"))
    assert resumed["metrics"] == full["metrics"]
    a, b = (pd.read_csv(tmp_path / n / "history.csv").drop(columns=list(MACHINE_COLUMNS)) for n in ("full", "crashed"))
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer.max_epochs=3"], "exclude each other"),
    (["trainer.phases.0.split=unlabelled"], "has train, labelled, valid, test"),
    (["dataset.n_labelled=0"], "'labelled', which is empty"),
])
def test_bad_phases_fail_with_a_clear_error(data_dir, tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        train(_cfg(data_dir, tmp_path / "run", *overrides))


def test_the_splits_cannot_leak_labels_and_fashion_mnist_reads_the_same_files(data_dir):
    for name in ("mnist", "fashion_mnist"):
        data = semisupervised_dataset(name, data_dir, n_labelled=20, label_seed=3, n_valid=50)
        assert set(data.splits["train"]) == {"x"} and data.size("train") == 150
        assert torch.bincount(data.splits["labelled"]["y"], minlength=10).tolist() == [2] * 10
        assert data.dims == {"input_dim": 784, "num_classes": 10}
        assert set(data.splits["train"]["x"].unique().tolist()) <= {0.0, 1.0}


def test_temperatures_follow_the_protocol():
    direct = _task(Direct(epsilon=-1.0), anneal_rate=1e-3, anneal_floor=0.1)
    gsm = _task(GumbelSoftmax(tau=2.0), anneal_rate=1e-3, anneal_floor=0.5)
    direct.begin_step(1, 1000)
    gsm.begin_step(1, 1000)
    assert direct.temperature(labelled=True) == 0.05 and gsm.temperature(labelled=True) == 2.0
    assert direct.temperature(labelled=False) == pytest.approx(torch.e ** -1)
    assert gsm.temperature(labelled=False) == pytest.approx(2 * torch.e ** -1)
    direct.begin_step(1, 10_000)
    gsm.begin_step(1, 10_000)
    assert (direct.temperature(False), gsm.temperature(False)) == (0.1, 0.5)  # the floors
    # the step sets the estimator's own temperature (direct: negative, towards best)
    x = (torch.rand(4, 784) > 0.5).float()
    direct({"x": x}), gsm({"x": x})
    assert (direct.estimator.epsilon, gsm.estimator.tau) == (-0.1, 0.5)
    direct({"x": x, "y": torch.tensor([0, 1, 2, 3])}), gsm({"x": x, "y": torch.tensor([0, 1, 2, 3])})
    assert (direct.estimator.epsilon, gsm.estimator.tau) == (-0.05, 2.0)
    assert direct.anneal_start == 1.0 and gsm.anneal_start == 2.0  # the configured values start the schedule
    with pytest.raises(ValueError, match="negative"):
        _task(Direct(epsilon=1.0))


def test_a_labelled_direct_step_raises_the_labels_logit_where_the_sample_missed_it(monkeypatch):
    torch.manual_seed(0)
    task = _task(Direct(epsilon=-1.0, max_retries=0))
    x, y = (torch.rand(64, 784) > 0.5).float(), torch.randint(0, 10, (64,))
    captured = {}
    real_encode = task.vae.encode

    def encode(inputs):
        phi, mu, logvar = real_encode(inputs)
        phi.retain_grad()
        captured["phi"] = phi
        return phi, mu, logvar

    monkeypatch.setattr(task.vae, "encode", encode)
    out = task({"x": x, "y": y})
    out.loss.backward()
    grad, missed = captured["phi"].grad, out.z.argmax(-1) != y
    assert missed.sum() > 10
    # (ẑ − onehot(y)) / (B ε) with ε = 0.05 dominates the small KL-to-uniform term
    assert (grad[missed, y[missed]] < -0.5 / (64 * 0.05)).all()
    assert (grad[~missed, y[~missed]].abs() < 0.1 / (64 * 0.05)).all()


@pytest.mark.parametrize("theta", ["likelihood", "elbo"])
def test_an_unlabelled_direct_step_is_the_direct_gradient_of_theta(monkeypatch, theta):
    """φ's gradient is (z_ε − ẑ)/(Bε) (ε = −0.3, towards best) plus that of KL(q ‖ uniform), with ẑ = onehot
    argmax(φ + γ) and z_ε = onehot argmax(φ + γ + 0.3 θ), θ(x, k) recomputed here from the step's own draws."""
    torch.manual_seed(0)
    task = _task(Direct(epsilon=-0.3, max_retries=0), theta=theta).double()
    x = (torch.rand(16, 784) > 0.5).double()
    captured = {}
    real_encode, real_sample = task.vae.encode, task.vae.sample_gaussians

    def encode(inputs):
        captured["phi"], mu, logvar = real_encode(inputs)
        captured["phi"].retain_grad()
        captured["kl"] = 0.5 * (mu.pow(2) + logvar.exp() - 1.0 - logvar).sum(-1).detach()
        return captured["phi"], mu, logvar

    def sample(mu, logvar):  # h, then a peek at the Gumbel draw Direct takes next (the generator is rewound)
        h = real_sample(mu, logvar)
        state = torch.get_rng_state()
        captured["h"], captured["gamma"] = h, gumbel_like(mu[:, :, 0].detach())
        torch.set_rng_state(state)
        return h

    monkeypatch.setattr(task.vae, "encode", encode)
    monkeypatch.setattr(task.vae, "sample_gaussians", sample)
    torch.manual_seed(1)
    task({"x": x}).loss.backward()
    phi, h, gamma = captured["phi"], captured["h"].detach(), captured["gamma"]
    with torch.no_grad():
        scores = task.vae.category_log_likelihood(x, h) - (captured["kl"] if theta == "elbo" else 0)
    z_hat = torch.nn.functional.one_hot((phi.detach() + gamma).argmax(-1), 10).double()
    z_eps = torch.nn.functional.one_hot((phi.detach() + gamma + 0.3 * scores).argmax(-1), 10).double()
    assert (z_eps != z_hat).any()
    leaf = phi.detach().requires_grad_(True)
    (kl_grad,) = torch.autograd.grad(kl_uniform(leaf).mean(), leaf)
    torch.testing.assert_close(phi.grad, (z_eps - z_hat) / (16 * -0.3) + kl_grad)


def test_the_model_parts_are_config_groups_and_unread_groups_are_refused(data_dir, tmp_path):
    cfg = _cfg(data_dir, tmp_path / "run")
    assert cfg.task.encoder._target_ == "latentstruct.models.vae.Encoder" and list(cfg.task.encoder.hidden) == [32, 16]
    assert (cfg.task.scorer.hidden, cfg.task.decoder.hidden, cfg.task.estimator.epsilon) == (8, 32, -1.0)
    task = build_model(cfg, {"input_dim": 784, "num_classes": 10})
    sizes = {name: tuple(p.shape) for name, p in task.named_parameters()}
    assert sizes["vae.encoder.2.weight"] == (16, 32) and sizes["vae.discrete_head.0.weight"] == (8, 16)
    assert sizes["vae.mu_head.weight"] == (40, 16) and sizes["vae.decoder.0.weight"] == (32, 40)
    assert isinstance(task.estimator, Direct) and task.estimator.max_retries == 0
    gsm = build_model(_cfg(data_dir, tmp_path / "run", method="gsm"), {"input_dim": 784, "num_classes": 10})
    assert isinstance(gsm.estimator, GumbelSoftmax) and gsm.anneal_start == 1.0
    with pytest.raises(ConfigCompositionException, match="structure"):  # the code is categorical: no such group
        _cfg(data_dir, tmp_path / "run", "structure=categorical")
    with pytest.raises(ConfigCompositionException, match="Key 'structure' not in 'SemiSupervisedVAEConf'"):
        _cfg(data_dir, tmp_path / "run", "+structure=categorical")  # nor a part of the task's schema
    for old in ("task.method=gsm", "task.gsm_hard=true", "task.anneal_start=0.1", "task.encoder_hidden=[8,8]"):
        with pytest.raises(ConfigError, match="unknown key"):
            train(_cfg(data_dir, tmp_path / "run", f"+{old}"))


@pytest.mark.parametrize("experiment", [m for m in methods("vae") if not m.startswith("unsup_")])
def test_every_vae_experiment_and_the_sweep_compose_validate_and_build(data_dir, tmp_path, experiment):
    cfg = _cfg(data_dir, tmp_path / "run", method=experiment)
    validate(cfg)
    task = build_model(cfg, {"input_dim": 784, "num_classes": 10})
    expected = {"direct": (Direct, 1.0, True), "direct_eps01": (Direct, 0.1, True),
                "direct_no_kl": (Direct, 1.0, False), "gsm": (GumbelSoftmax, 1.0, True)}[experiment]
    assert (type(task.estimator), task.anneal_start, task.kl_discrete) == expected
    sweep = compose("+sweep=direct_vae", hydra=True)
    assert sweep.hydra.sweeper.params["+experiment"] == "vae_direct,vae_gsm,vae_direct_no_kl,vae_direct_eps01"


@pytest.mark.parametrize("estimator", ["direct", "gumbel_softmax", "st_gumbel", "marginals", "sparsemap", "sfe",
                                       "spigot", "ste_s"])
def test_every_estimator_trains_the_vae(data_dir, tmp_path, estimator):
    """Any estimator option crosses the code's argmax; labelled steps: direct's target or the cross-entropy."""
    cfg = _cfg(data_dir, tmp_path / "run", f"estimator={estimator}", method="gsm")
    task = build_model(cfg, {"input_dim": 784, "num_classes": 10})
    x = (torch.rand(8, 784) > 0.5).float()
    for batch in ({"x": x, "y": torch.arange(8)}, {"x": x}):
        task.zero_grad()
        out = task(batch)
        out.loss.backward()
        assert torch.isfinite(out.loss)
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in task.vae.discrete_head.parameters())


@pytest.mark.real_data("mnist")
def test_real_mnist_smoke_run_learns_from_the_labels(tmp_path, data_root):
    record = train(_cfg(data_root, tmp_path / "run", "dataset.n_labelled=100", "dataset.n_valid=1000",
                        "trainer.batch_size=100", "trainer.phases.0.epochs=30", "trainer.max_steps=30",
                        "trainer.eval_every=30", small=False))
    assert record["steps"] == 30
    # 30 steps on 100 labelled images only: far above chance (10%), far below the paper's 95%
    assert record["metrics"]["test/acc"] > 30
    assert 100 < record["metrics"]["test/bound"] < 600


@pytest.mark.parametrize("method", ["direct", "gsm"])
def test_kl_discrete_false_drops_exactly_the_categorical_kl(method):
    estimators = {"direct": lambda: Direct(epsilon=-1.0, max_retries=0), "gsm": GumbelSoftmax}
    torch.manual_seed(0)
    with_kl = _task(estimators[method]()).double()
    without = _task(estimators[method](), kl_discrete=False).double()
    without.load_state_dict(with_kl.state_dict())
    x = (torch.rand(8, 784) > 0.5).double()
    losses = []
    for task in (with_kl, without):
        torch.manual_seed(1)
        losses.append(task({"x": x}).loss)
    phi = with_kl.vae.encode(x)[0]
    kl = (torch.softmax(phi, -1) * torch.log_softmax(phi, -1)).sum(-1).mean() + torch.log(torch.tensor(10.0)).double()
    torch.testing.assert_close(losses[0] - losses[1], kl)
