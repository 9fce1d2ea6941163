"""Semi-supervised citation field extraction (seed 004 Table 4): what each method reads of a labelled and of an
unlabelled citation, the reward-augmented CD and GE against hand computations, and every experiment through train.py
on generated Cora files."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from latentstruct.data.cora import cora_dataset
from latentstruct.models.energy import cd_loss, hamming_loss
from latentstruct.tasks.energy_citation import CitationEnergy, reward_pair_loss
from latentstruct.train import build_model, train
from tests.data.test_cora import write_cora
from tests.helpers import compose as _compose
from tests.helpers import methods

EXPERIMENTS = methods("citation")
TINY_DATA = ["dataset.check_sizes=false", "dataset.n_test=6", "dataset.n_valid=4", "dataset.pool=6",
             "dataset.labelled=3"]
TINY_TASK = ["task.encoder.hidden=4", "embedding.dim=6", "task.neumann_terms=2", "task.spen_steps=2",
             "task.num_samples=3"]


def _cfg(data_dir, out, experiment="cd", *overrides):
    return _compose(f"+experiment=citation_{experiment}", f"paths.data_dir={data_dir}", f"paths.output_dir={out}",
                    "trainer.batch_size=16", "trainer.progress=false", "trainer.threads=1", *TINY_DATA, *TINY_TASK,
                    *overrides)


def _model(tmp_path, experiment="cd", *overrides):
    root = write_cora(tmp_path / "data", n=30)
    cfg = _cfg(root, tmp_path / "out", experiment, *overrides)
    data = cora_dataset(root, labelled=3, check_sizes=False, n_test=6, n_valid=4, pool=6)
    torch.manual_seed(0)
    return build_model(cfg, data.dims, data.extras), data


def _batch(data, rows):
    return {k: v[rows] for k, v in data.splits["train"].items()}


def test_every_experiment_runs_a_few_steps_on_generated_cora(tmp_path):
    data_dir = write_cora(tmp_path / "data", n=30)
    metrics = {f"{s}/{m}" for s in ("valid", "test") for m in ("acc", "token_acc", "author_share", "infer_seconds")}
    assert sorted(EXPERIMENTS) == ["cd", "crf", "dvn", "ge", "rspen"]
    for experiment in EXPERIMENTS:
        out = tmp_path / experiment
        cfg = _cfg(data_dir, out, experiment, "trainer.phases.0.epochs=1", "trainer.phases.1.epochs=1")
        record = train(cfg)
        assert record["status"] == "completed" and record["steps"] == 4  # 2 epochs of 2 batches (26 rows)
        assert set(record["metrics"]) == metrics
        history = pd.read_csv(out / "history.csv")
        assert ((0 <= history["test/acc"]) & (history["test/acc"] <= 100)).all()
    sweep = _compose("+sweep=energy_citation", hydra=True)
    assert sorted(sweep.hydra.sweeper.params["+experiment"].split(",")) == [f"citation_{e}" for e in EXPERIMENTS]
    assert sweep.hydra.sweeper.params["dataset.labelled"] == "5,10,50"
    assert _compose("+experiment=citation_cd").task.unlabelled_loss == "none"  # chosen on validation (issue #33)
    assert _compose("+experiment=citation_rspen").task.unlabelled_loss == "best"
    preset = _compose("+experiment=citation_cd", "+preset=citation_cpu")
    assert (preset.task.encoder.hidden, preset.task.neumann_terms, [p.epochs for p in preset.trainer.phases]) == (50, 5,
                                                                                                            [4, 3])


def test_evaluation_reports_token_accuracy_and_the_share_of_tokens_tagged_author(tmp_path, monkeypatch):
    model, data = _model(tmp_path, "cd")
    split = {k: v[:2] for k, v in data.splits["valid"].items()}
    lengths = split["lengths"]
    pred = split["y"].clone()
    pred[0, 0] = (pred[0, 0] + 1) % 13  # one wrong tag
    pred[1, : lengths[1]] = 0  # the second citation all author (tag 0)
    pred[:, lengths.max():] = 0  # padding: never counted
    monkeypatch.setattr(model, "predict_tags", lambda data, batch_size=None: (pred, 0.0))
    mask = torch.arange(split["y"].shape[1]) < lengths.view(-1, 1)
    n = int(lengths.sum())
    right = int(((pred == split["y"]) & mask).sum())
    author = int(((pred == 0) & mask).sum())
    assert right < n and author >= int(lengths[1])
    metrics = model.evaluate(split)
    assert metrics["acc"] == metrics["token_acc"] == pytest.approx(100 * right / n)
    assert metrics["author_share"] == pytest.approx(100 * author / n)


def test_unlabelled_citations_have_no_gold_and_do_not_move_the_supervised_losses(tmp_path):
    model, data = _model(tmp_path, "crf")
    lab = data.splits["train"]["labelled"]
    labelled, unlabelled = int(lab.argmax()), int(lab.argmin())
    batch = _batch(data, [labelled, unlabelled])
    assert model.gold(batch)[1].abs().sum() == 0 and model.gold(batch)[0].sum() == batch["lengths"][0]
    other = _batch(data, [labelled, unlabelled + 1])  # another unlabelled citation beside it
    torch.testing.assert_close(model(batch).loss, model(other).loss)
    torch.testing.assert_close(model(batch).loss, model.crf_nll(_batch(data, [labelled]))[0])


def test_the_reward_pair_loss_against_a_hand_computation():
    energies = torch.tensor([[1.0], [2.0], [0.5]])  # [K=3, B=1]
    rewards = torch.tensor([[3.0], [1.0], [1.0]])  # sample 0 beats 1 and 2; 1 and 2 tie: no pair
    sp = lambda z: math.log1p(math.exp(z))  # noqa: E731
    expected = (sp(2 + 1.0 - 2.0) + sp(2 + 1.0 - 0.5)) / 2
    assert float(reward_pair_loss(energies, rewards)[0]) == pytest.approx(expected, rel=1e-6)
    assert float(reward_pair_loss(energies, torch.ones(3, 1))[0]) == 0  # every reward ties: no pair, no loss
    with pytest.raises(ValueError, match="both be"):
        reward_pair_loss(energies, rewards[:2])


def _row_gradient(reading, energies, rewards):
    """d(unlabelled row's loss)/d(sample energies) ``[K]`` under a reading, one row."""
    e = energies.clone().requires_grad_(True)
    if reading == "best":
        best = int(rewards.argmax())
        loss = cd_loss(e[best:best + 1], e.unsqueeze(1), (rewards[best] - rewards).unsqueeze(1)).sum()
    else:
        loss = reward_pair_loss(e.unsqueeze(1), rewards.unsqueeze(1)).sum()
    (grad,) = torch.autograd.grad(loss, e)
    return grad


def test_best_lowers_only_the_best_samples_energy_and_pairs_every_better_samples():
    energies = torch.tensor([0.0, 0.0, 0.0, 0.0])
    rewards = torch.tensor([4.0, 3.0, 1.0, 0.0])  # sample 0 best, 3 worst
    best, pairs = _row_gradient("best", energies, rewards), _row_gradient("pairs", energies, rewards)
    # gradient descent lowers E where the gradient is positive
    assert best[0] > 0 and (best[1:] < 0).all()  # best: only A's best sample is pulled down, every other pushed up
    assert pairs[0] > 0 and pairs[3] < 0  # pairs: the best down, the worst up ...
    assert pairs[1] > 0  # ... and the second best, which beats two samples and loses to one, is pulled down too
    torch.testing.assert_close(best.sum(), torch.tensor(0.0), atol=1e-6, rtol=0)  # both: shifts of E change nothing
    torch.testing.assert_close(pairs.sum(), torch.tensor(0.0), atol=1e-6, rtol=0)


@pytest.mark.parametrize("reading", ["best", "pairs", "none"])
def test_unlabelled_loss_chooses_what_cd_does_with_an_unlabelled_row(tmp_path, reading):
    """best (the committed table's reading) ranks A's samples by reward: the best one is the positive."""
    model, data = _model(tmp_path, "cd", f"task.unlabelled_loss={reading}")
    assert model.unlabelled_loss == reading
    lab = data.splits["train"]["labelled"]
    batch = model.trim(_batch(data, [int(lab.argmax()), int(lab.argmin())]))
    probs, _ = model.inference(model.infnet, batch)
    torch.manual_seed(1)
    samples = model.negatives(probs, batch).detach()
    loss = model.reward_cd(batch, samples)
    rewards = model.rewards(samples, batch)  # [K, B]
    gold = model.gold(batch)
    energies = model.energy(batch, torch.cat([gold.unsqueeze(0), samples]))
    labelled = cd_loss(energies[0, :1], energies[1:, :1], hamming_loss(samples[:, :1], gold[:1], batch["lengths"][:1]))
    torch.testing.assert_close(loss[0], labelled)  # the labelled row: the seed's CD against the gold, every reading
    unlab = model.energy(batch, samples)[:, 1]
    best = int(rewards[:, 1].argmax())
    gap = (rewards[best, 1] - rewards[:, 1]).unsqueeze(1)
    expected = {"best": cd_loss(unlab[best:best + 1], unlab.unsqueeze(1), gap),
                "pairs": reward_pair_loss(unlab.unsqueeze(1), rewards[:, 1:2]),
                "none": torch.zeros(1)}[reading]
    torch.testing.assert_close(loss[1:], expected.reshape(1))
    phi = model.energy_parameters()
    grads = torch.autograd.grad(loss[1], phi, allow_unused=True)
    moved = any(g is not None and bool(g.abs().sum() > 0) for g in grads)
    assert moved == (reading != "none")  # none: an unlabelled row gives E no gradient through L_CD


def test_an_unknown_unlabelled_loss_is_refused(tmp_path):
    with pytest.raises(Exception, match="unlabelled_loss"):
        _model(tmp_path, "cd", "task.unlabelled_loss=gold")


def test_dvn_targets_token_accuracy_on_labelled_rows_and_the_rule_value_on_unlabelled_ones(tmp_path):
    from latentstruct.data.citation_rules import value

    model, data = _model(tmp_path, "dvn")
    lab = data.splits["train"]["labelled"]
    batch = model.trim(_batch(data, [int(lab.argmax()), int(lab.argmin())]))
    y_bar, _ = model.inference(model.infnet, batch)
    target = model.value_target(y_bar, batch)
    gold_tags = batch["y"][0, : batch["lengths"][0]]
    accuracy = (y_bar[0, : batch["lengths"][0]] * torch.nn.functional.one_hot(gold_tags, 13)).sum() / gold_tags.numel()
    mask = (torch.arange(batch["x"].shape[1]) < batch["lengths"][1]).float()
    torch.testing.assert_close(target, torch.stack([accuracy, value(batch["cues"][1], y_bar[1].argmax(-1), mask)]))


def test_ge_is_zero_at_the_target_share_and_positive_elsewhere(tmp_path):
    from latentstruct.data.citation_rules import CUE_INDEX

    model, data = _model(tmp_path, "ge")
    lab = data.splits["train"]["labelled"]
    batch = model.trim(_batch(data, [int(lab.argmin())]))
    n = batch["x"].shape[1]
    cues = torch.zeros(1, n, batch["cues"].shape[-1])
    cues[0, 0, CUE_INDEX["first"]] = 1  # one cue, the first token → author
    batch = {**batch, "cues": cues}
    probs = torch.full((1, n, 13), 0.1 / 12)
    probs[..., 0] = 0.9
    assert float(model.ge_loss(batch, probs)) == pytest.approx(0, abs=1e-6)
    probs[..., 0], probs[..., 1] = 0.5, 0.5 - 0.1 / 12 * 11
    assert float(model.ge_loss(batch, probs)) == pytest.approx(0.9 * torch.log(torch.tensor(0.9 / 0.5)).item()
                                                               + 0.1 * torch.log(torch.tensor(0.1 / 0.5)).item(), 1e-4)
    batch["labelled"] = torch.ones(1)
    assert float(model.ge_loss(batch, probs)) == 0  # labelled citations get no GE term


@pytest.mark.parametrize("overrides", [["task.method=infnet", "cost_net=sequence_inference_net"],
                                       ["task.primary=ssvm"]])
def test_methods_that_need_gold_everywhere_are_refused(tmp_path, overrides):
    with pytest.raises(ValueError, match="needs a gold output on every citation"):
        _model(tmp_path, "cd", *overrides)


def test_the_task_refuses_other_data():
    with pytest.raises(ValueError, match="dataset=cora"):
        CitationEnergy.build({"vocab_size": 5, "num_tags": 3}, {}, None, None, None, None, {})


@pytest.mark.real_data("cora")
def test_real_cora_smoke_run(tmp_path, data_root):
    record = train(_compose("+experiment=citation_cd", f"paths.data_dir={data_root}", f"paths.output_dir={tmp_path}",
                            "trainer.progress=false", "trainer.threads=1", "dataset.labelled=5", *TINY_TASK,
                            "trainer.phases.0.epochs=1", "trainer.max_steps=18", "trainer.eval_every=18"))
    assert record["status"] == "completed" and record["steps"] == 18 and 0 <= record["metrics"]["test/acc"] <= 100
