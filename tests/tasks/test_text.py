"""SST and SNLI through latent dependency trees (seed 001 §7.2): datasets for train.py, the two tasks, their
experiments and sweeps, tree statistics, show_trees, and a real-data SST smoke run."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
import torch

from latentstruct.config import ConfigError, check_command_line
from latentstruct.data.text import snli_dataset, sst_dataset
from latentstruct.records import REPORT_FILE
from latentstruct.report.drawing import depth, heads_from_arcs
from latentstruct.report.trees import find_sentence, load_trees
from latentstruct.report.trees import main as show_trees_main
from latentstruct.structures import NonProjectiveDepTree, ProjectiveDepTree
from latentstruct.tasks import LatentTreeNLI, LatentTreeSST
from latentstruct.tasks.text import tree_depths
from latentstruct.train import build_model
from tests.helpers import compose as _compose
from tests.helpers import final_model, methods, train_run

METHODS = ["baseline", "marginals", "sparsemap", "perturb_and_map", "ste_s", "ste_i", "spigot", "spigot_ce",
           "spigot_eg"]
WORDS = ["good", "bad", "movie", "film", "very", "not", "fun", "dull", "a", "the", "plot", "actors", "."]


def _sentences(n: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[rng.choice(WORDS) for _ in range(rng.randint(1, 9))] for _ in range(n)]


def _ptb(tokens: list[str], label: int) -> str:
    """A right-branching PTB tree over the tokens with the root label ``label``."""
    tree = f"(2 {tokens[-1]})"
    for tok in reversed(tokens[:-1]):
        tree = f"(2 (2 {tok}) {tree})"
    return f"({label}{tree[2:]}" if len(tokens) > 1 else f"({label} {tokens[0]})"


def write_sst(folder: Path, sizes=(40, 12, 12)) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for (name, n), seed in zip(zip(("train", "dev", "test"), sizes, strict=True), (1, 2, 3), strict=True):
        rng = random.Random(seed)
        lines = [_ptb(toks, rng.choice([0, 1, 2, 3, 4])) for toks in _sentences(n, seed)]
        (folder / f"{name}.txt.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return folder


def write_snli(folder: Path, splits=("train", "dev", "test"), n: int = 24) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    labels = ["entailment", "neutral", "contradiction", "-"]
    for seed, split in enumerate(splits):
        rng = random.Random(seed)
        pairs = zip(_sentences(n, 10 + seed), _sentences(n, 20 + seed), strict=True)
        lines = [json.dumps({"gold_label": rng.choice(labels), "sentence1": " ".join(a), "sentence2": " ".join(b)})
                 for a, b in pairs]
        (folder / f"snli_1.0_{split}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def write_glove(path: Path, words, dim: int = 4) -> Path:
    lines = [f"{w} " + " ".join(f"{0.1 * (i + 1) + j:.2f}" for j in range(dim)) for i, w in enumerate(words)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _local(tmp_path: Path) -> list[str]:
    """A run on the CPU reading the generated data in ``tmp_path / "data"``, its vectors cached beside it."""
    return ["trainer.device=cpu", f"paths.data_dir={tmp_path / 'data'}", f"embedding.cache_dir={tmp_path / 'cache'}"]


# --- tree statistics ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("structure", [ProjectiveDepTree(), NonProjectiveDepTree()], ids=["proj", "nonproj"])
def test_tree_depths_match_the_head_list_depth(structure):
    torch.manual_seed(0)
    lengths = torch.tensor([1, 4, 7, 7, 3, 6])
    z = structure.map(3 * torch.randn(len(lengths), 8, 8), lengths)
    expected = [depth(heads_from_arcs(z[b], int(n))) for b, n in enumerate(lengths)]
    assert tree_depths(z, lengths).tolist() == expected
    assert len(set(expected)) > 2  # the case is not trivial
    chain = torch.zeros(1, 5, 5)
    chain[0, torch.arange(4), torch.arange(1, 5)] = 1  # 0 → 1 → 2 → 3 → 4
    assert tree_depths(chain, torch.tensor([4])).tolist() == [4.0]


# --- datasets ------------------------------------------------------------------------------------------------------


def test_sst_dataset_tensors_vocab_and_glove(tmp_path):
    write_sst(tmp_path / "sst")
    glove = write_glove(tmp_path / "vectors.txt", ["movie", "good", "the"])
    data = sst_dataset(str(tmp_path), check_sizes=False, pretrained=str(glove), cache_dir=str(tmp_path / "cache"))
    train_split = data.splits["train"]
    assert train_split["x"].dtype == torch.int32 and set(train_split) == {"x", "lengths", "y"}
    assert set(train_split["y"].tolist()) <= {0, 1} and len(train_split["y"]) < 40  # neutral sentences dropped
    vocab, matrix = data.extras["vocab"], data.extras["embeddings"]
    assert data.dims == {"vocab_size": len(vocab), "num_classes": 2, "embedding_dim": 4}
    assert matrix.shape == (len(vocab), 4) and torch.allclose(matrix[vocab.stoi["good"]], torch.tensor(
        [0.2, 1.2, 2.2, 3.2]))
    assert not matrix[vocab.stoi["plot"]].any()  # no vector: zeros
    assert data.extras["embedding_source"].startswith("vectors.txt (3 of")
    first = train_split["x"][0, : train_split["lengths"][0]].tolist()
    assert all(0 < i < len(vocab) for i in first) and not train_split["x"][0, train_split["lengths"][0]:].any()
    # valid/test words outside the training vocabulary are <unk>; lower-casing and subsets
    small = sst_dataset(str(tmp_path), check_sizes=False, lowercase=True, subset=10, eval_subset=5)
    assert small.size("train") == 10 and small.size("valid") == 5 and small.extras["embeddings"] is None
    again = sst_dataset(str(tmp_path), check_sizes=False, lowercase=True, subset=10, eval_subset=5)
    assert torch.equal(small.splits["train"]["x"], again.splits["train"]["x"])
    with pytest.raises(FileNotFoundError, match="no file"):
        sst_dataset(str(tmp_path), check_sizes=False, pretrained="missing.txt")
    with pytest.raises(ValueError, match="official"):
        sst_dataset(str(tmp_path))


def test_snli_dataset_tensors_and_the_missing_training_split(tmp_path):
    write_snli(tmp_path / "snli")
    data = snli_dataset(str(tmp_path))
    split = data.splits["train"]
    assert set(split) == {"premise", "premise_lengths", "hypothesis", "hypothesis_lengths", "y"}
    assert data.dims["num_classes"] == 3 and set(split["y"].tolist()) <= {0, 1, 2}
    assert len(split["y"]) < 24  # gold label '-' dropped
    only_eval = write_snli(tmp_path / "eval_only" / "snli", splits=("dev", "test"))
    with pytest.raises(FileNotFoundError, match="train not found"):
        snli_dataset(str(only_eval.parent))


# --- models --------------------------------------------------------------------------------------------------------


def _trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_parameter_counts_match_table4():
    """With frozen 300d vectors: SST baseline ~150K, SST latent ~180K, SNLI baseline ~340K (seed 001 Table 4)."""
    dims = {"vocab_size": 50, "num_classes": 2, "embedding_dim": 300}
    extras = {"embeddings": torch.randn(50, 300)}
    sst_base = build_model(_compose("+experiment=sst_baseline"), dims, extras)
    sst_tree = build_model(_compose("+experiment=sst_spigot"), dims, extras)
    nli_base = build_model(_compose("+experiment=snli_baseline"), {**dims, "num_classes": 3}, extras)
    assert isinstance(sst_base, LatentTreeSST) and isinstance(nli_base, LatentTreeNLI)
    assert abs(_trainable(sst_base) - 150_000) / 150_000 < 0.02
    assert abs(_trainable(sst_tree) - 180_000) / 180_000 < 0.02
    assert abs(_trainable(nli_base) - 340_000) / 340_000 < 0.02
    assert not sst_tree.embedder.embedding.weight.requires_grad


def _sst_model(method: str = "spigot") -> LatentTreeSST:
    torch.manual_seed(0)
    dims = {"vocab_size": 30, "num_classes": 2, "embedding_dim": 0}
    tree = [] if method == "baseline" else ["task.scorer.hidden=5"]
    return build_model(_compose(f"+experiment=sst_{method}", "embedding.dim=8", "task.encoder.hidden=6", *tree,
                                "task.decoder.hidden=7"), dims, {})


@pytest.mark.parametrize("method", ["baseline", "marginals", "spigot"])
def test_sst_predictions_do_not_depend_on_the_rest_of_the_batch(method):
    model = _sst_model(method).eval()
    ids = torch.tensor([[3, 4, 5, 0, 0, 0], [6, 7, 8, 9, 10, 11]], dtype=torch.int32)
    batch = {"x": ids, "lengths": torch.tensor([3, 6]), "y": torch.tensor([0, 1])}
    alone = {"x": ids[:1, :3], "lengths": torch.tensor([3]), "y": torch.tensor([0])}
    torch.testing.assert_close(model(batch).logits[:1], model(alone).logits)


def test_sst_training_step_reaches_the_scorer_and_evaluation_uses_map():
    model = _sst_model("spigot").train()
    batch = {"x": torch.randint(2, 30, (4, 7), dtype=torch.int32), "lengths": torch.tensor([7, 3, 5, 1]),
             "y": torch.tensor([0, 1, 1, 0])}
    model(batch).loss.backward()
    assert model.scorer.head.weight.grad.abs().sum() > 0 and model.embedder.embedding.weight.grad is not None
    assert model.estimator.eval_latent == "map"
    metrics = model.evaluate(batch, batch_size=2)
    assert set(metrics) == {"loss", "acc", "depth"} and 1 <= metrics["depth"] <= 7


@pytest.mark.parametrize("method", ["spigot", "direct", "marginals"])
def test_nli_both_trees_get_a_gradient(method):
    torch.manual_seed(0)
    experiment = "snli_marginals" if method == "direct" else f"snli_{method}"
    cfg = _compose(f"+experiment={experiment}", "embedding.dim=8", "task.decoder.hidden=6", "task.scorer.hidden=5",
                   *(["estimator=direct"] if method == "direct" else []))
    model = build_model(cfg, {"vocab_size": 30, "num_classes": 3, "embedding_dim": 0}, {}).train()
    batch = {"premise": torch.randint(2, 30, (3, 6), dtype=torch.int32), "premise_lengths": torch.tensor([6, 2, 4]),
             "hypothesis": torch.randint(2, 30, (3, 5), dtype=torch.int32),
             "hypothesis_lengths": torch.tensor([1, 5, 3]), "y": torch.tensor([0, 1, 2])}
    model(batch).loss.backward()
    assert model.scorer.head.weight.grad.abs().sum() > 0
    metrics = model.evaluate(batch)
    assert set(metrics) == {"loss", "acc", "depth"} and metrics["depth"] >= 1


@pytest.mark.parametrize("overrides, error", [
    # every part of SST is read: a part of the wrong kind is refused at validation (its Part in build), not ignored
    (["+experiment=sst_spigot", "decoder=linear", "scorer=linear"],
     "takes as scorer ArcScorer, not latentstruct.models.scorers.Linear"),
    (["+experiment=sst_spigot", "decoder=linear"],
     "takes as decoder SSTDecoder or BaselineSST, not latentstruct.models.decoders.Linear"),
    (["+experiment=sst_spigot", "encoder=identity"], "takes as encoder BiLSTMEncoder, not"),
    (["task=sst", "structure=categorical"], "takes as structure ProjectiveDepTree or NonProjective"),  # (the
    # experiments' tree settings already refuse it at composition)
    (["+experiment=sst_spigot", "decoder=baseline_sst"], "latent=predicted takes as decoder SSTDecoder, not"),
    (["+experiment=sst_baseline", "decoder=sst"], "latent=none takes as decoder BaselineSST, not"),
    # the baseline has no tree part, a tree model all three
    (["+experiment=sst_spigot", "latent=none"], "latent=none \\(the baseline\\) has no tree, but scorer="),
    (["+experiment=sst_baseline", "estimator=spigot"], "has no tree, but estimator=latentstruct.estimators"),
    (["+experiment=sst_spigot", "~scorer"], "latent=predicted goes through a tree and needs a scorer"),
    (["+experiment=sst_spigot", "latent=gold"], "SST has no gold latent trees"),
    (["+experiment=snli_spigot", "decoder=sst"], "takes as decoder DecomposableAttention, not"),
    (["+experiment=snli_spigot", "scorer=linear"], "takes as scorer ArcScorer, not"),
    (["+experiment=snli_baseline", "scorer=arc"], "has no tree, but scorer="),
    (["+experiment=snli_spigot", "~scorer"], "needs a scorer"),
])
def test_a_part_that_does_not_fit_is_refused(overrides, error):
    """``+experiment=sst_spigot decoder=linear scorer=linear`` used to train the SST model as if they were not set."""
    dims = {"vocab_size": 30, "num_classes": 3 if "snli" in overrides[0] else 2, "embedding_dim": 0}
    with pytest.raises(ValueError, match=error):
        build_model(_compose(*overrides, "embedding.dim=8"), dims, {})


def test_a_part_the_task_does_not_take_is_refused():
    """SNLI reads no encoder: ``+encoder=bilstm`` is not a field of its task's schema."""
    with pytest.raises(ConfigError, match=r"^task LatentTreeNLI takes no encoder \(its parts: scorer, structure, "
                                          r"estimator, decoder\)"):
        check_command_line(["+experiment=snli_spigot", "+encoder=bilstm"])


