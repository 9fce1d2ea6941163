"""Sorting numbers as bipartite matching (seed 002 §5.1): data, loss, metrics, the task group and the experiments."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from scipy.stats import kendalltau

import latentstruct.optim
import latentstruct.train as train_module
from latentstruct.data.sorting import sorting_numbers
from latentstruct.estimators import Direct, Spigot
from latentstruct.models.sorting import LinearSigmaNet, RankScorer
from latentstruct.structures import Matching
from latentstruct.structures.base import gumbel_like
from latentstruct.structures.matching import sinkhorn
from latentstruct.tasks import LatentClassifier, Sorting
from latentstruct.tasks.sorting import kendall_tau, sorting_loss
from latentstruct.train import build_model, train
from tests.helpers import compose as _compose
from tests.helpers import methods, train_run

TINY = ["dataset.num_items=5", "dataset.n_valid=40", "dataset.n_test=40", "trainer.progress=false"]
EXPERIMENTS = methods("sorting")


def _random_permutations(batch: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(d, generator=g) for _ in range(batch)])


# ------------------------------------------------------------------------------------------------------- data


def test_labels_are_the_sorting_permutations():
    data = sorting_numbers(num_items=7, n_train=30, n_valid=20, n_test=25, seed=3)
    assert data.dims == {"input_dim": 7, "num_items": 7}
    for name, n in (("train", 30), ("valid", 20), ("test", 25)):
        x, y = data.splits[name]["x"], data.splits[name]["y"]
        assert x.shape == y.shape == (n, 7) and x.dtype == torch.float32 and y.dtype == torch.long
        assert bool(((x >= 0) & (x < 1)).all())
        assert bool((y.sort(-1).values == torch.arange(7)).all())  # every row a permutation of 0..d-1
        z = F.one_hot(y, 7).to(x.dtype)  # z*[i, j] = 1 iff x_i is the j-th smallest
        sorted_by_label = torch.einsum("nij,ni->nj", z, x)
        assert torch.equal(sorted_by_label, x.sort(-1).values)
        for row_x, row_y in zip(x[:3], y[:3], strict=True):  # the definition, element by element
            for i in range(7):
                assert row_y[i] == int((row_x < row_x[i]).sum())


def test_data_is_deterministic_and_splits_are_independent_of_later_sizes():
    a = sorting_numbers(num_items=5, n_train=10, n_valid=4, n_test=4, seed=1)
    b = sorting_numbers(num_items=5, n_train=10, n_valid=4, n_test=400, seed=1)
    c = sorting_numbers(num_items=5, n_train=10, n_valid=4, n_test=4, seed=2)
    assert torch.equal(a.splits["train"]["x"], b.splits["train"]["x"])
    assert torch.equal(a.splits["valid"]["x"], b.splits["valid"]["x"])
    assert not torch.equal(a.splits["train"]["x"], c.splits["train"]["x"])


# ------------------------------------------------------------------------------------------------------- loss


@pytest.mark.parametrize("d", [1, 2, 5, 9])
def test_loss_is_half_the_squared_distance_between_permutation_matrices(d):
    z = F.one_hot(_random_permutations(50, d, seed=d), d).double()
    target = F.one_hot(_random_permutations(50, d, seed=100 + d), d).double()
    loss = sorting_loss(z, target)
    squared = ((z - target) ** 2).flatten(1).sum(-1)
    torch.testing.assert_close(loss, squared / 2)
    misplaced = (z.argmax(-1) != target.argmax(-1)).sum(-1).double()
    torch.testing.assert_close(loss, misplaced)
    assert float(sorting_loss(target, target).abs().max()) == 0
    # Linear in z with slope −z*: direct's loss-perturbed MAP is exact.
    mu = torch.rand(50, d, d, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(sorting_loss(mu, target).sum(), mu)
    torch.testing.assert_close(grad, -target)


def test_gumbel_sinkhorn_loss_is_the_reconstruction_error_of_the_sorted_sequence():
    task = Sorting(Matching(), None, RankScorer(4), baseline="gumbel_sinkhorn", tau=0.5, sinkhorn_iters=7, samples=3)
    x = torch.rand(6, 4)
    scores = torch.randn(6, 4, 4)
    torch.manual_seed(0)
    loss = task._reconstruction_loss(scores, x)
    torch.manual_seed(0)
    tiled = scores.repeat(3, 1, 1)
    soft = sinkhorn(tiled + gumbel_like(tiled), 0.5, 7)
    expected = torch.stack(
        [((soft[r].T @ x[r % 6]) - x[r % 6].sort().values).pow(2).mean() for r in range(18)]
    ).mean()
    torch.testing.assert_close(loss, expected)
    # Scores that single out the sorting permutation reconstruct the sorted sequence: loss ≈ 0.
    y = x.argsort(-1).argsort(-1)
    assert float(task._reconstruction_loss(100.0 * F.one_hot(y, 4).float(), x)) < 1e-8


# ---------------------------------------------------------------------------------------------------- metrics


def _task_predicting(positions: torch.Tensor) -> Sorting:
    """A task whose scores make the Hungarian matching put element i of sequence b at ``positions[b, i]``."""
    task = Sorting(Matching(), Direct(), RankScorer(positions.shape[1]))
    table = F.one_hot(positions, positions.shape[1]).float()
    task.scores = lambda x: table[: len(x)]
    return task


def test_metrics_on_hand_made_cases():
    gold = torch.tensor([[2, 0, 3, 1], [2, 0, 3, 1], [2, 0, 3, 1]])
    pred = torch.tensor(
        [
            [2, 0, 3, 1],  # perfect
            [2, 1, 3, 0],  # two elements swapped: 2/4 wrong; 5 of 6 pairs agree → τ = (5 − 1)/6
            [1, 3, 0, 2],  # reversed ranks: every element wrong, τ = −1
        ]
    )
    task = _task_predicting(pred)
    metrics = task.evaluate({"x": torch.rand(3, 4), "y": gold})
    assert metrics["acc"] == pytest.approx(100 / 3)
    assert metrics["prop_wrong"] == pytest.approx(100 * (0 + 0.5 + 1) / 3)
    assert metrics["kendall_tau"] == pytest.approx((1 + 4 / 6 - 1) / 3)
    assert metrics["loss"] == pytest.approx((0 + 2 + 4) / 3)
    assert task.training  # evaluate restores the mode


def test_kendall_tau_matches_scipy():
    a, b = _random_permutations(40, 8, seed=1), _random_permutations(40, 8, seed=2)
    ours = kendall_tau(a, b, chunk=7)
    theirs = [kendalltau(u.numpy(), v.numpy())[0] for u, v in zip(a, b, strict=True)]
    np.testing.assert_allclose(ours.numpy(), theirs, atol=1e-6)
    assert torch.equal(kendall_tau(a[:, :1], b[:, :1]), torch.ones(40))


# ------------------------------------------------------------------------------------------- task and configs


def test_default_task_is_the_classifier_and_a_sorting_run_is_another_configuration():
    cfg = _compose()
    assert cfg.task._target_ == "latentstruct.tasks.LatentClassifier"
    assert dict(cfg.optim_groups) == {}
    assert isinstance(build_model(cfg, {"input_dim": 4, "latent_dim": 3, "num_classes": 2}), LatentClassifier)
    current, other = OmegaConf.to_container(cfg), OmegaConf.to_container(_compose("task=sorting"))
    train_module._check_same_run(current, current, Path("run"))
    with pytest.raises(ValueError, match="task._target_"):
        train_module._check_same_run(current, other, Path("run"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_sorting_experiment_runs_a_few_steps(tmp_path, experiment):
    assert len(EXPERIMENTS) == 4
    record = train_run(tmp_path, *TINY, f"+experiment=sorting_{experiment}", "trainer.max_steps=4",
                       "trainer.eval_every=2")
    assert record["status"] == "completed"
    assert {f"{s}/{m}" for s in ("valid", "test") for m in ("acc", "prop_wrong", "kendall_tau")} <= set(
        record["metrics"]
    )
    assert record["seconds_per_step"] > 0
    history = pd.read_csv(tmp_path / "run" / "history.csv")
    assert list(history["step"]) == [2, 4]


def test_protocol_hyper_parameters():
    learned = _compose("+experiment=sorting_direct_learned")
    assert (learned.optim._target_, learned.optim.lr) == ("torch.optim.Adam", 0.1)
    assert (learned.optim_groups.sigma._target_, learned.optim_groups.sigma.lr) == ("torch.optim.SGD", 1e-6)
    assert (learned.task.estimator.epsilon, learned.task.estimator.samples) == (-12.0, 5)
    assert learned.task.sigma_net._target_ == "latentstruct.models.sorting.LinearSigmaNet"
    assert (learned.task.scorer._target_, learned.task.scorer.hidden) == ("latentstruct.models.sorting.RankScorer", 32)
    assert (learned.trainer.select.value, learned.trainer.max_epochs, learned.dataset.num_items) == ("best", 2000, 10)
    assert _compose("+experiment=sorting_direct_sigma0").task.estimator.sigma == 0.0
    assert _compose("+experiment=sorting_direct_sigma1").task.estimator.sigma == 1.0
    for experiment in ("direct_sigma0", "direct_sigma1", "gumbel_sinkhorn"):
        assert _compose(f"+experiment=sorting_{experiment}").task.sigma_net is None  # σ is learned by one only
    gs = _compose("+experiment=sorting_gumbel_sinkhorn")
    assert (gs.task.baseline, gs.task.tau, gs.task.sinkhorn_iters, gs.task.samples) == ("gumbel_sinkhorn", 1.0, 10, 5)
    assert gs.task.estimator is None  # trained by its reconstruction loss, evaluated by the Hungarian MAP


def test_sweep_composes_the_paper_grid():
    cfg = _compose("+sweep=direct_sorting", hydra=True)
    params = cfg.hydra.sweeper.params
    assert params["dataset.num_items"] == "5,10,25,40,60,100"
    assert len(params["+experiment"].split(",")) == 4
    assert cfg.dataset.num_items == 10  # the dataset group is selected, so its keys can be overridden


def test_learned_sigma_gets_a_gradient_and_its_own_optimizer():
    cfg = _compose(*TINY, "+experiment=sorting_direct_learned")
    data = sorting_numbers(num_items=5, n_train=10, n_valid=1, n_test=1, seed=0)
    torch.manual_seed(0)
    task = build_model(cfg, data.dims)
    groups = task.param_groups()
    assert set(groups) == {"default", "sigma"}
    optimizer = latentstruct.optim.build(cfg.optim, cfg.optim_groups, groups)
    assert {k: type(v).__name__ for k, v in optimizer.optimizers.items()} == {"default": "Adam", "sigma": "SGD"}
    before = [p.detach().clone() for p in groups["sigma"]]
    optimizer.zero_grad()
    task(data.splits["train"]).loss.backward()
    grads = [p.grad for p in groups["sigma"]]
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
    optimizer.step()
    for p, old, g in zip(groups["sigma"], before, grads, strict=True):  # plain SGD, lr 1e-6
        torch.testing.assert_close(p.detach(), old - 1e-6 * g)
    state = optimizer.state_dict()
    optimizer.load_state_dict(state)
    assert set(state) == {"default", "sigma"}


def test_invalid_combinations_are_refused(tmp_path):
    with pytest.raises(ValueError, match="sigma_net needs estimator=direct"):
        Sorting(Matching(), Spigot(), RankScorer(3), LinearSigmaNet(3))
    with pytest.raises(ValueError, match="matching"):
        Sorting(object(), Direct(), RankScorer(3))
    with pytest.raises(ValueError, match="without an estimator"):
        Sorting(Matching(), Direct(), RankScorer(3), baseline="gumbel_sinkhorn")
    with pytest.raises(ValueError, match="baseline must be one of"):
        Sorting(Matching(), Direct(), RankScorer(3), baseline="sinkhorn")
    groups = Sorting(Matching(), Direct(), RankScorer(3)).param_groups()
    sgd = {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1}
    with pytest.raises(ValueError, match="sigma"):
        latentstruct.optim.build(sgd, {"sigma": sgd}, groups)
    with pytest.raises(ValueError, match="default"):
        latentstruct.optim.build(sgd, {"default": sgd}, groups)
    # refused at composition: the default data fill categorical scores only (latentstruct.capabilities)
    with pytest.raises(ValueError, match="structure=matching does not fit dataset=synthetic_clusters"):
        train(_compose("task=sorting", "structure=matching", "trainer.max_steps=1", f"paths.output_dir={tmp_path}"))


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (["+experiment=sorting_gumbel_sinkhorn", "estimator=direct"], "without an estimator"),
        (["+experiment=sorting_direct_sigma1", "+decoder=bilinear"], "Key 'decoder' not in 'SortingConf'"),
        (["+experiment=sorting_direct_sigma1", "+encoder=identity"], "Key 'encoder' not in 'SortingConf'"),
        (["+experiment=sorting_direct_sigma1", "sigma_net=mnist_convnet"], "unexpected keyword argument 'in_features'"),
    ],
)
def test_a_part_the_experiment_does_not_use_is_refused(overrides, error):
    """An estimator for the Gumbel-Sinkhorn baseline, a decoder or an encoder is an error, not a no-op."""
    with pytest.raises((ValueError, TypeError, ConfigCompositionException), match=error):
        build_model(_compose(*overrides), {"input_dim": 5, "num_items": 5})


def test_the_parts_are_the_protocol_networks():
    """μ-network Linear(1 → 32) → ReLU → Linear(32 → d) on each number; σ-network Linear(d → 1) → softplus."""
    task = build_model(_compose("+experiment=sorting_direct_learned"), {"input_dim": 10, "num_items": 10})
    assert [(m.in_features, m.out_features) for m in task.mu if isinstance(m, torch.nn.Linear)] == [(1, 32), (32, 10)]
    assert isinstance(task.sigma, LinearSigmaNet) and (task.sigma[0].in_features, task.sigma[0].out_features) == (10, 1)
    assert sum(p.numel() for p in task.parameters()) == (2 * 32 + 33 * 10) + 11
    assert task.scores(torch.rand(4, 10)).shape == (4, 10, 10)


def test_direct_sigma1_training_improves_validation_accuracy(tmp_path):
    # Seed 3 starts far from sorted; Adam lr 0.1 then learns to sort 5 numbers within a dozen steps.
    train_run(tmp_path, *TINY, "+experiment=sorting_direct_sigma1", "trainer.seed=3", "dataset.n_valid=100",
         "trainer.max_steps=12", "trainer.eval_every=1")
    history = pd.read_csv(tmp_path / "run" / "history.csv")
    first, last = history.iloc[0], history.iloc[-1]
    assert first["valid/acc"] <= 10 and first["valid/prop_wrong"] >= 40
    assert last["valid/acc"] >= 90 and last["valid/prop_wrong"] <= 5
    assert last["valid/kendall_tau"] > first["valid/kendall_tau"]


def test_every_permutation_of_the_loss_is_consistent_with_enumeration():
    # The loss over all 4! matchings against one target: 0 only at the target, and d − (fixed points) elsewhere.
    target = F.one_hot(torch.tensor([[1, 3, 0, 2]]), 4).float()
    vertices = Matching().enumerate(4)
    losses = sorting_loss(vertices, target.expand(len(vertices), 4, 4))
    for perm, loss in zip(itertools.permutations(range(4)), losses, strict=True):
        assert loss == sum(p != t for p, t in zip(perm, [1, 3, 0, 2], strict=True))
