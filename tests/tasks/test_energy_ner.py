"""The NER energy task of seed 004 (latentstruct/tasks/energy_ner.py): the BiLSTM-CRF against brute force, the
φ-gradient of the implicit and explicit methods, padding, the evaluation (span F1 of the per-token argmax), every
experiment (NER and NER+) and a resumption through train.py on generated CoNLL files, and a real-CoNLL smoke run."""

from __future__ import annotations

import itertools
import random
import typing
from functools import partial
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from hydra.errors import ConfigCompositionException

import latentstruct.train as train_module
from latentstruct.config import ConfigError, validate
from latentstruct.data.conll import TAG_PAD, span_f1, tag_names
from latentstruct.models.energy import (
    BiLSTMFeatures,
    SequenceEnergyNet,
    SequenceInferenceNet,
    categorical_samples,
    cd_loss,
    dvn_loss,
    hamming_loss,
    sequence_nll,
    ssvm_loss,
)
from latentstruct.models.implicit import grad_or_zeros, implicit_gradient
from latentstruct.models.masks import length_mask
from latentstruct.tasks.energy_ner import SequenceLabelEnergy
from latentstruct.train import train
from tests.helpers import compose as _compose
from tests.helpers import methods, one_epoch_per_phase
from tests.tasks.test_energy import check_resume_in_the_method_phase

EXPERIMENTS = methods("ner")
TINY_TASK = ["task.encoder.hidden=4", "embedding.dim=6", "task.encoder.extra_dim=3", "task.neumann_terms=2",
             "task.spen_steps=2", "task.num_samples=2"]

# ------------------------------------------------------------------------------------------------ helpers


_WORDS = ["the", "a", "of", "in", "said", "on", "to", "was", "by", "and", "team", "club", "market", "talks", "."]
_NAMES = {"PER": ["John", "Mary", "Smith"], "LOC": ["Paris", "Bonn", "Kenya"], "ORG": ["EU", "Reuters", "UN"],
          "MISC": ["German", "British"]}


