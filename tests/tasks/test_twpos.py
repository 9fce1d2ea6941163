"""Twitter POS tagging (seed 004 Table 9): the reader and the splits on generated files, the token-accuracy
evaluation of the sequence energy task, every experiment through train.py on dataset=twpos, the sweeps' and the
reduced presets' composition, and the shared copy's counts."""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path

import pytest
import torch

from latentstruct.data.conll import TAG_PAD
from latentstruct.data.twpos import TWPOS_SIZES, TWPOS_SPLITS, TWPOS_TAGS, read_tagged, twpos_dataset
from latentstruct.models.energy import BiLSTMFeatures, SequenceInferenceNet
from latentstruct.tasks.energy_ner import SequenceLabelEnergy
from latentstruct.train import train
from tests.helpers import compose as _compose
from tests.helpers import methods, write_data_file

EXPERIMENTS = methods("ner")


def write_twpos(root: Path, n: int = 12, seed: int = 0, gz: bool = False) -> Path:
    """Tiny Twitter POS files (``token<TAB>tag``, blank line after each tweet), ``n`` tweets per release file, under
    ``root/twpos``; returns ``root``."""
    rng = random.Random(seed)
    words = {"N": ["game", "day", "lol"], "V": ["got", "win", "is"], "O": ["I", "he"], "^": ["Lee", "Florida"],
             ",": [".", "!"], "@": ["@bob"], "#": ["#nlp"], "U": ["http://t.co"]}
    folder = root / "twpos"
    folder.mkdir(parents=True, exist_ok=True)
    for name in (n for names in TWPOS_SPLITS.values() for n in names):
        lines = []
        for _ in range(n):
            for _ in range(rng.randint(1, 6)):
                tag = rng.choice(sorted(words))
                lines.append(f"{rng.choice(words[tag])}\t{tag}")
            lines.append("")
        write_data_file(folder, name, "\n".join(lines) + "\n", gz)
    return root


