"""The ListOps task (issue #7): every experiment trains end to end on tiny generated data, the tree metrics, the
chart's MAP and the oracle reproduce the true trees, gradients reach every parser, PPO's wiring, padding
invariance, the configs and the sweep, and a smoke run on the official test file when it is available."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException

import latentstruct.data.listops as listops_data
from latentstruct.config import ConfigError, validate
from latentstruct.data.listops import (
    generate,
    left_branching,
    listops_dataset,
    right_branching,
    spans_to_trees,
    tree_depth,
    tree_f1,
)
from latentstruct.structures import BinaryTree
from latentstruct.tasks import ListOps
from latentstruct.tasks.listops import tree_scores
from latentstruct.train import build_model
from tests.helpers import compose as _compose
from tests.helpers import methods, train_run

EXPERIMENTS = methods("listops")
TREE_EXPERIMENTS = [e for e in EXPERIMENTS if e not in ("lstm", "gold")]
SMALL = ["task.word_dim=8", "task.hidden=8", "task.mlp_hidden=8", "task.scorer_hidden=8", "task.span_hidden=6"]
TREE_METRICS = {"tree_f1", "f1_left", "f1_right", "depth"}


def write_listops(folder: Path, n: int = 12, seed: int = 7) -> Path:
    """A tiny ``test_d20s.tsv`` in the official ``label<TAB>expression`` format (short expressions)."""
    folder.mkdir(parents=True, exist_ok=True)
    examples = generate(n, seed, max_depth=3, leaf_prob=0.4, max_args=3)
    (folder / "test_d20s.tsv").write_text("".join(f"{label}\t{' '.join(toks)}\n" for toks, label in examples))
    return folder


@pytest.fixture
def short(monkeypatch):
    """Generated train / valid expressions kept short (operators nest ≤ 2 deep, ≤ 3 arguments): fast charts."""
    monkeypatch.setattr(listops_data, "generate",
                        functools.partial(generate, max_depth=3, leaf_prob=0.4, max_args=3))


@pytest.fixture
def data(tmp_path, short):
    write_listops(tmp_path / "listops")
    return listops_dataset(str(tmp_path), n_train=16, n_valid=6)


def _model(experiment: str, *overrides: str, seed: int = 0) -> ListOps:
    torch.manual_seed(seed)
    cfg = _compose(f"+experiment=listops_{experiment}", *SMALL, *overrides)
    return build_model(cfg, {"vocab_size": 16, "num_classes": 10}, {})


def _run(tmp_path: Path, experiment: str, *overrides: str) -> dict:
    """Two steps of ``listops_<experiment>`` at the SMALL sizes on expressions generated into ``tmp_path / "data"``."""
    write_listops(tmp_path / "data" / "listops")
    return train_run(tmp_path, f"+experiment=listops_{experiment}", *SMALL, "dataset.n_train=16", "dataset.n_valid=6",
                     "trainer.max_steps=2", "trainer.eval_every=2", "trainer.batch_size=8", "trainer.device=cpu",
                     f"paths.data_dir={tmp_path / 'data'}", *overrides)


# --- end to end ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_listops_experiment_trains_on_generated_expressions(tmp_path, short, experiment):
    record = _run(tmp_path, experiment)
    assert record["status"] == "completed" and record["steps"] == 2
    metrics = record["metrics"]
    assert 0 <= metrics["test/acc"] <= 100 and metrics["test/loss"] > 0
    has_trees = {key.split("/", 1)[1] for key in metrics if key.startswith("test/")} >= TREE_METRICS
    assert has_trees == (experiment != "lstm")
    if experiment == "gold":
        assert metrics["test/tree_f1"] == metrics["valid/tree_f1"] == 100.0
    if has_trees:
        assert 0 <= metrics["test/tree_f1"] <= 100 and metrics["test/depth"] >= 0


# --- metrics -------------------------------------------------------------------------------------------------------


def test_tree_scores_match_the_reference_metrics():
    torch.manual_seed(0)
    lengths = torch.tensor([1, 2, 3, 5, 8, 8, 6, 4])
    structure = BinaryTree()
    pred = structure.map(torch.randn(8, 8, 8), lengths)
    gold = structure.map(torch.randn(8, 8, 8), lengths)
    scores = tree_scores(pred, gold, lengths)
    for b, n in enumerate(lengths.tolist()):
        p, g = pred[b, :n, :n], gold[b, :n, :n]
        assert scores["tree_f1"][b].item() == pytest.approx(tree_f1(p, g))
        assert scores["f1_left"][b].item() == pytest.approx(tree_f1(p, left_branching(n)))
        assert scores["f1_right"][b].item() == pytest.approx(tree_f1(p, right_branching(n)))
        assert scores["depth"][b].item() == tree_depth(p)
    assert len(set(scores["tree_f1"].tolist())) > 2  # not a trivial case


def test_evaluation_does_not_depend_on_the_length_buckets(data):
    model = _model("chart_spigot").eval()
    test = data.splits["test"]
    one_by_one = ListOps.evaluate(model, test, batch_size=1)
    model.eval_max_cells = 10**9
    whole = model.evaluate(test)
    assert one_by_one.keys() == whole.keys() >= TREE_METRICS | {"acc", "loss"}
    for key in whole:
        assert one_by_one[key] == pytest.approx(whole[key], abs=1e-4)


# --- trees ---------------------------------------------------------------------------------------------------------


def _gold_lookup(split: dict[str, torch.Tensor]) -> dict[tuple[int, ...], torch.Tensor]:
    table = {}
    for b, n in enumerate(split["lengths"].tolist()):
        table[tuple(split["x"][b, :n].tolist())] = spans_to_trees(split["spans"][b : b + 1], n)[0]
    return table


def test_chart_map_reproduces_the_true_tree_when_the_scores_favour_it(data):
    test = data.splits["test"]
    table = _gold_lookup(test)
    model = _model("chart_spigot").eval()

    def favour_gold(ids, lengths):
        scores = torch.full(ids.shape + ids.shape[-1:], -2.0)
        for b, n in enumerate(lengths.tolist()):
            scores[b, :n, :n] += 4 * table[tuple(ids[b, :n].tolist())]
        return scores

    model.span_scores = favour_gold
    metrics = model.evaluate(test, batch_size=5)
    gold = [spans_to_trees(test["spans"][b : b + 1], n)[0] for b, n in enumerate(test["lengths"].tolist())]
    assert metrics["tree_f1"] == 100.0
    assert metrics["depth"] == pytest.approx(sum(tree_depth(g) for g in gold) / len(gold))
    left = sum(tree_f1(g, left_branching(g.shape[0])) for g in gold) / len(gold)
    assert metrics["f1_left"] == pytest.approx(left)
    assert max(test["lengths"].tolist()) >= 6  # the case is not trivial


@pytest.mark.parametrize("experiment", ["chart_marginals", "gumbel_tree", "ppo"])
def test_the_oracle_composes_along_the_true_trees(data, experiment):
    model = _model(experiment, "latent=gold")
    assert model.scorer is None and model.behaviour is None  # no parser is built
    test = data.splits["test"]
    batch = {k: v[:6] for k, v in test.items()}
    n = int(batch["lengths"].max())
    torch.testing.assert_close(model.trees(batch), spans_to_trees(batch["spans"], n), rtol=0, atol=0)
    assert model.evaluate(test, batch_size=4)["tree_f1"] == 100.0


def test_the_given_merges_and_the_chart_compose_the_true_tree_alike(data):
    """The oracle through the chart Tree-LSTM and through the merge parser's replay give the same logits when they
    share the cell, the embeddings and the classifier."""
    chart, merge = _model("chart_marginals", "latent=gold"), _model("gumbel_tree", "latent=gold")
    merge.embedding.load_state_dict(chart.embedding.state_dict())
    merge.classifier.load_state_dict(chart.classifier.state_dict())
    merge.parser.cell.load_state_dict(chart.composer.cell.state_dict())
    batch = {k: v[:8] for k, v in data.splits["test"].items()}
    torch.testing.assert_close(merge.eval()(batch).logits, chart.eval()(batch).logits)


# --- gradients -----------------------------------------------------------------------------------------------------


def _parser_grad(model: ListOps) -> float:
    module = model.scorer if model.kind == "chart" else model.parser
    return sum(float(p.grad.abs().sum()) for p in module.parameters() if p.grad is not None)


@pytest.mark.parametrize("experiment", TREE_EXPERIMENTS)
def test_gradients_reach_the_parser_and_the_composer(data, experiment):
    # A large pull-back step: with η = 1 the SPIGOT projection of a point this close to ẑ may be ẑ itself (a zero
    # gradient, which is correct); the baseline-free variant keeps the REINFORCE advantage away from 0.
    extra = ["task.estimator.eta=1000"] if experiment.startswith(("chart_spigot", "chart_ste")) else []
    extra += ["task.estimator.baseline=none"] if experiment in ("reinforce_self_critical", "ppo") else []
    model = _model(experiment, *extra).train()
    batch = {k: v[:8] for k, v in data.splits["train"].items()}
    model(batch).loss.backward()
    assert _parser_grad(model) > 0
    composer = model.composer if model.composer is not None else model.parser
    assert sum(float(p.grad.abs().sum()) for p in composer.cell.parameters() if p.grad is not None) > 0
    assert model.classifier[-1].weight.grad.abs().sum() > 0
    if model.behaviour is not None:
        assert all(p.grad is None for p in model.behaviour.parameters())


def test_ppo_with_a_fresh_behaviour_policy_has_the_reinforce_gradient(data):
    """ρ = 1 when the behaviour policy is the current one: PPO's gradient is REINFORCE's on the same sample."""
    common = ["task.estimator.baseline=none", "task.estimator.normalize_advantage=false",
              "task.estimator.entropy_weight=0.01"]
    ppo = _model("ppo", *common, "task.estimator.refresh=1").train()
    reinforce = _model("reinforce", *common, "task.disjoint=true").train()
    missing, unexpected = reinforce.load_state_dict(ppo.state_dict(), strict=False)
    assert not missing and all(k.startswith(("behaviour.", "ppo_steps")) for k in unexpected)
    batch = {k: v[:8] for k, v in data.splits["train"].items()}
    for model in (ppo, reinforce):
        torch.manual_seed(5)  # the same Gumbel noise, hence the same sampled merges
        model(batch).loss.backward()
    theirs = dict(reinforce.named_parameters())
    ours = {name: p for name, p in ppo.named_parameters() if not name.startswith("behaviour.")}
    assert ours.keys() == theirs.keys()
    for name, p in ours.items():
        assert (p.grad is None) == (theirs[name].grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, theirs[name].grad, msg=name)


def test_reinforce_takes_its_control_variate_from_the_estimator(data):
    """The merge parser's REINFORCE is estimator=sfe: the moving average of the losses lives in the estimator (its
    buffer is saved with the model), starts at the first batch's mean CE, and the advantage is CE − b."""
    model = _model("reinforce", "task.estimator.decay=0.5").train()
    assert "estimator.running_loss" in model.state_dict()
    batch = {k: v[:8] for k, v in data.splits["train"].items()}
    torch.manual_seed(3)
    model(batch)
    torch.manual_seed(3)
    parse = model.parser(model.embedding(batch["x"][:, : int(batch["lengths"].max())].long()),
                         batch["lengths"].long(), mode="sample")
    ce = torch.nn.functional.cross_entropy(model.classifier(parse.h), batch["y"], reduction="none").detach()
    torch.testing.assert_close(model.estimator.running_loss, ce.mean())  # b_1 = mean CE, then 0.5 b + 0.5 mean
    model.estimator.running_loss.fill_(0.25)
    torch.manual_seed(3)
    loss = model(batch).loss  # the same sample: CE + mean_b (CE_b − 0.25) Σ_t log π
    torch.testing.assert_close(loss, ce.mean() + ((ce - 0.25) * parse.log_prob).mean())


