"""k-NN image classification through a latent top-k set (seed 002 §5.2): loss, prediction, task and experiments."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest
import torch
from hydra.errors import ConfigCompositionException
from torch import nn

import latentstruct.config as config
import latentstruct.optim
from latentstruct.config import ConfigError, check_command_line
from latentstruct.estimators import Direct, NeuralSort, Spigot
from latentstruct.models.vision import CifarSigmaNet, MnistConvNet, MnistSigmaNet, ResNet18
from latentstruct.structures import Categorical, TopK
from latentstruct.tasks import KNN
from latentstruct.tasks.knn import knn_loss, knn_predict
from latentstruct.train import build_model, train
from tests.data.test_images import write_mnist
from tests.helpers import compose as _compose
from tests.helpers import methods

EXPERIMENTS = methods("knn")


class Flat(nn.Module):
    """A tiny embedding for fast tests: flatten, then linear."""

    def __init__(self, dim: int = 6):
        super().__init__()
        self.lin = nn.Linear(4 * 4, dim)

    def forward(self, x):
        return self.lin(x.flatten(1))


def _batch(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 1, 4, 4, generator=g), "y": torch.randint(0, 3, (n,), generator=g)}


def test_loss_is_the_fraction_of_wrong_neighbours_and_linear():
    z = torch.tensor([[1.0, 1, 0, 1, 0], [0, 1, 1, 1, 0]])
    same = torch.tensor([[1.0, 0, 0, 1, 1], [0, 0, 0, 0, 1]])
    torch.testing.assert_close(knn_loss(z, same, 3), torch.tensor([1 / 3, 1.0]))
    w = torch.rand(2, 5)
    torch.testing.assert_close(knn_loss(0.3 * z + 0.7 * w, same, 3), 0.3 * knn_loss(z, same, 3)
                               + 0.7 * knn_loss(w, same, 3))


def test_predict_is_the_majority_vote_by_brute_force():
    torch.manual_seed(0)
    ref, labels, queries = torch.randn(50, 3), torch.randint(0, 4, (50,)), torch.randn(30, 3)
    for k in (1, 3, 4, 7):
        pred = knn_predict(queries, ref, labels, k, num_classes=4, chunk=7)
        for q, p in zip(queries, pred, strict=True):
            order = ((ref - q) ** 2).sum(-1).argsort()[:k]
            votes = Counter(labels[order].tolist())
            best = max(votes.values())
            tied = [lab for lab in labels[order].tolist() if votes[lab] == best]  # in order of distance
            assert int(p) == tied[0]


def test_direct_step_builds_the_topk_problem_of_the_batch():
    torch.manual_seed(1)
    task = KNN(Flat(), Direct(epsilon=-1.0, sigma=0.0), k=2, num_classes=3, num_queries=3)
    batch = _batch(10)
    out = task(batch)
    e = task.embedding(batch["x"])
    scores = -torch.cdist(e[:3], e[3:]) ** 2
    torch.testing.assert_close(out.z, TopK(2).map(scores))  # σ = 0: the k nearest candidates
    same = (batch["y"][:3, None] == batch["y"][None, 3:]).float()
    torch.testing.assert_close(out.loss, knn_loss(out.z, same, 2).mean())
    out.loss.backward()
    assert all(p.grad is not None for p in task.parameters())


@pytest.mark.parametrize("stochastic", [False, True])
def test_neuralsort_baselines_train_on_a_relaxed_topk(stochastic):
    torch.manual_seed(2)
    estimator = NeuralSort(tau=0.5, stochastic=stochastic, samples=4, eval_latent="map")
    task = KNN(Flat(), estimator, k=2, num_classes=3, num_queries=3)
    out = task(_batch(10))
    assert out.z.shape == (3, 7) and bool(((out.z >= 0) & (out.z <= 1 + 1e-6)).all())
    torch.testing.assert_close(out.z.sum(-1), torch.full((3,), 2.0))
    out.loss.backward()
    assert task.embedding.lin.weight.grad.abs().sum() > 0
    task.eval()  # with eval_latent=map the baselines predict like every method: the hard top-k
    assert set(task(_batch(10)).z.unique().tolist()) <= {0.0, 1.0}


def test_neuralsort_estimator_is_the_relaxed_topk_averaged_over_samples():
    from latentstruct.structures.neuralsort import relaxed_topk

    scores = torch.randn(4, 9)
    torch.manual_seed(5)
    z = NeuralSort(tau=2.0, stochastic=True, samples=3)(scores, TopK(3))
    torch.manual_seed(5)
    expected = torch.stack([relaxed_topk(scores, 3, 2.0, True) for _ in range(3)]).mean(0)
    torch.testing.assert_close(z, expected)
    deterministic = NeuralSort(tau=2.0, samples=3)
    torch.testing.assert_close(deterministic(scores, TopK(3)), relaxed_topk(scores, 3, 2.0))  # one draw, no noise
    torch.testing.assert_close(deterministic.eval()(scores, TopK(3)), relaxed_topk(scores, 3, 2.0))
    with pytest.raises(ValueError, match="structure=topk"):
        NeuralSort()(torch.randn(2, 3), Categorical())


def test_learned_sigma_is_per_query_and_gets_a_gradient():
    sigma_net = nn.Sequential(nn.Flatten(), nn.Linear(16, 1), nn.Softplus())
    task = KNN(Flat(), Direct(epsilon=-1.0), k=2, num_classes=3, num_queries=3, sigma=sigma_net)
    assert set(task.param_groups()) == {"default", "sigma"}
    torch.manual_seed(3)
    task(_batch(12)).loss.backward()
    assert sigma_net[1].weight.grad is not None and bool(torch.isfinite(sigma_net[1].weight.grad).all())
    with pytest.raises(ValueError, match="sigma_net needs estimator=direct"):
        KNN(Flat(), Spigot(), k=2, num_classes=3, sigma=sigma_net)


def test_evaluate_needs_the_training_data_and_reuses_its_embeddings():
    task = KNN(Flat(), Direct(), k=3, num_classes=3, num_queries=3)
    with pytest.raises(RuntimeError, match="use_training_data"):
        task.evaluate(_batch(5))
    train_split, test = _batch(40, seed=1), _batch(20, seed=2)
    task.use_training_data(train_split)
    metrics = task.evaluate(test, batch_size=16)
    with torch.no_grad():
        expected = knn_predict(task.embedding(test["x"]), task.embedding(train_split["x"]), train_split["y"], 3, 3)
    assert metrics["acc"] == pytest.approx(100 * float((expected == test["y"]).float().mean()))
    cached = task._cache[1]
    task.evaluate(test)
    assert task._cache[1] is cached  # no training step in between: the same reference embeddings
    task.train()
    task(_batch(10)).loss.backward()
    task.evaluate(test)
    assert task._cache[1] is not cached and task.training  # mode restored


def test_batches_too_small_for_queries_and_k_are_refused():
    task = KNN(Flat(), Direct(), k=3, num_classes=3, num_queries=5)
    with pytest.raises(ValueError, match="batch_size"):
        task(_batch(7))
    with pytest.raises(ValueError, match="k >= 1"):
        KNN(Flat(), Direct(), k=0, num_classes=3)


def test_protocol_hyper_parameters():
    nets = {"mnist": (MnistConvNet, MnistSigmaNet, 900), "fashion_mnist": (ResNet18, MnistSigmaNet, 900),
            "cifar10": (ResNet18, CifarSigmaNet, 700)}
    for name, (encoder, sigma_net, batch) in nets.items():
        cfg = _compose("+experiment=knn_direct_learned", f"dataset={name}", "task.k=1")
        assert (cfg.task.encoder._target_, cfg.task.sigma_net._target_) == (_name(encoder), _name(sigma_net))
        assert (cfg.trainer.batch_size, cfg.task.num_queries) == (batch, 100)
        assert cfg.trainer.max_epochs == 220 * (batch // 100)
        assert (cfg.optim._target_, cfg.optim.lr, cfg.optim_groups.sigma._target_) == ("torch.optim.Adam", 1e-3,
                                                                                         "torch.optim.SGD")
    assert _compose("+experiment=knn_direct_learned", "task.k=1").task.estimator.samples == 5
    assert _compose("+experiment=knn_direct_learned", "task.k=9").task.estimator.samples == 1
    assert _compose("+experiment=knn_direct_sigma0", "task.k=3").task.estimator.sigma == 0.0
    assert _compose("+experiment=knn_direct_sigma1", "task.k=3").task.estimator.sigma == 1.0
    for experiment in ("direct_sigma0", "direct_sigma1", "neuralsort", "neuralsort_stochastic"):
        assert _compose(f"+experiment=knn_{experiment}", "task.k=3").task.sigma_net is None  # σ is learned by one only
    stochastic = _compose("+experiment=knn_neuralsort_stochastic", "task.k=3").task.estimator
    assert (stochastic._target_, stochastic.stochastic, stochastic.tau, stochastic.samples) == (
        "latentstruct.estimators.NeuralSort", True, 16.0, 5)
    assert not _compose("+experiment=knn_neuralsort", "task.k=3").task.estimator.stochastic
    # A network chosen on the command line replaces the dataset's: used, not ignored.
    assert _compose("+experiment=knn_direct_learned", "task.k=1", "encoder=resnet18").task.encoder._target_ == _name(
        ResNet18)


def test_the_tuned_networks_take_only_sizes_from_the_data():
    """encoder=tuned and sigma_net=tuned carry no settings: each network the tuned table names takes only the sizes
    of the data (FROM_DATA), and every k-NN experiment passes the config check."""
    cfg = _compose("+experiment=knn_direct_learned", "task.k=1")
    for name in ("mnist", "fashion_mnist", "cifar10"):
        for group in ("encoder", "sigma_net"):
            assert config.settings(config.locate(cfg.tuned[name][group])) == {}, (name, group)
    for experiment in EXPERIMENTS:
        for dataset in ("mnist", "fashion_mnist", "cifar10"):
            config.validate(_compose(f"+experiment=knn_{experiment}", "task.k=3", f"dataset={dataset}"))


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__name__}"


def test_sweep_composes_the_paper_grid():
    cfg = _compose("+sweep=direct_knn", hydra=True)
    params = cfg.hydra.sweeper.params
    assert params["task.k"] == "1,3,5,9" and len(params["+experiment"].split(",")) == len(EXPERIMENTS) == 5


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_knn_experiment_runs_on_mnist_files(tmp_path, experiment):
    """Two steps of each method on tiny generated MNIST files (real IDX format), with the real conv nets."""
    write_mnist(tmp_path / "data" / "mnist", n_train=60, n_test=10)
    record = train(_compose(f"+experiment=knn_{experiment}", "task.k=3", "task.num_queries=4",
                            "trainer.batch_size=20", "trainer.max_steps=2", "trainer.eval_every=2",
                            "dataset.n_valid=10", "trainer.progress=false", f"paths.data_dir={tmp_path / 'data'}",
                            f"paths.output_dir={tmp_path / 'run'}"))
    assert record["status"] == "completed" and 0 <= record["metrics"]["test/acc"] <= 100
    assert list(pd.read_csv(tmp_path / "run" / "history.csv")["step"]) == [2]


def test_the_mnist_conv_net_is_built_with_its_sigma_network():
    cfg = _compose("+experiment=knn_direct_learned", "task.k=3")
    task = build_model(cfg, {"channels": 1, "height": 28, "width": 28, "num_classes": 10})
    assert isinstance(task.embedding, MnistConvNet) and isinstance(task.sigma, MnistSigmaNet)
    assert (task.k, task.structure.k, task.num_queries) == (3, 3, 100)
    optimizer = latentstruct.optim.build(cfg.optim, cfg.optim_groups, task.param_groups())
    assert {k: type(v).__name__ for k, v in optimizer.optimizers.items()} == {"default": "Adam", "sigma": "SGD"}
    cifar = build_model(_compose("+experiment=knn_direct_learned", "task.k=3", "dataset=cifar10"),
                        {"channels": 3, "height": 32, "width": 32, "num_classes": 10})
    assert isinstance(cifar.embedding, ResNet18) and isinstance(cifar.sigma, CifarSigmaNet)


@pytest.mark.parametrize("override", ["+scorer=linear", "+decoder=bilinear", "+structure=topk"])
def test_a_part_group_knn_does_not_read_is_refused(override):
    """The structure is TopK(task.k), built by the task: a structure, scorer or decoder set on the command line is an
    error, not a no-op, at composition: with the +, its task's schema has no such part (the command line says so in
    one line); without it, the k-NN options select no such group."""
    group = override[1:].split("=")[0]
    with pytest.raises(ConfigCompositionException, match=f"Key '{group}' not in 'KNNConf'"):
        _compose("+experiment=knn_direct_sigma0", "task.k=3", override)
    with pytest.raises(ConfigError, match=rf"^task KNN takes no {group} \(its parts: encoder, estimator, sigma_net\)"):
        check_command_line(["+experiment=knn_direct_sigma0", "task.k=3", override])
    with pytest.raises(ConfigCompositionException, match="No match in the defaults list"):
        _compose("+experiment=knn_direct_sigma0", "task.k=3", override[1:])


def test_a_learned_sigma_needs_the_direct_estimator():
    cfg = _compose("+experiment=knn_neuralsort", "task.k=3", "sigma_net=mnist_convnet")
    with pytest.raises(ValueError, match="sigma_net needs estimator=direct"):
        build_model(cfg, {"channels": 1, "height": 28, "width": 28, "num_classes": 10})


def test_drop_last_yields_only_full_batches_and_counts_them():
    from latentstruct.data.base import iterate_batches, num_batches

    data = {"x": torch.arange(23)}
    sizes = [len(b["x"]) for b in iterate_batches(data, 5, shuffle_seed=1, drop_last=True)]
    assert sizes == [5, 5, 5, 5] and num_batches(23, 5, drop_last=True) == 4
    assert [len(b["x"]) for b in iterate_batches(data, 5, start=3, drop_last=True)] == [5]
    assert [len(b["x"]) for b in iterate_batches(data, 5)][-1] == 3 and num_batches(23, 5) == 5
    with pytest.raises(ValueError, match="drop_last"):
        num_batches(3, 5, drop_last=True)
    assert _compose("+experiment=knn_neuralsort", "task.k=1").trainer.drop_last is True


def test_a_knn_run_crosses_an_epoch_boundary(tmp_path):
    """54 training images in batches of 20: two full batches per epoch, the 14 left over are skipped."""
    write_mnist(tmp_path / "data" / "mnist", n_train=64, n_test=10)
    record = train(_compose("+experiment=knn_direct_sigma0", "task.k=3", "task.num_queries=4", "trainer.batch_size=20",
                            "trainer.max_steps=5", "trainer.eval_every=5", "dataset.n_valid=10",
                            "trainer.progress=false", f"paths.data_dir={tmp_path / 'data'}",
                            f"paths.output_dir={tmp_path / 'run'}"))
    assert record["status"] == "completed" and record["steps"] == 5 and record["best_epoch"] == 3
