"""What a trained sequence energy prefers (issue #34: energy/citation's L_CD collapses at 5 and 10 labelled
citations; InfNet's accuracy falls once the energy moves, energy/ner and energy/pos): for each run directory, its
model at the run's last step (``checkpoint.pt``) on train, valid and test, one JSON line per run and split::

    python scripts/energy_probe.py RUN_DIR [RUN_DIR ...]

Run it under the code the runs ran (``PYTHONPATH`` = that commit's worktree: ``python -m scripts.ablation
citation-energies`` and ``infnet-energies`` do). The energy E_φ(x, y) of the sequence tasks is a linear chain (unary
and transition scores), so its minimum over tag sequences is exact (:meth:`SequenceLabelEnergy.viterbi`). Per split
(citation's train split: its labelled citations, once each; an unlabelled one has no gold):

* ``acc_A``: token accuracy of A(x)'s argmax, what the run reports (None, as every A column, for a run without an
  inference network: the CRF floor); ``acc_E``: the same of argmin_y E_φ(x, y), what the energy itself would tag;
  ``acc_E_unary``: the same of the energy's unary part alone (per token, the transitions dropped), and
  ``transition_abs``: the mean |W_ij| of its transition scores (a run's, the same in every split);
* ``acc_F``: token accuracy of the cost-augmented network F's argmax (InfNet: eq. 5 trains the energy against F(x));
  ``F_at_E_errors``: % of the tokens the energy's minimum tags wrong where F's argmax has that same wrong tag (the
  energy's own errors among the outputs it is pushed up at); both None without F;
* ``f1_A``, ``f1_E``: span F1 (conlleval) of the same, where the task's metric is span F1 (NER), else None;
* ``author_A``, ``author_E``: % of tokens tagged author, where the tags have an author (citation), else None;
* ``gold_below_A``: % of sentences where E_φ(x, gold) < E_φ(x, argmax A(x)) (the energy ranks the gold tagging above
  A's: 100 where E is right and A has not followed it); ``gold_below_author``: the same against tagging every token
  author (citation);
* ``gap_gold``, ``gap_A``: E_φ(x, gold) − min_y E_φ(x, y), and the same for A's argmax, per token (0: the minimum);
  ``gap_A_relaxed``: the same for A(x) itself, its distributions over tags (the point the inference network is trained
  to bring down; below 0 where the energy's relaxation goes below its minimum over taggings).

Which of the energy's parameters moved its minimum, by swapping them with another state of the same run (its base,
before the moves)::

    python scripts/energy_probe.py --swap BASE_DIR RUN_DIR [RUN_DIR ...]

one JSON line per run and split: ``acc_E`` of the run, of the base, and per group of :data:`ENERGY_GROUPS`,
``back.<group>`` (the run with that group's parameters restored to the base's) and ``only.<group>`` (the base with
that group's parameters moved to the run's); and how far the group moved, per coordinate, in Adam steps of the run's
learning rate: ``step_mean.<group>`` and ``step_max.<group>``, the mean and largest |φ_run − φ_base| / (``optim.lr``
× ``steps_between``, the steps between the two states), the same in every split. Adam's step is about the learning
rate a coordinate where the gradient keeps its sign and size; moments carried over from pretraining that are small
beside the method's gradients would make it larger (up to ~1/√(1 − β₂) times at first), the largest above 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

COUNTS = ("tokens", "sentences", "right_A", "right_E", "right_E_unary", "right_F", "wrong_E", "F_at_E_errors",
          "author_A", "author_E", "gold_below_A", "gold_below_author", "gap_gold", "gap_A", "gap_A_relaxed")


#: the energy's parameters by part (prefixes of its state's keys): word vectors, the per-token feature vectors (NER+),
#: the BiLSTM, the unary scores' layer, the transition scores with their start and end
ENERGY_GROUPS = {"words": ("energy_net.features.words.",), "extras": ("energy_net.features.extras.",),
                 "bilstm": ("energy_net.features.encoder.",), "unary": ("energy_net.energy.unary.",),
                 "transitions": ("energy_net.energy.transition", "energy_net.energy.start", "energy_net.energy.end")}


def load(run_dir: str):
    """(the run's configuration, its data, its model in eval mode at its last step, that checkpoint)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from latentstruct.train import build_model

    cfg = OmegaConf.load(Path(run_dir, ".hydra", "config.yaml"))
    data = instantiate(cfg.dataset)
    torch.manual_seed(0)
    model = build_model(cfg, data.dims, data.extras)
    state = torch.load(Path(run_dir, "checkpoint.pt"), map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    return cfg, data, model.eval(), state


def energy_accuracy(model, rows: dict[str, torch.Tensor]) -> float:
    """Token accuracy (%) of argmin_y E_φ(x, y) (Viterbi) over ``rows``."""
    from latentstruct.data.base import iterate_batches
    from latentstruct.models.masks import length_mask

    right = tokens = 0.0
    for batch in iterate_batches(rows, 100):
        with torch.no_grad():
            batch = model.trim(batch)
            mask = length_mask(batch["lengths"], batch["x"].shape[1], batch["x"].device)
            right += float(((model.viterbi(batch).argmax(-1) == batch["y"]) & mask).sum())
            tokens += float(mask.sum())
    return 100 * right / tokens


def swap(base_dir: str, run_dir: str, splits: tuple[str, ...] = ("train", "valid")) -> list[dict]:
    """``acc_E`` of ``run_dir``'s energy with each group of :data:`ENERGY_GROUPS` put back to ``base_dir``'s
    (``back.<group>``), and of the base's with that group alone moved to the run's (``only.<group>``); groups the model
    lacks are left out. Both runs are of one model (their states have the same keys), e.g. a fork and its source."""
    cfg, data, model, state = load(run_dir)
    base_state = torch.load(Path(base_dir, "checkpoint.pt"), map_location="cpu", weights_only=False)
    moved, base = state["model"], base_state["model"]
    if moved.keys() != base.keys():
        raise ValueError(f"{run_dir} and {base_dir} are not of one model")
    steps = state["step"] - base_state["step"]
    if steps <= 0:
        raise ValueError(f"{run_dir} (step {state['step']}) is not after {base_dir} (step {base_state['step']})")
    states, steps_moved = {"run": moved, "base": base}, {"steps_between": steps}
    for group, prefixes in ENERGY_GROUPS.items():
        keys = [k for k in moved if k.startswith(prefixes)]
        if keys:
            states[f"back.{group}"] = {k: base[k] if k.startswith(prefixes) else v for k, v in moved.items()}
            states[f"only.{group}"] = {k: moved[k] if k.startswith(prefixes) else v for k, v in base.items()}
            per_step = torch.cat([(moved[k] - base[k]).abs().flatten() for k in keys]) / (cfg.optim.lr * steps)
            steps_moved[f"step_mean.{group}"] = float(per_step.mean())
            steps_moved[f"step_max.{group}"] = float(per_step.max())
    rows = [{"run_dir": str(run_dir), "base_dir": str(base_dir), "split": split, **steps_moved} for split in splits]
    for name, weights in states.items():
        model.load_state_dict(weights)
        for row in rows:
            row[name] = energy_accuracy(model, data.splits[row["split"]])
    return rows


def probe(run_dir: str) -> list[dict]:
    from latentstruct.data.base import iterate_batches
    from latentstruct.data.conll import span_f1
    from latentstruct.models.masks import length_mask

    cfg, data, model, state = load(run_dir)
    author = model.tags.index("author") if "author" in model.tags else None
    cost_net = getattr(model, "cost_net", None)
    rows = []
    for split in ("train", "valid", "test"):
        sums = dict.fromkeys(COUNTS, 0.0)
        rows_of = data.splits[split]
        if "labelled" in rows_of and split == "train":  # citation: the labelled ones, once each (the split repeats)
            once = torch.nonzero(rows_of["labelled"] > 0).flatten()[:int(cfg.dataset.labelled)]
            rows_of = {k: v[once] for k, v in rows_of.items()}
        tagged = {"gold": [], "A": [], "E": []}
        for batch in iterate_batches(rows_of, 100):
            with torch.no_grad():
                batch = model.trim(batch)
                batch = {**batch, "_energy_features": model.energy_features(batch)}  # one feature pass for them all
                mask = length_mask(batch["lengths"], batch["x"].shape[1], batch["x"].device)
                gold = F.one_hot(batch["y"].clamp_min(0), model.num_tags) * mask.unsqueeze(-1)
                e_hat = model.viterbi(batch)
                unary = model.energy_net.energy.unary_scores(batch["_energy_features"])  # higher: lower energy
                f_tags = None if cost_net is None else model.inference(cost_net, batch)[0].argmax(-1)
                # A(x); a run without an inference network (the CRF floor) has its energy's minimum in its place
                a_out = e_hat if model.infnet is None else model.inference(model.infnet, batch)[0]
                a_tags = a_out.argmax(-1)
                a_hat = F.one_hot(a_tags, model.num_tags) * mask.unsqueeze(-1)
                ys = [gold, a_hat, e_hat, a_out]
                if author is not None:
                    ys.append(F.one_hot(torch.full_like(a_tags, author), model.num_tags) * mask.unsqueeze(-1))
                e_gold, e_a, e_min, e_relaxed, *e_author = model.energy(batch, torch.stack(ys).to(e_hat.dtype))
            e_tags = e_hat.argmax(-1)
            wrong = (e_tags != batch["y"]) & mask
            sums["wrong_E"] += float(wrong.sum())
            if cost_net is not None:
                sums["right_F"] += float(((f_tags == batch["y"]) & mask).sum())
                sums["F_at_E_errors"] += float((wrong & (f_tags == e_tags)).sum())
            for name, tags in (("gold", batch["y"]), ("A", a_tags), ("E", e_tags)):
                tagged[name] += [row[:n] for row, n in zip(tags.tolist(), batch["lengths"].tolist(), strict=True)]
            sums["tokens"] += float(mask.sum())
            sums["sentences"] += len(batch["lengths"])
            sums["right_A"] += float(((a_tags == batch["y"]) & mask).sum())
            sums["right_E"] += float(((e_tags == batch["y"]) & mask).sum())
            sums["right_E_unary"] += float(((unary.argmax(-1) == batch["y"]) & mask).sum())
            if author is not None:
                sums["author_A"] += float(((a_tags == author) & mask).sum())
                sums["author_E"] += float(((e_tags == author) & mask).sum())
                sums["gold_below_author"] += float((e_gold < e_author[0]).sum())
            sums["gold_below_A"] += float((e_gold < e_a).sum())
            sums["gap_gold"] += float((e_gold - e_min).sum())
            sums["gap_A"] += float((e_a - e_min).sum())
            sums["gap_A_relaxed"] += float((e_relaxed - e_min).sum())
        t, c = sums["tokens"], sums["sentences"]
        row = {"run_dir": str(run_dir), "split": split, "sentences": int(c), "tokens": int(t),
               "acc_A": 100 * sums["right_A"] / t, "acc_E": 100 * sums["right_E"] / t,
               "acc_E_unary": 100 * sums["right_E_unary"] / t, "f1_A": None, "f1_E": None, "acc_F": None,
               "F_at_E_errors": None,
               "transition_abs": float(model.energy_net.energy.transition.detach().abs().mean()),
               "author_A": None, "author_E": None, "gold_below_A": 100 * sums["gold_below_A"] / c,
               "gold_below_author": None, "gap_gold": sums["gap_gold"] / t, "gap_A": sums["gap_A"] / t,
               "gap_A_relaxed": sums["gap_A_relaxed"] / t, "step": int(state["step"])}
        if model.metric == "span_f1":
            gold_seqs = [[model.tags[i] for i in s] for s in tagged["gold"]]
            for who in ("A", "E"):
                row[f"f1_{who}"] = span_f1([[model.tags[i] for i in s] for s in tagged[who]], gold_seqs)[2]
        if cost_net is not None:
            row.update(acc_F=100 * sums["right_F"] / t,
                       F_at_E_errors=100 * sums["F_at_E_errors"] / max(sums["wrong_E"], 1))
        if author is not None:
            row.update(author_A=100 * sums["author_A"] / t, author_E=100 * sums["author_E"] / t,
                       gold_below_author=100 * sums["gold_below_author"] / c)
        if model.infnet is None:  # no A: its columns say nothing
            row.update(dict.fromkeys(("acc_A", "f1_A", "author_A", "gold_below_A", "gap_A", "gap_A_relaxed")))
        rows.append(row)
    return rows


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    rows = ((row for run_dir in argv[2:] for row in swap(argv[1], run_dir)) if argv[:1] == ["--swap"] else
            (row for run_dir in argv for row in probe(run_dir)))
    for row in rows:
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
