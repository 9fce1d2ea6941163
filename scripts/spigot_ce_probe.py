"""What SPIGOT-CE's surrogate gradient is made of on SST, and an ablation of its truncated projection (issue #34: SST
Table 3's SPIGOT-CE row, 2.2 points below the baseline on all three seeds).

SPIGOT-CE (seed 001, Eq. 17) returns Marg(s) - Π_M(Marg(s) - ηγ), γ the loss gradient at μ0 = Marg(s). The CRF
marginals lie in the relative interior of M (every projective tree has positive probability), and M's affine hull is
{every word has one head} (checked by ``hull``), so while the step stays inside M the exact projection gives
T(ηγ): ηγ with, for each word, its mean over the word's possible heads removed. SST's configuration stops the active set
after 50 iterations (``task.structure.sparsemap_max_iter=50``, the authors' lp-sparsemap setting).

``hull`` checks the affine-hull claim by enumeration (n = 3..6 words)::

    python scripts/spigot_ce_probe.py hull

``probe`` loads a run directory's configuration (``.hydra/config.yaml``), builds its model at initialisation (or from
``--checkpoint``) and, on fixed training batches, compares the surrogate gradient g (50 iterations) with g0 (the
same projection at γ = 0), g500 (500 iterations) and T(ηγ); one JSON line per batch, then the means::

    python scripts/spigot_ce_probe.py probe RUN_DIR [--batches 5] [--checkpoint CKPT]

``train`` runs ``python -m latentstruct.train OVERRIDES`` with SPIGOT-CE's pull-back replaced by ``--variant``:
``interior`` (T(ηγ): the exact projection while the step stays in M; no active set) or ``zero`` (no gradient reaches
the scores through the tree). Nothing else changes; the run's directory is its own (``hydra.run.dir``)::

    python scripts/spigot_ce_probe.py train --variant interior +experiment=sst_spigot_ce trainer.threads=1 \
        trainer.seed=301 ... hydra.run.dir=RUN_DIR
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys

import torch

import latentstruct.estimators.surrogate as surrogate
from latentstruct.structures import ProjectiveDepTree
from latentstruct.structures.dependency import arc_parts
from latentstruct.structures.sparsemap import sparsemap_active_set


def tangent(v: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """T(v): the projection of v onto the directions of M's affine hull (per word, its heads' mean removed)."""
    v, _, mask = arc_parts(v, lengths, "tangent")  # the real arcs h → m; v zeroed elsewhere
    heads = mask.sum(1, keepdim=True).clamp(min=1)
    return torch.where(mask, v - v.sum(1, keepdim=True) / heads, 0.0)


def hull() -> None:
    """The affine hull of the multi-root projective trees of n words is {one head per word}: its dimension is the
    number of arcs minus n (the enumeration's rank)."""
    tree = ProjectiveDepTree(multiroot=True)
    for n in range(3, 7):
        vertices = tree.enumerate(n).double().reshape(-1, (n + 1) ** 2)
        rank = int(torch.linalg.matrix_rank(vertices - vertices[0]))
        arcs = int((vertices.abs().sum(0) > 0).sum())
        print(json.dumps({"n": n, "trees": len(vertices), "arcs": arcs, "affine_dim": rank, "arcs_minus_n": arcs - n}))
        # T removes exactly the normal directions: T(z - z0) = z - z0 for every pair of trees
        diff = (vertices - vertices[0]).reshape(-1, n + 1, n + 1)
        assert torch.allclose(tangent(diff, torch.full((len(diff),), n)), diff), "T is not the hull's projection"


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a * b).sum() / (a.norm() * b.norm() + 1e-30))


def probe(run_dir: str, batches: int, checkpoint: str | None) -> None:
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from latentstruct.data.base import iterate_batches
    from latentstruct.train import build_model

    rows = []

    def measured(self, s, z, gamma_z, structure, lengths, downstream):
        mu0 = structure.marginals(s, lengths)
        step = self.eta * self._gamma(downstream, mu0)
        exact = tangent(step, lengths)
        g = {}
        row = {"||eta*gamma||": float(step.norm()), "||T(eta*gamma)||": float(exact.norm())}
        for name, x, iters in (("g", mu0 - step, 50), ("g0", mu0, 50), ("g500", mu0 - step, 500)):
            sol = sparsemap_active_set(structure, x, lengths, max_iter=iters, strict=False)
            g[name] = mu0 - sol.mu.to(mu0.dtype)
            row.update({f"||{name}||": float(g[name].norm()), f"||{name}-T||": float((g[name] - exact).norm()),
                        f"cos({name},T)": _cos(g[name], exact), f"{name}_gap": float(sol.gap.max()),
                        f"{name}_support": float(sol.support_size.float().mean())})
        row["cos(g,g0)"] = _cos(g["g"], g["g0"])
        rows.append(row)
        return g["g"]

    surrogate.SpigotCe.pull_back = measured
    torch.set_num_threads(1)
    cfg = OmegaConf.load(f"{run_dir}/.hydra/config.yaml")
    data = instantiate(cfg.dataset)
    fixed = list(iterate_batches(data.splits["train"], cfg.trainer.batch_size, 12345))[:batches]
    torch.manual_seed(0)
    model = build_model(cfg, data.dims, data.extras)
    if checkpoint:
        model.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=False)["model"], strict=False)
    model.train()
    for batch in fixed:
        model.zero_grad(set_to_none=True)
        model(batch).loss.backward()
        print(json.dumps({k: round(v, 6) for k, v in rows[-1].items()}), flush=True)
    print("mean", json.dumps({k: round(sum(r[k] for r in rows) / len(rows), 6) for k in rows[0]}))


def train(variant: str, overrides: list[str]) -> None:
    def interior(self, s, z, gamma_z, structure, lengths, downstream):
        mu0 = structure.marginals(s, lengths)
        return tangent(self.eta * self._gamma(downstream, mu0), lengths)

    def zero(self, s, z, gamma_z, structure, lengths, downstream):
        return torch.zeros_like(s)

    surrogate.SpigotCe.pull_back = {"interior": interior, "zero": zero}[variant]
    sys.argv = [sys.argv[0], *overrides]
    runpy.run_module("latentstruct.train", run_name="__main__", alter_sys=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    sub.add_parser("hull")
    p_probe = sub.add_parser("probe")
    p_probe.add_argument("run_dir")
    p_probe.add_argument("--batches", type=int, default=5)
    p_probe.add_argument("--checkpoint")
    p_train = sub.add_parser("train")
    p_train.add_argument("--variant", choices=["interior", "zero"], required=True)
    p_train.add_argument("overrides", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.mode == "hull":
        hull()
    elif args.mode == "probe":
        probe(args.run_dir, args.batches, args.checkpoint)
    else:
        train(args.variant, args.overrides)


if __name__ == "__main__":
    main()
