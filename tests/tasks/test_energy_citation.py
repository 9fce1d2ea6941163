"""Semi-supervised citation field extraction (seed 004 Table 4): what each method reads of a labelled and of an
unlabelled citation, the reward-augmented CD and GE against hand computations, and every experiment through train.py
on generated Cora files."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from latentstruct.data.cora import cora_dataset
from latentstruct.models.energy import cd_loss, hamming_loss
from latentstruct.tasks.energy_citation import CitationEnergy
from latentstruct.train import build_model, train
from tests.data.test_cora import write_cora
from tests.helpers import compose as _compose
from tests.helpers import methods

EXPERIMENTS = methods("citation")
TINY_DATA = ["dataset.check_sizes=false", "dataset.n_test=6", "dataset.n_valid=4", "dataset.pool=6",
             "dataset.labelled=3"]
TINY_TASK = ["encoder.hidden=4", "embedding.dim=6", "task.neumann_terms=2", "task.spen_steps=2", "task.num_samples=3"]


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
    preset = _compose("+experiment=citation_cd", "+preset=citation_cpu")
    assert (preset.encoder.hidden, preset.task.neumann_terms, [p.epochs for p in preset.trainer.phases]) == (50, 5,
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


def test_the_reward_cd_of_an_unlabelled_row_ranks_the_samples_by_reward(tmp_path):
    model, data = _model(tmp_path, "cd")
    lab = data.splits["train"]["labelled"]
    batch = model.trim(_batch(data, [int(lab.argmax()), int(lab.argmin())]))
    probs, _ = model.inference(model.infnet, batch)
    torch.manual_seed(1)
    samples = model.negatives(probs, batch).detach()
    loss = model.reward_cd(batch, samples)
    rewards = model.rewards(samples, batch)  # [K, B]
    best = int(rewards[:, 1].argmax())
    energies = model.energy(batch, torch.cat([model.gold(batch).unsqueeze(0), samples]))
    expected_lab = cd_loss(energies[0, :1], energies[1:, :1],
                           hamming_loss(samples[:, :1], model.gold(batch)[:1], batch["lengths"][:1]))
    unlab = model.energy(batch, samples)[:, 1]
    expected_unlab = cd_loss(unlab[best:best + 1], unlab.unsqueeze(1), (rewards[best, 1] - rewards[:, 1]).unsqueeze(1))
    torch.testing.assert_close(loss, torch.stack([expected_lab, expected_unlab]))


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