# --- configs -------------------------------------------------------------------------------------------------------

TABLE4 = {"sst": {"baseline": (2e-5, None), "marginals": (1e-4, None), "sparsemap": (5e-5, None),
                  "perturb_and_map": (5e-5, None), "ste_s": (5e-5, None), "ste_i": (1e-4, None),
                  "spigot": (1e-4, 0.1), "spigot_ce": (5e-5, 0.1), "spigot_eg": (5e-5, 0.1)},
          "snli": {"baseline": (1e-4, None), "marginals": (1e-4, None), "sparsemap": (3e-4, None),
                   "perturb_and_map": (1e-4, None), "ste_s": (3e-4, None), "ste_i": (1e-4, None),
                   "spigot": (3e-4, 1.0), "spigot_ce": (1e-4, 0.1), "spigot_eg": (1e-4, 0.001)}}


@pytest.mark.parametrize("task", ["sst", "snli"])
def test_experiments_carry_table4_settings(task):
    batch, structure, eval_latent = {"sst": (32, "ProjectiveDepTree", "map"),
                                     "snli": (64, "NonProjectiveDepTree", "relaxed")}[task]
    decoders = {"sst": ("SSTDecoder", "BaselineSST"), "snli": ("DecomposableAttention",) * 2}[task]  # tree, baseline
    for method, (lr, eta) in TABLE4[task].items():
        cfg = _compose(f"+experiment={task}_{method}")
        assert (cfg.optim._target_, cfg.optim.lr, cfg.trainer.batch_size, cfg.trainer.max_epochs) == (
            "torch.optim.AdamW", lr, batch, 40)
        assert cfg.trainer.select.value == "best"
        assert cfg.latent.value == ("none" if method == "baseline" else "predicted")
        assert cfg.task.decoder._target_.endswith(decoders[method == "baseline"])
        if method == "baseline":  # no tree
            assert cfg.task.scorer is None and cfg.task.structure is None and cfg.task.estimator is None
            continue
        assert cfg.task.structure._target_.endswith(structure) and cfg.task.structure.multiroot
        assert cfg.task.structure.sparsemap_max_iter == 50 and cfg.task.scorer._target_.endswith("ArcScorer")
        assert eta is None or cfg.task.estimator.eta == eta
        assert cfg.task.estimator.eval_latent == eval_latent
    assert _compose(f"+experiment={task}_baseline").task.decoder.dropout == (0.0 if task == "sst" else 0.2)


