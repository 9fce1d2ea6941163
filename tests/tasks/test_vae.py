"""The semi-supervised VAE task of seed 003 end to end: trainer.phases (labelled, then unlabelled), the ε / τ
schedules, the direct update's sign on labelled data, its agreement with the project's Direct estimator, resumption
inside the phases, and a real-MNIST smoke run."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import latentstruct.train as train_module
from latentstruct.data.semisupervised import semisupervised_dataset
from latentstruct.estimators.direct import Direct
from latentstruct.models.vae import direct_encoder_surrogate
from latentstruct.structures.categorical import Categorical
from latentstruct.tasks.vae import SemiSupervisedVAE
from latentstruct.train import train
from tests.data.test_images import write_mnist
from tests.helpers import compose

SMALL = ["task.gaussian_dim=4", "task.encoder_hidden=[32,16]", "task.head_hidden=8", "task.decoder_hidden=32"]


@pytest.fixture
def data_dir(tmp_path):
    for name in ("mnist", "fashion_mnist"):
        write_mnist(tmp_path / "data" / name, n_train=200, n_test=40, seed=len(name))
    return tmp_path / "data"


def _cfg(data_dir, out, *overrides, method="direct", small=True):
    return compose(
        f"+experiment=vae/{method}", f"paths.data_dir={data_dir}", f"paths.output_dir={out}",
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
    a, b = (pd.read_csv(tmp_path / n / "history.csv").drop(columns="wall_seconds") for n in ("full", "crashed"))
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
    direct = SemiSupervisedVAE(784, 10, "direct", anneal_start=1.0, anneal_rate=1e-3, anneal_floor=0.1)
    gsm = SemiSupervisedVAE(784, 10, "gsm", anneal_start=2.0, anneal_rate=1e-3, anneal_floor=0.5)
    direct.begin_step(1, 1000)
    gsm.begin_step(1, 1000)
    assert direct.temperature(labelled=True) == 0.05 and gsm.temperature(labelled=True) == 2.0
    assert direct.temperature(labelled=False) == pytest.approx(torch.e ** -1)
    assert gsm.temperature(labelled=False) == pytest.approx(2 * torch.e ** -1)
    direct.begin_step(1, 10_000)
    gsm.begin_step(1, 10_000)
    assert (direct.temperature(False), gsm.temperature(False)) == (0.1, 0.5)  # the floors


def test_a_labelled_direct_step_raises_the_labels_logit_where_the_sample_missed_it(monkeypatch):
    torch.manual_seed(0)
    task = SemiSupervisedVAE(784, 10, "direct", gaussian_dim=4, encoder_hidden=(32, 16), head_hidden=8,
                             decoder_hidden=32)
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


def test_direct_surrogate_equals_the_direct_estimator_on_a_categorical():
    """One rule, two entry points: the VAE's surrogate and ``estimator=direct`` (σ = 1, no ε growth) with the
    linear loss −<z, θ> give the same gradient for the same Gumbel draws (the estimator's noise is shifted by its
    mean, which moves no argmax)."""
    phi0, theta = torch.randn(32, 10, dtype=torch.float64), 5 * torch.randn(32, 10, dtype=torch.float64)
    torch.manual_seed(7)
    phi = phi0.clone().requires_grad_(True)
    direct_encoder_surrogate(phi, theta, 0.3)[0].backward()
    torch.manual_seed(7)
    scores = phi0.clone().requires_grad_(True)
    estimator = Direct(epsilon=-0.3, sigma=1.0, max_retries=0)
    z = estimator(scores, Categorical(), None, lambda z: -(z * theta).sum(-1))
    (-(z * theta).sum(-1)).mean().backward()
    assert phi.grad.abs().sum() > 0
    torch.testing.assert_close(scores.grad, phi.grad)


@pytest.mark.real_data("mnist")
def test_real_mnist_smoke_run_learns_from_the_labels(tmp_path, data_root):
    record = train(_cfg(data_root, tmp_path / "run", "dataset.n_labelled=100", "dataset.n_valid=10000",
                        "trainer.batch_size=100", "trainer.phases.0.epochs=30", "trainer.max_steps=30",
                        "trainer.eval_every=30", small=False))
    assert record["steps"] == 30
    # 30 steps on 100 labelled images only: far above chance (10%), far below the paper's 95%
    assert record["metrics"]["test/acc"] > 30
    assert 100 < record["metrics"]["test/bound"] < 600


@pytest.mark.parametrize("method", ["direct", "gsm"])
def test_kl_discrete_false_drops_exactly_the_categorical_kl(method):
    small = dict(gaussian_dim=4, encoder_hidden=(32, 16), head_hidden=8, decoder_hidden=32)
    torch.manual_seed(0)
    with_kl = SemiSupervisedVAE(784, 10, method, **small).double()
    without = SemiSupervisedVAE(784, 10, method, kl_discrete=False, **small).double()
    without.load_state_dict(with_kl.state_dict())
    x = (torch.rand(8, 784) > 0.5).double()
    losses = []
    for task in (with_kl, without):
        torch.manual_seed(1)
        losses.append(task({"x": x}).loss)
    phi = with_kl.vae.encode(x)[0]
    kl = (torch.softmax(phi, -1) * torch.log_softmax(phi, -1)).sum(-1).mean() + torch.log(torch.tensor(10.0)).double()
    torch.testing.assert_close(losses[0] - losses[1], kl)