def write_conll(root: Path, n_train: int = 24, n_valid: int = 10, n_test: int = 10, seed: int = 0) -> Path:
    """Tiny CoNLL-2003 files (4 columns, IOB2, -DOCSTART- lines) under ``root/conll2003``; returns ``root``."""
    rng = random.Random(seed)
    folder = root / "conll2003"
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        lines = ["-DOCSTART- -X- -X- O", ""]
        for _ in range(n):
            for _ in range(rng.randint(1, 3)):  # chunks: words, then maybe an entity of 1-2 tokens
                for _ in range(rng.randint(0, 3)):
                    lines.append(f"{rng.choice(_WORDS)} {rng.choice(['DT', 'IN', 'VBD', 'NN'])} "
                                 f"{rng.choice(['B-NP', 'I-NP', 'B-VP', 'O'])} O")
                kind = rng.choice(sorted(_NAMES))
                for i in range(rng.randint(1, 2)):
                    lines.append(f"{rng.choice(_NAMES[kind])} NNP {'I' if i else 'B'}-NP {'I' if i else 'B'}-{kind}")
            lines.append("")
        (folder / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return root


def _batch(lengths=(4, 2, 3), width: int = 6, vocab: int = 12, tags: int = 4, seed: int = 0):
    """Word ids, tags (TAG_PAD past the length) and POS / chunk ids, padded to ``width`` (> the longest)."""
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    lengths = torch.tensor(lengths)
    mask = length_mask(lengths, width)
    x = torch.randint(2, vocab, (b, width), generator=g) * mask
    y = torch.where(mask, torch.randint(0, tags, (b, width), generator=g), torch.full((b, width), TAG_PAD))
    pos = torch.randint(1, 5, (b, width), generator=g) * mask
    chunk = torch.randint(1, 4, (b, width), generator=g) * mask
    return {"x": x, "lengths": lengths, "y": y, "pos": pos, "chunk": chunk}


def _task(method: str, seed: int = 0, tags: int = 4, features: bool = False, **settings) -> SequenceLabelEnergy:
    """The task as its config builds it: the networks ``method`` trains (E, A, F), each on its own BiLSTM."""
    torch.manual_seed(seed)
    dims = {"vocab_size": 12, "num_tags": tags, **({"pos_vocab_size": 5, "chunk_vocab_size": 4} if features else {})}
    energy = None if method == "mbce" else SequenceEnergyNet
    infnet = None if method in ("spen", "crf") else SequenceInferenceNet
    cost_net = SequenceInferenceNet if method == "infnet" else None
    task = SequenceLabelEnergy.build(dims, {}, energy, infnet, cost_net, partial(BiLSTMFeatures, hidden=3, extra_dim=2),
                                     {"dim": 5, "freeze": True}, method=method, **settings)
    task = task.double()
    if task.energy_net is not None:  # transitions start at 0: make the chain matter
        e = task.energy_net.energy
        with torch.no_grad():
            for p in (e.transition, e.start, e.end):
                p.normal_(0, 1.0, generator=torch.Generator().manual_seed(seed + 1))
    return task


def _one_hot(y: torch.Tensor, lengths: torch.Tensor, tags: int) -> torch.Tensor:
    mask = length_mask(lengths, y.shape[1]).unsqueeze(-1)
    return F.one_hot(y.clamp_min(0), tags).double() * mask


# ------------------------------------------------------------------------------------------------------ CRF


def test_crf_nll_and_viterbi_match_brute_force_over_the_energy():
    task = _task("crf", tags=3)
    batch = _batch(lengths=(3, 1, 2), width=5, tags=3)
    nll = task.crf_nll(task.trim(batch))
    viterbi = task.predict(batch)
    assert viterbi.shape == (3, 5, 3) and (viterbi[0, 3:] == 0).all() and (viterbi[1, 1:] == 0).all()
    for i, n in enumerate(batch["lengths"].tolist()):
        one = {k: v[i : i + 1, :n] for k, v in batch.items() if v.dim() == 2}
        one["lengths"] = batch["lengths"][i : i + 1]
        seqs = torch.tensor(list(itertools.product(range(3), repeat=n)))  # every tag sequence
        ys = F.one_hot(seqs, 3).double().unsqueeze(1)  # [V, 1, n, T]
        energies = task.energy(one, ys).squeeze(1)  # the energy of eq. 7, [V]
        gold = task.energy(one, _one_hot(one["y"], one["lengths"], 3))
        torch.testing.assert_close(nll[i], torch.logsumexp(-energies, 0) + gold[0])  # −log p(y | x), p ∝ e^−E
        assert torch.equal(viterbi[i, :n].argmax(-1), seqs[energies.argmin()])
    # the loss the task trains is their batch mean
    torch.testing.assert_close(task(batch).loss, nll.mean())


# ------------------------------------------------------------------------------------------------ gradients


@pytest.mark.parametrize("primary", ["ssvm", "dvn", "cd"])
def test_the_phi_gradient_is_the_implicit_gradient_or_the_explicit_one(primary):
    batch = _batch()
    x, lengths = batch["x"][:, :4], batch["lengths"]
    gold = _one_hot(batch["y"][:, :4], lengths, 4)
    mask = length_mask(lengths, 4).unsqueeze(-1).double()
    settings = dict(primary=primary, inner_steps=2, neumann_terms=3, neumann_alpha=0.05, lam=0.7, num_samples=3,
                    inverse_solver="neumann")
    grads = {}
    for method in ("implicit", "explicit"):
        task = _task(method, **settings)
        torch.manual_seed(5)  # the inner steps draw nothing: the CD samples are the first draws after this
        out = task(batch)
        out.loss.backward()
        phi, theta = task.energy_parameters(), task.inference_parameters()
        grads[method] = [p.grad.clone() for p in phi]
        # independently, from the networks and the losses of models/energy.py at the θ the inner steps left
        net = task.energy_net

        def energy(y, net=net):
            return net.energy(net.features(x, lengths), y, lengths)

        logits = task.infnet.logits(x, lengths)
        a = torch.softmax(logits, -1) * mask
        aux = (sequence_nll(logits, gold, lengths) + 0.7 * energy(a)).mean()
        if primary == "ssvm":
            prim = ssvm_loss(energy(a), energy(gold), hamming_loss(a, gold, lengths))
        elif primary == "dvn":
            prim = dvn_loss(energy(a), 1 - hamming_loss(a, gold, lengths, normalize=True))
        else:
            torch.manual_seed(5)
            samples = categorical_samples(a, 3, straight_through=True)
            prim = cd_loss(energy(gold), energy(samples), hamming_loss(samples, gold, lengths))
        want = implicit_gradient(prim, aux, theta, phi, terms=3, alpha=0.05) if method == "implicit" \
            else grad_or_zeros(prim, phi)
        assert out.loss.item() == pytest.approx(prim.item(), rel=1e-12)
        for got, ref in zip(grads[method], want, strict=True):
            torch.testing.assert_close(got, ref)
        assert all(p.grad is None for p in theta)  # the returned loss reaches φ only
    diff = max(float((a - b).abs().max()) for a, b in zip(grads["implicit"], grads["explicit"], strict=True))
    assert diff > 1e-4 * max(float(g.abs().max()) for g in grads["explicit"])  # the implicit term is there


@pytest.mark.parametrize("infnet_ce", [0.0, 1.0])
def test_the_infnet_step_is_the_eq5_ascent_then_the_descent_at_the_new_outputs(infnet_ce):
    """InfNet (+ its token cross-entropy: InfNet+): θ after the step's ascent and the φ-gradient of its descent,
    against eq. 5 computed independently from the networks (every energy on a BiLSTM pass of its own, F and A run
    afresh after the ascent): the task's one pass of E's features and of F and A per half-step changes nothing."""
    batch = _batch()
    x, lengths = batch["x"][:, :4], batch["lengths"]
    gold = _one_hot(batch["y"][:, :4], lengths, 4)
    mask = length_mask(lengths, 4).unsqueeze(-1).double()
    settings = dict(lam=0.7, infnet_ce=infnet_ce, inner_optimizer="sgd", inner_lr=0.1)
    task, ref = _task("infnet", **settings), _task("infnet", **settings)
    out = task(batch)
    out.loss.backward()

    def energy(y):
        return ref.energy_net.energy(ref.energy_net.features(x, lengths), y, lengths)

    def run(net):
        logits = net.logits(x, lengths)
        return torch.softmax(logits, -1) * mask, sequence_nll(logits, gold, lengths)

    def objective(f, a):
        return (F.relu(hamming_loss(f, gold, lengths) - energy(f) + energy(gold))
                + 0.7 * F.relu(energy(gold) - energy(a))).mean()

    (f, f_nll), (a, a_nll) = run(ref.cost_net), run(ref.infnet)
    theta = ref.inference_parameters()
    ascent = torch.autograd.grad(-objective(f, a) + infnet_ce * (f_nll + a_nll).mean(), theta)
    with torch.no_grad():
        for p, g in zip(theta, ascent, strict=True):
            p -= 0.1 * g
    for got, want in zip(task.inference_parameters(), theta, strict=True):
        torch.testing.assert_close(got, want)
    descent = objective(run(ref.cost_net)[0].detach(), run(ref.infnet)[0].detach())
    assert out.loss.item() == pytest.approx(descent.item(), rel=1e-12)
    for p, want in zip(task.energy_parameters(), torch.autograd.grad(descent, ref.energy_parameters()), strict=True):
        torch.testing.assert_close(p.grad, want)
    assert all(p.grad is None for p in task.inference_parameters())


@pytest.mark.parametrize("features", [False, True])
def test_forward_over_reverse_products_give_the_double_backward_gradient_through_the_bilstm(features):
    """task.hvp=forward_over_reverse through A's BiLSTM (packed, trainable word vectors; NER+'s feature
    embeddings): the φ-gradient of the double backward's, to round-off; with dropout it is refused."""
    batch = _batch()
    settings = dict(primary="cd", inner_steps=1, lam=0.7, num_samples=3, inverse_solver="minres", solver_tol=1e-4,
                    solver_max_iter=6, features=features)
    grads = {}
    for hvp in ("double_backward", "forward_over_reverse"):
        task = _task("implicit", hvp=hvp, **settings)
        assert any(p.requires_grad for p in task.infnet.features.words.parameters())  # θ holds the word vectors
        torch.manual_seed(5)
        task(batch).loss.backward()
        grads[hvp] = torch.cat([p.grad.reshape(-1) for p in task.energy_parameters()])
    torch.testing.assert_close(grads["forward_over_reverse"], grads["double_backward"], rtol=1e-9, atol=1e-12)
    task = _task("implicit", hvp="forward_over_reverse", **settings)
    task.infnet.features.encoder.dropout.p = 0.1
    with pytest.raises(ValueError, match="dropout"):
        task(batch)


# -------------------------------------------------------------------------------------------------- padding


@pytest.mark.parametrize("method", ["implicit", "spen", "crf", "infnet"])
def test_padding_and_batch_mates_change_nothing_for_an_example(method):
    task = _task(method, features=True, spen_steps=3)
    task.eval()
    long = _batch(lengths=(3, 6), width=8, seed=1)  # example 0 next to a longer sentence, padded beyond both
    alone = {k: v[:1, :3] if v.dim() == 2 else v[:1] for k, v in long.items()}

    def per_example(batch):
        b = task.trim(batch)
        out = {"predict": task.predict(batch)[:, :3], "cost": task.cost(task.gold(b).double() * 0.5, b)}
        if task.energy_net is not None:
            out["energy"] = task.energy(b, task.gold(b).double())
            out["pretrain"] = task.energy_pretrain_loss(b)
        if task.infnet is not None:
            probs, nll = task.inference(task.infnet, b)
            out.update(probs=probs[:, :3], nll=nll)
        if method == "crf":
            out["crf"] = task.crf_nll(b)
        if method == "spen":
            out["spen_aug"] = task.spen_inference(b, augmented=True)[:, :3]
        return out

    with torch.no_grad():
        a, b = per_example(alone), per_example(long)
    for key in a:
        torch.testing.assert_close(b[key][0], a[key][0], msg=key)
    assert set(a) >= {"predict", "cost"}


# ---------------------------------------------------------------------------------------------- evaluation


def test_the_evaluation_scores_the_per_token_argmax_with_conlleval_f1(monkeypatch):
    names = tag_names("bioes")
    task = _task("mbce", tags=17).float()
    # gold: "B-PER E-PER O S-LOC" and "S-ORG O"; the predictions' rows are argmax-decoded, never thresholded (no
    # entry reaches 0.5 in some rows)
    ids = {t: i for i, t in enumerate(names)}
    gold = torch.tensor([[ids["B-PER"], ids["E-PER"], ids["O"], ids["S-LOC"]], [ids["S-ORG"], ids["O"], TAG_PAD,
                                                                               TAG_PAD]])
    pred_tags = [["B-PER", "E-PER", "O", "S-ORG"], ["S-ORG", "I-MISC"]]
    probs = torch.full((2, 4, 17), 0.6 / 16)
    for i, row in enumerate(pred_tags):
        for j, tag in enumerate(row):
            probs[i, j, ids[tag]] = 0.4
    probs[1, 2:] = 0  # padding
    data = {"x": torch.ones(2, 4, dtype=torch.long), "lengths": torch.tensor([4, 2]), "y": gold}
    monkeypatch.setattr(task, "predict", lambda batch: probs)
    metrics = task.evaluate(data, batch_size=2)
    gold_tags = [["B-PER", "E-PER", "O", "S-LOC"], ["S-ORG", "O"]]
    precision, recall, f1 = span_f1(pred_tags, gold_tags)
    assert (precision, recall) == (pytest.approx(50.0), pytest.approx(200 / 3))  # I-MISC after S-ORG: a chunk
    assert metrics["acc"] == metrics["f1"] == pytest.approx(f1)
    assert (metrics["precision"], metrics["recall"]) == (pytest.approx(precision), pytest.approx(recall))
    assert metrics["token_acc"] == pytest.approx(100 * 4 / 6)
    assert metrics["infer_seconds"] >= 0
    # the default evaluate_splits scores each split alone
    both = task.evaluate_splits({"valid": data, "test": data}, batch_size=2)
    assert both["valid"]["f1"] == both["test"]["f1"] == pytest.approx(f1)


def test_ner_plus_feeds_the_pos_and_chunk_features_to_every_network():
    task = _task("infnet", features=True)
    batch = _batch()
    other = {**batch, "pos": torch.where(batch["pos"] > 0, batch["pos"] % 4 + 1, 0)}  # other POS tags
    with torch.no_grad():
        for net in (task.infnet, task.cost_net):
            assert not torch.allclose(task.inference(net, batch)[0], task.inference(net, other)[0])
        gold = task.gold(batch).double()
        assert not torch.allclose(task.energy(batch, gold), task.energy(other, gold))
    with pytest.raises(ValueError, match="dataset.features=true"):
        task.predict({k: v for k, v in batch.items() if k != "chunk"})


# ---------------------------------------------------------------------------------------- through train.py


def _toy_cfg(data_dir, out, experiment="cd", *overrides):
    return _compose(f"+experiment=ner_{experiment}", f"paths.data_dir={data_dir}", f"paths.output_dir={out}",
                    "trainer.batch_size=8", "trainer.progress=false", "trainer.threads=1", *TINY_TASK, *overrides)


@pytest.mark.slow
def test_every_experiment_runs_a_few_steps_on_generated_conll(tmp_path):
    data_dir = write_conll(tmp_path / "data")
    metrics = {f"{s}/{m}" for s in ("valid", "test")
               for m in ("acc", "f1", "precision", "recall", "token_acc", "infer_seconds")}
    for i, experiment in enumerate(EXPERIMENTS):  # NER and NER+ (the features) in turn: each experiment once
        features = bool(i % 2)
        out = tmp_path / f"{experiment}_{features}"
        cfg = _toy_cfg(data_dir, out, experiment, f"dataset.features={str(features).lower()}")
        one_epoch_per_phase(cfg)
        record = train(cfg)
        assert record["status"] == "completed" and record["steps"] == 3 * (1 + bool(cfg.trainer.phases))
        assert set(record["metrics"]) == metrics
        history = pd.read_csv(out / "history.csv")
        assert (history["valid/acc"] == history["valid/f1"]).all()
        assert ((0 <= history["test/f1"]) & (history["test/f1"] <= 100)).all()
    # the NER+ switch reaches the model; the experiments' defaults
    cfg = _compose("+experiment=ner_cd", "dataset.features=true")
    assert cfg.dataset.features and (cfg.embedding.dim, cfg.task.encoder.hidden, cfg.trainer.batch_size) == (
        100, 100, 32)
    assert _compose("+experiment=ner_infnet_plus").task.infnet_ce > 0
    assert _compose("+experiment=ner_crf").task.method == "crf"
    sweep = _compose("+sweep=energy_ner", hydra=True)
    assert sorted(sweep.hydra.sweeper.params["+experiment"].split(",")) == [f"ner_{e}" for e in EXPERIMENTS]
    assert sweep.hydra.sweeper.params["dataset.features"] == "false,true"


@pytest.mark.cuda
@pytest.mark.parametrize("experiment", ["cd", "ssvm", "crf"])
def test_the_method_phase_trains_on_cuda(tmp_path, experiment):
    """On CUDA the implicit step differentiates twice through A's LSTM with cuDNN off (its LSTM backward has no
    derivative); the CRF's forward algorithm runs on the device too."""
    data_dir = write_conll(tmp_path / "data")
    cfg = _toy_cfg(data_dir, tmp_path / "run", experiment, "trainer.device=cuda")
    if cfg.trainer.phases:
        cfg.trainer.phases[0].epochs = cfg.trainer.phases[1].epochs = 1
    else:
        cfg.trainer.max_epochs = 1
    record = train(cfg)
    assert record["status"] == "completed" and record["hardware"] != "cpu"
    assert record["steps"] == 3 * (1 + bool(cfg.trainer.phases))


@pytest.mark.cuda
def test_forward_over_reverse_on_cuda_gives_the_double_backward_gradient():
    """On CUDA (A's LSTM with cuDNN off) forward-over-reverse gives the double backward's φ-gradient; if PyTorch's
    CUDA LSTM kernels have no forward-mode derivative, the named error is raised (an expected failure that says
    so: the GPU check's record of what the device supports)."""
    batch = {k: v.cuda() for k, v in _batch().items()}
    settings = dict(primary="cd", inner_steps=1, lam=0.7, num_samples=3, inverse_solver="minres", solver_tol=1e-4,
                    solver_max_iter=6)
    grads = {}
    for hvp in ("double_backward", "forward_over_reverse"):
        task = _task("implicit", hvp=hvp, **settings).cuda()
        torch.manual_seed(5)
        try:
            task(batch).loss.backward()
        except NotImplementedError as err:
            assert hvp == "forward_over_reverse" and "hvp=double_backward" in str(err)
            pytest.xfail(str(err))
        grads[hvp] = torch.cat([p.grad.reshape(-1) for p in task.energy_parameters()])
    torch.testing.assert_close(grads["forward_over_reverse"], grads["double_backward"], rtol=1e-8, atol=1e-11)


TOY_DIMS = {"vocab_size": 12, "num_tags": 4}


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_the_config_shows_the_networks_its_method_builds(experiment):
    cfg = _compose(f"+experiment=ner_{experiment}", "task.encoder.hidden=3", "embedding.dim=4")
    targets = {"energy": SequenceEnergyNet, "infnet": SequenceInferenceNet, "cost_net": SequenceInferenceNet}
    needs = dict(zip(targets, SequenceLabelEnergy.NETWORKS[cfg.task.method], strict=True))
    for group, cls in targets.items():  # set exactly when the method trains that network, with its target
        assert (cfg.task[group] is not None) == needs[group]
        assert cfg.task[group] is None or cfg.task[group]._target_ == f"{cls.__module__}.{cls.__name__}"
    assert cfg.task.encoder._target_ == "latentstruct.models.energy.BiLSTMFeatures"
    task = train_module.build_model(cfg, TOY_DIMS, {})
    built = {"energy": task.energy_net, "infnet": task.infnet, "cost_net": task.cost_net}
    features = [net.features for net in built.values() if net is not None]
    assert all(isinstance(f, BiLSTMFeatures) and f.out_dim == 6 for f in features)  # 2 × encoder.hidden
    assert len({id(f) for f in features}) == len(features)  # each network its own feature network
    for group, cls in targets.items():
        assert isinstance(built[group], cls) if needs[group] else built[group] is None


@pytest.mark.parametrize("overrides,error", [
    (["+experiment=ner_crf", "infnet=sequence_inference_net"], "method=crf builds no infnet"),
    (["+experiment=ner_mbce", "energy=sequence_energy_net"], "method=mbce builds no energy"),
    (["+experiment=ner_infnet", "~cost_net"], "method=infnet needs the network cost_net"),
    (["+experiment=ner_cd", "~encoder"], r"encoder holds settings \(hidden\) but no option"),
    (["+experiment=ner_cd", "~energy"], "method=implicit needs the network energy"),
    (["+experiment=ner_cd", "+structure=sequence_tagging"], "Key 'structure' not in 'SequenceLabelEnergyConf'"),
    (["+experiment=ner_cd", "+decoder=linear"], "Key 'decoder' not in 'SequenceLabelEnergyConf'"),
])
def test_a_part_the_task_does_not_build_is_refused(overrides, error):
    with pytest.raises((ValueError, ConfigCompositionException), match=error):
        train_module.build_model(_compose(*overrides), TOY_DIMS, {})


def test_pretrained_word_vectors_reach_every_embedding_table(tmp_path):
    data_dir = write_conll(tmp_path / "data")
    (data_dir / "vectors.txt").write_text("the 1 2 3 4 5 6\nParis 0 0 1 0 0 1\n")
    cfg = _toy_cfg(data_dir, tmp_path / "run", "cd", "embedding.pretrained=vectors.txt",
                   f"embedding.cache_dir={tmp_path / 'cache'}", "trainer.max_steps=4", "trainer.phases.0.epochs=1")
    data = train_module.instantiate(cfg.dataset)
    task = train_module.build_model(cfg, data.dims, data.extras)
    vocab = data.extras["vocab"]
    for net in (task.energy_net, task.infnet):
        weight = net.features.words.embedding.weight
        assert not weight.requires_grad  # embedding.freeze (default true): not part of φ or θ
        torch.testing.assert_close(weight[vocab.encode(["the"])[0]], torch.arange(1.0, 7.0))
    assert all(p.requires_grad for p in task.energy_parameters() + task.inference_parameters())
    assert train(cfg)["status"] == "completed"  # the implicit gradient runs with frozen vectors


@pytest.mark.slow
def test_resume_in_the_method_phase_matches_an_uninterrupted_run(tmp_path, monkeypatch):
    data_dir = write_conll(tmp_path / "data")
    phases = ["trainer.phases.0.epochs=1", "trainer.phases.1.epochs=3"]
    check_resume_in_the_method_phase(lambda out, *extra: _toy_cfg(data_dir, out, "cd", *phases, *extra), tmp_path,
                                     monkeypatch, steps=12)


@pytest.mark.real_data("conll2003")
@pytest.mark.parametrize("experiment,features", [("cd", "false"), ("mbce", "true")])
def test_real_conll_smoke_run(tmp_path, data_root, experiment, features):
    phases = ["trainer.phases.0.epochs=1"] if experiment != "mbce" else []  # 3 pretraining steps, then the method
    record = train(_compose(f"+experiment=ner_{experiment}", f"paths.data_dir={data_root}",
                            f"paths.output_dir={tmp_path}", "trainer.progress=false", "trainer.threads=1",
                            "dataset.subset=96", "dataset.eval_subset=64", f"dataset.features={features}",
                            "trainer.max_steps=5", "trainer.eval_every=5", "task.neumann_terms=2", *phases))
    assert record["status"] == "completed" and record["steps"] == 5
    assert 0 <= record["metrics"]["test/f1"] <= 100 and record["metrics"]["test/token_acc"] > 0


def test_the_config_choices_are_the_tasks_methods():
    from latentstruct.tasks.energy import METHODS, MultiLabelEnergy
    from latentstruct.tasks.energy_ner import SEQUENCE_METHODS

    hints = {cls: typing.get_type_hints(cls.build) for cls in (MultiLabelEnergy, SequenceLabelEnergy)}
    assert typing.get_args(hints[MultiLabelEnergy]["method"]) == METHODS
    assert typing.get_args(hints[SequenceLabelEnergy]["method"]) == SEQUENCE_METHODS
    assert _compose("+experiment=ner_crf").task.method == "crf"
    with pytest.raises(ConfigError, match="task.method='crf' is not one of 'mbce'"):
        validate(_compose("+experiment=mlc_mbce", "task.method=crf"))