def test_sweeps_compose_the_table_and_the_grids():
    for name, count in (("spigot_sst", 9), ("spigot_snli", 9), ("spigot_sst_grid", 6),
                        ("spigot_sst_grid_eta", 3), ("spigot_snli_grid", 6), ("spigot_snli_grid_eta", 3)):
        params = _compose(f"+sweep={name}", hydra=True).hydra.sweeper.params
        assert len(params["+experiment"].split(",")) == count, name
    for task in ("sst", "snli"):  # the shared fragments are root-level configs, not experiments
        assert methods(task) == sorted(METHODS)


# --- end to end ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_every_sst_experiment_trains_on_generated_trees(tmp_path, method):
    write_sst(tmp_path / "data" / "sst")
    record = train_run(tmp_path, *_local(tmp_path), f"+experiment=sst_{method}", "dataset.check_sizes=false",
                       "trainer.max_steps=2", "trainer.eval_every=2", "trainer.batch_size=8", "embedding.dim=8",
                       "task.encoder.hidden=6")
    assert record["status"] == "completed" and record["seconds_per_epoch"] > 0
    assert ("test/depth" in record["metrics"]) == (method != "baseline")


@pytest.mark.parametrize("method", ["baseline", "marginals", "spigot_eg", "perturb_and_map"])
def test_snli_experiments_train_on_generated_pairs(tmp_path, method):
    write_snli(tmp_path / "data" / "snli")
    glove = write_glove(tmp_path / "data" / "vectors.txt", WORDS[:6], dim=6)
    record = train_run(tmp_path, *_local(tmp_path), f"+experiment=snli_{method}", "trainer.max_steps=2",
                       "trainer.eval_every=2", "trainer.batch_size=8", f"embedding.pretrained={glove.name}",
                       "task.decoder.hidden=6", *([] if method == "baseline" else ["task.scorer.hidden=4"]))
    assert record["status"] == "completed" and 0 <= record["metrics"]["test/acc"] <= 100


