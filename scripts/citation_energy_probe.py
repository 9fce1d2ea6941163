"""What a trained citation energy prefers (issue #34, energy/citation's reading: L_CD collapses at 5 and 10 labelled
citations): for each run directory, its model at the run's last step (``checkpoint.pt``) on the labelled training
citations, valid and test, one JSON line per run and split::

    python scripts/citation_energy_probe.py RUN_DIR [RUN_DIR ...]

Run it under the code the runs ran (``PYTHONPATH`` = that commit's worktree: ``python -m scripts.ablation
citation-energies`` does). The energy E_φ(x, y) of the sequence tasks is a linear chain (unary and transition scores),
so its minimum over tag sequences is exact (:meth:`SequenceLabelEnergy.viterbi`). Per split:

* ``acc_A``, ``author_A``: token accuracy and % of tokens tagged author of A(x)'s argmax, what the run reports
  (None, as every A column, for a run without an inference network: the CRF floor);
* ``acc_E``, ``author_E``: the same of argmin_y E_φ(x, y), what the energy itself would tag;
* ``gold_below_A``: % of citations where E_φ(x, gold) < E_φ(x, argmax A(x)) (the energy ranks the gold tagging above
  A's: 100 where E is right and A has not followed it); ``gold_below_author``: the same against tagging every token
  author;
* ``gap_gold``, ``gap_A``: E_φ(x, gold) − min_y E_φ(x, y), and the same for A's argmax, per token (0: the minimum).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F


def probe(run_dir: str) -> list[dict]:
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from latentstruct.data.base import iterate_batches
    from latentstruct.data.citation_rules import FIELDS
    from latentstruct.models.masks import length_mask
    from latentstruct.train import build_model

    cfg = OmegaConf.load(Path(run_dir, ".hydra", "config.yaml"))
    data = instantiate(cfg.dataset)
    torch.manual_seed(0)
    model = build_model(cfg, data.dims, data.extras)
    state = torch.load(Path(run_dir, "checkpoint.pt"), map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    model.eval()
    author = FIELDS.index("author")
    rows = []
    for split in ("train", "valid", "test"):
        sums = {k: 0.0 for k in ("tokens", "citations", "right_A", "right_E", "author_A", "author_E", "gold_below_A",
                                 "gold_below_author", "gap_gold", "gap_A")}
        rows_of = data.splits[split]
        if split == "train":  # the labelled citations, once each (the split repeats them; an unlabelled has no gold)
            once = torch.nonzero(rows_of["labelled"] > 0).flatten()[:int(cfg.dataset.labelled)]
            rows_of = {k: v[once] for k, v in rows_of.items()}
        for batch in iterate_batches(rows_of, 100):
            with torch.no_grad():
                batch = model.trim(batch)
                mask = length_mask(batch["lengths"], batch["x"].shape[1], batch["x"].device)
                gold = F.one_hot(batch["y"].clamp_min(0), model.num_tags) * mask.unsqueeze(-1)
                e_hat = model.viterbi(batch)
                # A's argmax; a run without an inference network (the CRF floor) has its energy's minimum in its place
                a_out = e_hat if model.infnet is None else model.inference(model.infnet, batch)[0]
                a_tags = a_out.argmax(-1)
                a_hat = F.one_hot(a_tags, model.num_tags) * mask.unsqueeze(-1)
                all_author = F.one_hot(torch.full_like(a_tags, author), model.num_tags) * mask.unsqueeze(-1)
                ys = torch.stack([gold, a_hat, e_hat, all_author]).to(e_hat.dtype)
                e_gold, e_a, e_min, e_author = model.energy(batch, ys)  # one feature pass for the four
            e_tags = e_hat.argmax(-1)
            sums["tokens"] += float(mask.sum())
            sums["citations"] += len(batch["lengths"])
            sums["right_A"] += float(((a_tags == batch["y"]) & mask).sum())
            sums["right_E"] += float(((e_tags == batch["y"]) & mask).sum())
            sums["author_A"] += float(((a_tags == author) & mask).sum())
            sums["author_E"] += float(((e_tags == author) & mask).sum())
            sums["gold_below_A"] += float((e_gold < e_a).sum())
            sums["gold_below_author"] += float((e_gold < e_author).sum())
            sums["gap_gold"] += float((e_gold - e_min).sum())
            sums["gap_A"] += float((e_a - e_min).sum())
        t, c = sums["tokens"], sums["citations"]
        rows.append({"run_dir": str(run_dir), "split": split, "citations": int(c), "tokens": int(t),
                     "acc_A": 100 * sums["right_A"] / t, "acc_E": 100 * sums["right_E"] / t,
                     "author_A": 100 * sums["author_A"] / t, "author_E": 100 * sums["author_E"] / t,
                     "gold_below_A": 100 * sums["gold_below_A"] / c,
                     "gold_below_author": 100 * sums["gold_below_author"] / c,
                     "gap_gold": sums["gap_gold"] / t, "gap_A": sums["gap_A"] / t, "step": int(state["step"])})
        if model.infnet is None:  # no A: its columns say nothing
            rows[-1].update({k: None for k in ("acc_A", "author_A", "gold_below_A", "gap_A")})
    return rows


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    for run_dir in argv:
        for row in probe(run_dir):
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
