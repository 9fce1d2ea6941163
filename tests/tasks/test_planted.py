"""Planted-structure tasks (issue #22): the generator (latentstruct/data/planted.py) and a few steps of every one."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from latentstruct.data.planted import (
    STRUCTURES,
    calibrate,
    make_structure,
    move,
    part_shape,
    planted_structure,
    read_out,
)
from latentstruct.models.decoders import KnownReadout
from latentstruct.tasks.classification import recovery_metrics
from latentstruct.train import train
from tests.helpers import compose

SMALL = {"size": 5, "num_tags": 3, "k": 2, "num_features": 6, "n_train": 300, "n_valid": 50, "n_test": 50}


def _data(structure, **kw):
    return planted_structure(structure, **{**SMALL, **kw})


@pytest.mark.parametrize("structure", STRUCTURES)
def test_shapes_determinism_and_balance(structure):
    data = _data(structure, seed=3)
    shape = part_shape(structure, SMALL["size"], SMALL["num_tags"])
    assert data.dims == {"input_dim": 6, "num_classes": 2, "latent_dim": math.prod(shape), "part_shape": shape}
    assert data.extras["readout"].shape == (6, math.prod(shape))
    for name, n in (("train", 300), ("valid", 50), ("test", 50)):
        split = data.splits[name]
        assert split["x"].shape == (n, 6) and split["x"].dtype == torch.float32
        assert split["y"].shape == (n,) and split["y"].dtype == torch.long
        assert split["z"].shape == (n, *shape) and set(split["z"].unique().tolist()) <= {0.0, 1.0}
    again, other = _data(structure, seed=3), _data(structure, seed=4)
    for key in ("x", "y", "z"):
        assert torch.equal(data.splits["test"][key], again.splits["test"][key])
    assert not torch.equal(data.splits["train"]["x"], other.splits["train"]["x"])
    # the median threshold balances the training labels (up to the flips)
    assert abs(data.splits["train"]["y"].float().mean().item() - 0.5) < 0.08


@pytest.mark.parametrize("structure", STRUCTURES)
def test_the_latent_is_the_map_of_the_teacher_scores(structure):
    """z* = MAP(W_t x), with W_t and x drawn as the module docstring says (same generator, same order)."""
    data = _data(structure, seed=7, label_noise=0.0)
    shape = part_shape(structure, SMALL["size"], SMALL["num_tags"])
    parts, d = math.prod(shape), SMALL["num_features"]
    rng = np.random.RandomState(7)
    teacher = rng.randn(parts, d) / math.sqrt(d)
    rng.randn(d, parts)  # the read-out V
    x = rng.randn(SMALL["n_train"], d)
    assert np.allclose(x, data.splits["train"]["x"].numpy(), atol=1e-6)
    struct = make_structure(structure, SMALL["num_tags"], SMALL["k"])
    scores = torch.tensor(x @ teacher.T).view(-1, *shape)
    z = data.splits["train"]["z"]
    assert torch.equal(struct.map(scores).float(), z)
    # a vertex is its own MAP (every vertex has the same number of parts)
    assert torch.equal(struct.map(z.double()).float(), z)
    # and the true latents vary across examples
    assert len({tuple(v.flatten().tolist()) for v in z}) > (1 if structure == "topk" else 3)


def test_each_vertex_has_the_structure_s_parts():
    n = SMALL["size"]
    z = _data("projective_dep_tree").splits["train"]["z"]
    assert torch.all(z[:, :, 1:].sum(1) == 1) and torch.all(z[:, :, 0] == 0)  # one head per word, none for the root
    z = _data("nonprojective_dep_tree").splits["train"]["z"]
    assert torch.all(z[:, :, 1:].sum(1) == 1)
    z = _data("matching").splits["train"]["z"]
    assert torch.all(z.sum(1) == 1) and torch.all(z.sum(2) == 1)
    assert torch.all(_data("topk").splits["train"]["z"].sum(1) == SMALL["k"])
    assert torch.all(_data("categorical").splits["train"]["z"].sum(1) == 1)
    assert torch.all(_data("binary_tree").splits["train"]["z"].sum((1, 2)) == n - 1)
    assert torch.all(_data("sequence_tagging").splits["train"]["z"].sum((2, 3)) == 1)


def test_label_noise_flips_about_that_fraction():
    clean = _data("matching", label_noise=0.0, n_train=2000).splits["train"]["y"]
    noisy = _data("matching", label_noise=0.2, n_train=2000).splits["train"]["y"]
    assert 0.15 < (clean != noisy).float().mean().item() < 0.25


def test_recovery_metrics_by_hand():
    true = torch.tensor([[[0, 1], [0, 0]], [[0, 0], [1, 0]]]).float()  # two 2x2 "matchings" (one part each, say)
    pred = torch.tensor([[[0, 1], [0, 0]], [[0, 1], [0, 0]]]).float()
    m = recovery_metrics(pred, true)
    assert m["exact"] == 50.0 and m["recovery"] == 50.0
    cat_true, cat_pred = torch.eye(3)[[0, 0, 1, 2]], torch.eye(3)[[2, 2, 0, 1]]  # a permutation: V-measure 100
    assert recovery_metrics(cat_pred, cat_true)["recovery"] == pytest.approx(100.0)


TINY = ["dataset.n_train=60", "dataset.n_valid=20", "dataset.n_test=20", "dataset.size=4", "trainer.max_steps=3",
        "trainer.eval_every=3", "trainer.batch_size=30", "trainer.progress=false"]


@pytest.mark.parametrize("structure", STRUCTURES)
def test_every_planted_experiment_runs_a_few_steps(tmp_path, structure):
    """ste_i (MAP forward: every structure), the oracle and the linear model; the metrics a table reads exist."""
    for name, overrides in (("ste_i", ["estimator=ste_i"]), ("gold", ["latent=gold"]),
                            ("linear", ["latent=none", "decoder=linear"])):
        cfg = compose(f"+experiment=planted_{structure}", *TINY, f"paths.output_dir={tmp_path / name}", *overrides)
        assert cfg.dataset.structure == structure
        metrics = train(cfg)["metrics"]
        assert {"valid/acc", "test/acc"} <= set(metrics)
        if name == "linear":
            assert "test/recovery" not in metrics
        else:
            assert {"test/recovery", "test/exact"} <= set(metrics)
        if name == "gold":
            assert metrics["test/recovery"] == 100.0 and metrics["test/exact"] == 100.0
    # the recovery of random scores' MAP (report.matrix's chance line): the setting's, the same in every run of it
    chance = [json.loads((tmp_path / n / "report.json").read_text())["chance"] for n in ("ste_i", "gold", "linear")]
    assert chance[0] == chance[1] == chance[2] and 0 <= chance[0]["recovery"] < 100


# --- identifiability (issue #38): the fixed read-out tells z* from its symmetric images --------------------------


@pytest.mark.parametrize("structure", STRUCTURES)
def test_a_moved_latent_is_a_vertex_and_not_the_gold_one(structure):
    z = _data(structure, seed=5).splits["test"]["z"]
    moved = move(structure, z)
    struct = make_structure(structure, SMALL["num_tags"], SMALL["k"])
    assert torch.equal(struct.map(moved.double()).float(), moved)  # a vertex of the same structure
    assert torch.equal(moved.flatten(1).sum(1), z.flatten(1).sum(1))
    assert (moved != z).flatten(1).any(1).float().mean() > 0.5  # most examples move


@pytest.mark.parametrize("structure", STRUCTURES)
def test_gold_recovers_100_and_a_moved_latent_reads_out_clearly_worse(structure):
    """The calibration: z* fed to the data's read-out gives the labels (but the flips) and recovers 100; z* moved by
    the structure's symmetry and the MAP of random scores read out at least 15 points below."""
    got = calibrate(structure, **{**SMALL, "n_test": 400, "label_noise": 0.0, "seed": 2})
    assert got["gold"]["acc"] == 100.0 and got["gold"]["recovery"] == 100.0 and got["gold"]["exact"] == 100.0
    assert got["moved"]["acc"] < 85.0 and got["random"]["acc"] < 85.0
    assert got["random"]["exact"] < 20.0
    if structure == "categorical":  # V-measure: identified up to a permutation of the classes only
        assert got["moved"]["recovery"] == pytest.approx(100.0)
    else:
        assert got["moved"]["recovery"] < 90.0


def test_the_known_readout_decoder_is_the_data_s_read_out():
    data = _data("projective_dep_tree", seed=1, label_noise=0.0)
    decoder = KnownReadout(SMALL["num_features"], data.dims["latent_dim"], 2, data.extras["readout"])
    assert [name for name, _ in decoder.named_parameters()] == ["scale", "bias"]  # V is frozen
    with torch.no_grad():
        decoder.scale.fill_(1.0)
        decoder.bias.fill_(-data.extras["threshold"])
    test = data.splits["test"]
    logits = decoder(test["x"], test["z"].flatten(1))
    assert torch.equal(logits.argmax(-1), test["y"])
    assert torch.equal(read_out(data, "test", test["z"]), test["y"])