def test_the_run_records_the_map_trees_that_show_trees_prints_and_draws(tmp_path, capsys):
    """report.json holds every test sentence's MAP tree of the final model (the checkpoint's, parsed again here);
    report.trees finds a sentence among them (an <unk> matching any word) and draws it, without the model."""
    write_sst(tmp_path / "data" / "sst")
    train_run(tmp_path, *_local(tmp_path), "+experiment=sst_spigot_ce", "dataset.check_sizes=false",
              "trainer.max_steps=2", "trainer.batch_size=8", "embedding.dim=8", "task.encoder.hidden=6")
    sentences = load_trees(tmp_path / "run")
    model, data = final_model(tmp_path / "run")
    test = data.splits["test"]
    assert len(sentences) == len({tuple(ids[:n].tolist()) for ids, n in zip(test["x"], test["lengths"], strict=True)})
    for b, entry in enumerate(sentences[:4]):
        n = int(test["lengths"][b])
        assert entry["words"] == [data.extras["vocab"].itos[i] for i in test["x"][b, :n].tolist()]
        z = model.parse(test["x"][b : b + 1], test["lengths"][b : b + 1])[0]
        assert entry["heads"] == heads_from_arcs(z, n)
    entry = sentences[2]
    words = entry["words"]
    tokens, heads, unknown = find_sentence(sentences, " ".join(words).upper())  # case aside
    assert [t.lower() for t in tokens] == words and heads == entry["heads"] and unknown == []
    unk = [{"words": ["a", "<unk>", "movie"], "heads": [3, 3, 0]}]
    assert find_sentence(unk, "A zzz movie") == (["A", "zzz", "movie"], [3, 3, 0], ["zzz"])  # <unk>: any word
    with pytest.raises(ValueError, match="not among the"):
        find_sentence(sentences, "a sentence no run has parsed")
    out = tmp_path / "tree.png"
    capsys.readouterr()  # drop the training printout
    assert show_trees_main([str(tmp_path / "run"), " ".join(words), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("ROOT") and f"depth {depth(heads)}" in printed and out.stat().st_size > 0


def test_show_trees_refuses_the_baseline(tmp_path):
    write_sst(tmp_path / "data" / "sst")
    train_run(tmp_path, *_local(tmp_path), "+experiment=sst_baseline", "dataset.check_sizes=false",
              "trainer.max_steps=1", "trainer.batch_size=8", "embedding.dim=8", "task.encoder.hidden=6")
    assert not (tmp_path / "run" / REPORT_FILE).exists()  # no latent tree: nothing to draw
    with pytest.raises(FileNotFoundError, match="latent-tree run"):
        load_trees(tmp_path / "run")


@pytest.mark.real_data("sst")
def test_real_sst_smoke_run(tmp_path, data_root):
    """The real SST files end to end: 64 training sentences, one epoch of SPIGOT, 64 valid / test sentences, with the
    shared GloVe 6B subset (frozen, lower-cased), then a tree of the trained model."""
    glove = data_root / "glove" / "glove.6B-top2717.100d.sst_conll_snli.txt.xz"
    record = train_run(tmp_path, "+experiment=sst_spigot", "dataset.subset=64", "dataset.eval_subset=64",
                       "trainer.max_epochs=1", "trainer.device=cpu", f"paths.data_dir={data_root}",
                       f"embedding.cache_dir={tmp_path / 'cache'}", "embedding.lowercase=true",
                       *([f"embedding.pretrained={glove}"] if glove.is_file() else []))
    assert record["status"] == "completed" and record["steps"] == 2
    assert 0 <= record["metrics"]["test/acc"] <= 100 and record["metrics"]["test/depth"] >= 1
    sentences = load_trees(tmp_path / "run")  # the trees of the 64 test sentences, lower-cased words
    assert len(sentences) == 64 and all(len(s["words"]) == len(s["heads"]) for s in sentences)
    assert all(w == w.lower() for s in sentences for w in s["words"])