def test_read_tagged_and_its_errors(tmp_path):
    path = tmp_path / "f"
    path.write_text("I\tO\nwon't\tV\n\n\nhello world\t!\n", encoding="utf-8")  # no blank line at the end
    assert read_tagged(path) == [(["I", "won't"], ["O", "V"]), (["hello world"], ["!"])]
    path.write_text("I\tO\nbroken line\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"f:2: expected 'token<TAB>tag'"):
        read_tagged(path)


@pytest.mark.parametrize("gz", [False, True])
def test_the_splits_concatenate_the_release_files(tmp_path, gz):
    root = write_twpos(tmp_path, n=5, gz=gz)
    data = twpos_dataset(root, check_sizes=False)
    expected = {split: sum(len(read_tagged(next((root / "twpos").glob(f"{name}*")))) for name in names)
                for split, names in TWPOS_SPLITS.items()}
    assert {split: data.size(split) for split in data.splits} == expected == {"train": 10, "valid": 5, "test": 5}
    train_tweets = [t for name in TWPOS_SPLITS["train"] for t in read_tagged(next((root / "twpos").glob(f"{name}*")))]
    split = data.splits["train"]
    for i, (tokens, tags) in enumerate(train_tweets):
        n = len(tokens)
        assert int(split["lengths"][i]) == n
        assert [TWPOS_TAGS[t] for t in split["y"][i, :n].tolist()] == tags
        assert (split["y"][i, n:] == TAG_PAD).all() and (split["x"][i, n:] == 0).all()
        assert split["x"][i, :n].tolist() == data.extras["vocab"].encode(tokens) and (split["x"][i, :n] > 1).all()
    assert data.dims["num_tags"] == 25 and data.extras["tag_names"] == list(TWPOS_TAGS)
    assert data.extras["metric"] == "token_acc"
    assert twpos_dataset(root, check_sizes=False, subset=3, eval_subset=2).size("test") == 2


def test_dataset_errors(tmp_path):
    root = write_twpos(tmp_path, n=3)
    with pytest.raises(ValueError, match="v0.3 release"):
        twpos_dataset(root)
    (root / "twpos" / "oct27.test").write_text("hi\tQQ\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"oct27\.test:1: tag 'QQ' is not in the Twitter tagset"):
        twpos_dataset(root, check_sizes=False)
    (root / "twpos" / "oct27.test").write_text("hi\tN\n", encoding="utf-8")
    (root / "twpos" / "daily547.conll").unlink()
    with pytest.raises(FileNotFoundError, match="daily547.conll"):
        twpos_dataset(root, check_sizes=False)


def _bilstm(metric: str) -> SequenceLabelEnergy:
    """The BiLSTM baseline (mbce) on 3 tags, built as its config builds it, scored by ``metric``."""
    extras = {"tag_names": ["N", "V", "O"], "metric": metric}
    return SequenceLabelEnergy.build({"vocab_size": 12, "num_tags": 3}, extras, None, SequenceInferenceNet, None,
                                     partial(BiLSTMFeatures, hidden=3), {"dim": 4, "freeze": True}, method="mbce")


def test_pos_evaluation_is_the_token_accuracy(monkeypatch):
    task = _bilstm("token_acc")
    gold = torch.tensor([[0, 1, 2], [2, TAG_PAD, TAG_PAD]])
    probs = torch.zeros(2, 3, 3)
    probs[0, torch.arange(3), torch.tensor([0, 2, 2])] = 0.4  # 2 of 3 right
    probs[1, 0, 2] = 0.4  # right; padding rows are 0
    data = {"x": torch.ones(2, 3, dtype=torch.long), "lengths": torch.tensor([3, 1]), "y": gold}
    monkeypatch.setattr(task, "predict", lambda batch: probs)
    metrics = task.evaluate(data, batch_size=2)
    assert metrics["acc"] == metrics["token_acc"] == pytest.approx(75.0)
    assert set(metrics) == {"acc", "token_acc", "infer_seconds"}
    with pytest.raises(ValueError, match="unknown metric"):
        _bilstm("f2")


@pytest.mark.slow
def test_every_experiment_runs_on_generated_twitter_pos(tmp_path):
    data_dir = write_twpos(tmp_path / "data", n=8)
    for experiment in EXPERIMENTS:
        out = tmp_path / experiment
        cfg = _compose(f"+experiment=ner_{experiment}", "dataset=twpos", "dataset.check_sizes=false",
                       f"paths.data_dir={data_dir}", f"paths.output_dir={out}", "trainer.batch_size=8",
                       "trainer.progress=false", "trainer.threads=1", "task.encoder.hidden=4", "embedding.dim=6",
                       "task.neumann_terms=2", "task.spen_steps=2", "task.num_samples=2", "+preset=pos_cpu",
                       "trainer.phases.0.epochs=1", "trainer.phases.1.epochs=1")
        record = train(cfg)
        assert record["status"] == "completed" and record["steps"] == 4  # 16 training tweets, 2 phases of 1 epoch
        assert set(record["metrics"]) == {f"{s}/{m}" for s in ("valid", "test")
                                          for m in ("acc", "token_acc", "infer_seconds")}
        assert 0 <= record["metrics"]["test/acc"] <= 100


def test_the_sweeps_and_the_reduced_presets_compose():
    pos = _compose("+sweep=energy_pos", hydra=True).hydra.sweeper.params
    ner = _compose("+sweep=energy_ner", hydra=True).hydra.sweeper.params
    assert pos["+experiment"] == ner["+experiment"] and pos["dataset"] == "twpos"
    # a preset given after the experiment wins over the experiment's schedule, for the one-phase baselines too
    for experiment in ("mbce", "crf", "cd"):
        ner_cpu = _compose(f"+experiment=ner_{experiment}", "+preset=ner_cpu")
        assert [p.epochs for p in ner_cpu.trainer.phases] == [3, 3] and ner_cpu.dataset.subset == 2000
        pos_cpu = _compose(f"+experiment=ner_{experiment}", "dataset=twpos", "+preset=pos_cpu")
        assert [p.epochs for p in pos_cpu.trainer.phases] == [10, 5] and pos_cpu.dataset.subset is None


@pytest.mark.real_data("twpos")
def test_real_twitter_pos_counts(data_root):
    data = twpos_dataset(data_root)
    assert {split: data.size(split) for split in data.splits} == TWPOS_SIZES
    tokens = {split: int(d["lengths"].sum()) for split, d in data.splits.items()}
    assert tokens == {"train": 14619 + 4823, "valid": 7152, "test": 7707}  # the MANIFEST's counts, daily547 counted
    assert len(torch.unique(data.splits["train"]["y"][data.splits["train"]["y"] != TAG_PAD])) == 25