def test_ppo_behaviour_policy_lags_and_is_refreshed(data):
    model = _model("ppo", "task.estimator.refresh=2").train()
    groups = model.param_groups()
    assert set(groups) == {"default", "policy"}
    ids = [{id(p) for p in g} for g in groups.values()]
    assert not ids[0] & ids[1] and not (ids[0] | ids[1]) & {id(p) for p in model.behaviour.parameters()}
    assert ids[0] | ids[1] == {id(p) for p in model.parameters() if p.requires_grad}
    optimizer = torch.optim.SGD([p for g in groups.values() for p in g], lr=0.5)
    batch = {k: v[:8] for k, v in data.splits["train"].items()}

    def same() -> bool:
        return torch.equal(model.behaviour["parser"].query, model.parser.query)

    history = []
    for _ in range(4):
        optimizer.zero_grad()
        model(batch).loss.backward()
        history.append(same())  # right after the forward (which may refresh)
        optimizer.step()
    assert history == [True, False, True, False] and int(model.ppo_steps) == 4


# --- padding -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("experiment", ["lstm", "chart_spigot", "chart_marginals", "gumbel_tree", "ppo"])
def test_predictions_do_not_depend_on_the_rest_of_the_batch(data, experiment):
    model = _model(experiment).eval()
    split = data.splits["test"]
    order = split["lengths"].argsort()
    short_i, long_i = int(order[len(order) // 2]), int(order[-1])
    assert split["lengths"][short_i] < split["lengths"][long_i]
    both = {k: v[[short_i, long_i]] for k, v in split.items()}
    alone = {k: v[[short_i]] for k, v in split.items()}
    out_both, out_alone = model(both), model(alone)
    torch.testing.assert_close(out_both.logits[:1], out_alone.logits)
    if out_alone.tree is not None:
        n = out_alone.tree.shape[-1]
        torch.testing.assert_close(out_both.tree[:1, :n, :n], out_alone.tree)


# --- configs -------------------------------------------------------------------------------------------------------


def test_dataset_and_task_configs_compose():
    cfg = _compose("dataset=listops", "task=listops")
    assert cfg.dataset._target_ == "latentstruct.data.listops.listops_dataset"
    assert (cfg.dataset.n_train, cfg.dataset.n_valid, cfg.dataset.seed, cfg.dataset.max_train_tokens) == (
        90000, 1000, 42, 130)
    assert cfg.dataset.folder == "listops" and cfg.dataset.subset is None
    assert cfg.task._target_ == "latentstruct.tasks.ListOps" and "method" not in cfg.task
    assert (cfg.task.word_dim, cfg.task.hidden) == (128, 128)
    # the task's own option is the Gumbel Tree-LSTM: the merge parser with st_gumbel at every merge
    assert cfg.task.scorer._target_.endswith(".MergeParser") and cfg.task.estimator._target_.endswith(".StGumbel")
    assert cfg.task.structure is None and cfg.task.composer is None
    with pytest.raises(ConfigError, match="baseline"):
        validate(_compose("+experiment=listops_reinforce", "task.estimator.baseline=learned"))
    with pytest.raises(ConfigError, match="method"):
        validate(_compose("task=listops", "+task.method=lstm"))  # the parts choose the model, not a string


def _choice(cfg, group: str) -> str | None:
    return None if cfg.task[group] is None else cfg.task[group]._target_.rsplit(".", 1)[1]


def test_experiments_carry_their_settings():
    """Each experiment is a choice of parts (scorer × structure × estimator × composer), the method chosen one way."""
    parts = ("scorer", "structure", "estimator", "composer")
    merge = ("MergeParser", None)
    expected = {
        "lstm": (None, None, None, "SequenceLSTM"),
        "gold": (*merge, None, None),
        "gumbel_tree": (*merge, "StGumbel", None),
        "reinforce": (*merge, "Sfe", None),
        "reinforce_none": (*merge, "Sfe", None),
        "reinforce_self_critical": (*merge, "Sfe", None),
        "ppo": (*merge, "Ppo", None),
    }
    for experiment in EXPERIMENTS:
        cfg = _compose(f"+experiment=listops_{experiment}")
        assert (cfg.optim._target_, cfg.optim.lr, cfg.trainer.batch_size) == ("torch.optim.Adam", 1e-3, 128)
        assert cfg.trainer.select.value == "best" and cfg.task._target_ == "latentstruct.tasks.ListOps"
        model = "chart_parser" if experiment.startswith("chart_") else "merge_parser"
        assert cfg.task.model == ("lstm" if experiment == "lstm" else model), experiment  # not read from null parts
        chosen = tuple(_choice(cfg, g) for g in parts)
        if experiment.startswith("chart_"):
            estimator = experiment.removeprefix("chart_")
            assert chosen[:2] + chosen[3:] == ("SpanScorer", "BinaryTree", "ChartTreeLSTM")
            assert chosen[2].lower() == estimator.replace("_", "") and cfg.task.composer.checkpoint
        else:
            assert chosen == expected[experiment], experiment
        validate(cfg)
    ppo = _compose("+experiment=listops_ppo")
    est = ppo.task.estimator
    assert ppo.task.disjoint and (est.baseline, est.normalize_advantage) == ("self_critical", True)
    assert (est.clip, est.refresh, est.entropy_weight) == (0.2, 15, 1e-4)
    baselines = {e: _compose(f"+experiment=listops_{e}").task.estimator.baseline
                 for e in ("reinforce", "reinforce_self_critical", "reinforce_none")}
    assert baselines == {"reinforce": "moving_average", "reinforce_self_critical": "self_critical",
                         "reinforce_none": "none"}
    assert _compose("+experiment=listops_lstm").latent.value == "none"
    assert _compose("+experiment=listops_gold").latent.value == "gold"
    # the shared fragments are root-level configs, not experiments
    assert not {"common", "chart_common"} & set(EXPERIMENTS)
    with pytest.raises(ConfigCompositionException):
        _compose("+experiment=listops/common")


def test_sweeps_cover_every_experiment_and_three_seeds():
    experiments = []
    for sweep in ("listops", "listops_chart"):
        cfg = _compose(f"+sweep={sweep}", hydra=True)
        params = cfg.hydra.sweeper.params
        experiments += params["+experiment"].split(",")
        assert params["trainer.seed"] == "301,302,303"
        assert cfg.hydra.sweep.dir.endswith("/listops")  # one directory for the table
    assert sorted(experiments) == sorted(f"listops_{e}" for e in EXPERIMENTS)


def test_invalid_combinations_are_refused(data):
    with pytest.raises(ValueError, match="takes as structure BinaryTree, not latentstruct.structures.Categorical"):
        _model("chart_spigot", "structure=categorical")
    with pytest.raises(ValueError, match="task.model=chart_parser takes composer=chart_tree_lstm, got None"):
        _model("gumbel_tree", "task.model=chart_parser")  # the model is chosen by task.model, its parts must fit it
    with pytest.raises(ValueError, match="task.model=merge_parser takes no composer"):
        _model("chart_spigot", "task.model=merge_parser")
    with pytest.raises(ValueError, match="latent=none"):
        _model("gumbel_tree", "latent=none")
    with pytest.raises(ValueError, match="latent=none"):
        _model("lstm", "latent=predicted")
    with pytest.raises(ValueError, match="disjoint"):
        _model("gumbel_tree", "task.disjoint=true")
    with pytest.raises(ValueError, match="dataset=listops"):
        build_model(_compose("+experiment=listops_lstm"), {"input_dim": 3, "num_classes": 2}, {})
    with pytest.raises(ValueError, match="structure=null"):
        _model("reinforce", "structure=binary_tree")
    with pytest.raises(ValueError, match="no tree"):
        _model("lstm", "scorer=merge_parser")
    with pytest.raises(ValueError, match="merge_parser"):
        _model("gumbel_tree", "scorer=span_scorer")
    with pytest.raises(ValueError, match="ppo"):  # PPO needs a behaviour policy: the chart has none
        _model("chart_spigot", "estimator=ppo").train()({k: v[:4] for k, v in data.splits["train"].items()})


@pytest.mark.parametrize("group, option", [("encoder", "identity"), ("decoder", "linear")])
def test_a_part_group_listops_does_not_read_is_refused(group, option):
    """The ListOps models are built from scorer, structure, estimator and composer; an encoder or decoder override
    is an error, not a silent no-op: at composition (the task's option has no such group; added with +, its schema
    has no such part)."""
    with pytest.raises(ConfigCompositionException, match=group):
        _model("gumbel_tree", f"{group}={option}")
    with pytest.raises(ConfigCompositionException, match=f"Key '{group}' not in 'ListOpsConf'"):
        _model("gumbel_tree", f"+{group}={option}")


# --- real data -----------------------------------------------------------------------------------------------------


@pytest.mark.real_data("listops")
def test_real_listops_smoke_run(tmp_path, data_root):
    """The official test file end to end with the LSTM (10,000 expressions of up to 939 tokens, in length buckets)."""
    record = train_run(tmp_path, "+experiment=listops_lstm", *SMALL, "dataset.n_train=40", "dataset.n_valid=8",
                       "trainer.max_steps=1", "trainer.batch_size=32", "trainer.device=cpu",
                       f"paths.data_dir={data_root}")
    assert record["status"] == "completed" and 0 <= record["metrics"]["test/acc"] <= 100
