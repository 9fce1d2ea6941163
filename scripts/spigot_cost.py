"""Where a SPIGOT-family training step spends its time, as training goes on (issue #33 item 5: SST SPIGOT slows down).

Two modes, both single-threaded and measured in process CPU time (the wall clock of a shared machine says more about
the other processes than about this one):

``run`` trains ``python -m latentstruct.train`` with the given overrides and writes one JSON line per 100 optimizer
steps: CPU seconds of the training steps (evaluations excluded), of the SparseMAP active set and of its MAP oracle,
its iterations (mean, max, how many calls reached ``task.structure.sparsemap_max_iter``), support sizes, and the
number of denormal floats in the parameters, gradients and optimizer state. Nothing the run computes is changed::

    python scripts/spigot_cost.py run OUT.jsonl +experiment=sst_spigot trainer.threads=1 trainer.progress=false \
        trainer.max_epochs=7 hydra.run.dir=RUN_DIR

``replay`` loads checkpoints of such a run (its checkpoint.pt, copied as it is rewritten) and times forward + backward
(no optimizer step) on the same fixed training batches, one JSON line per checkpoint, with the norm of SPIGOT's
displacement η γ(ẑ); ``--eta-scale`` multiplies γ(ẑ) before the projection (the ablation: does the iteration count
follow the size of η γ?)::

    python scripts/spigot_cost.py replay RUN_DIR CKPT [CKPT ...] [--batches 10] [--eta-scale 2]
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time

import torch

import latentstruct.estimators.surrogate as surrogate
import latentstruct.structures.sparsemap as sm

STATS: dict = {}


def _reset() -> None:
    STATS.update(sm=0.0, map=0.0, iters=[], support=[], support_max=0, capped=0, displacement=[])


def _instrument(eta_scale: float = 1.0) -> None:
    """Time the active set and its oracle, count iterations and support; record ||η γ(ẑ)|| (scaled by eta_scale)."""
    solver, oracle, pull_back = sm.sparsemap_active_set, sm._oracle, surrogate.Spigot.pull_back

    def timed_solver(structure, scores, lengths=None, **kw):
        t = time.process_time()
        sol = solver(structure, scores, lengths, **kw)
        STATS["sm"] += time.process_time() - t
        STATS["iters"].append(sol.iterations)
        STATS["capped"] += int(kw.get("max_iter") is not None and sol.iterations >= kw["max_iter"])
        support = sol.support_size
        STATS["support"].append(float(support.float().mean()))
        STATS["support_max"] = max(STATS["support_max"], int(support.max()))
        return sol

    def timed_oracle(*args, **kw):
        t = time.process_time()
        out = oracle(*args, **kw)
        STATS["map"] += time.process_time() - t
        return out

    def measured_pull_back(self, s, z, gamma_z, structure, lengths, downstream):
        gamma_z = gamma_z * eta_scale if eta_scale != 1.0 else gamma_z
        STATS["displacement"].append(float((self.eta * gamma_z).flatten(1).norm(dim=1).mean()))
        return pull_back(self, s, z, gamma_z, structure, lengths, downstream)

    sm.sparsemap_active_set, sm._oracle = timed_solver, timed_oracle
    surrogate.Spigot.pull_back = measured_pull_back  # SpigotCe inherits it


def _summary(n: int) -> dict:
    it = STATS["iters"]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {"sparsemap_cpu_per_100": 100 * STATS["sm"] / n, "map_cpu_per_100": 100 * STATS["map"] / n,
            "iterations_mean": mean(it), "iterations_max": max(it, default=0), "capped": STATS["capped"],
            "support_mean": mean(STATS["support"]), "support_max": STATS["support_max"],
            "eta_gamma_norm": mean(STATS["displacement"])}


def _denormals(tensors) -> int:
    n = 0
    for t in tensors:
        if t is not None and torch.is_tensor(t) and t.is_floating_point():
            a = t.detach().abs()
            n += int(((a > 0) & (a < torch.finfo(t.dtype).tiny)).sum())
    return n


def run(out_path: str, overrides: list[str]) -> None:
    _instrument()
    _reset()
    clock = {"eval": 0.0, "since": None, "depth": 0, "t0": None, "step": 0}
    train_mode = torch.nn.Module.train

    def train(self, mode=True):  # evaluation time = from the model's eval() to its train() (outermost call only)
        top = clock["depth"] == 0
        clock["depth"] += 1
        try:
            if top and not mode and clock["since"] is None:
                clock["since"] = time.process_time()
            elif top and mode and clock["since"] is not None:
                clock["eval"] += time.process_time() - clock["since"]
                clock["since"] = None
            return train_mode(self, mode)
        finally:
            clock["depth"] -= 1

    torch.nn.Module.train = train
    out = open(out_path, "w")
    steppers = {}

    def wrap(cls):
        step_fn = cls.step

        def step(self, *args, **kw):
            result = step_fn(self, *args, **kw)
            clock["step"] += 1
            now = time.process_time()
            if clock["t0"] is None:
                clock["t0"] = now
            if clock["step"] % 100 == 0:
                params = [p for g in self.param_groups for p in g["params"]]
                row = {"step": clock["step"], "cpu_per_100": now - clock["t0"] - clock["eval"],
                       "eval_cpu": clock["eval"], **_summary(100),
                       "denormal_params": _denormals(params), "denormal_grads": _denormals(p.grad for p in params),
                       "denormal_optimizer": _denormals(v for s in self.state.values() for v in s.values())}
                out.write(json.dumps(row) + "\n")
                out.flush()
                _reset()
                clock["eval"], clock["t0"] = 0.0, time.process_time()  # the denormal count is not a step's time
            return result

        steppers[cls] = step
        cls.step = step

    for cls in (torch.optim.AdamW, torch.optim.Adam):
        wrap(cls)
    sys.argv = [sys.argv[0], *overrides]
    runpy.run_module("latentstruct.train", run_name="__main__", alter_sys=True)


def replay(run_dir: str, checkpoints: list[str], batches: int, eta_scale: float) -> None:
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from latentstruct.data.base import iterate_batches
    from latentstruct.train import build_model

    torch.set_num_threads(1)
    _instrument(eta_scale)
    cfg = OmegaConf.load(os.path.join(run_dir, ".hydra", "config.yaml"))
    data = instantiate(cfg.dataset)
    fixed = list(iterate_batches(data.splits["train"], cfg.trainer.batch_size, 12345))[:batches]
    for path in checkpoints:
        torch.manual_seed(0)
        model = build_model(cfg, data.dims, data.extras)
        state = torch.load(path, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        model.train()
        _reset()
        t = time.process_time()
        for batch in fixed:
            loss = model(batch).loss
            model.zero_grad(set_to_none=True)
            loss.backward()
        cpu = time.process_time() - t
        print(json.dumps({"checkpoint": path, "step": state["step"], "eta_scale": eta_scale,
                          "cpu_per_100": 100 * cpu / len(fixed), **_summary(len(fixed))}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    p_run = sub.add_parser("run")
    p_run.add_argument("out")
    p_run.add_argument("overrides", nargs=argparse.REMAINDER)
    p_replay = sub.add_parser("replay")
    p_replay.add_argument("run_dir")
    p_replay.add_argument("checkpoints", nargs="+")
    p_replay.add_argument("--batches", type=int, default=10)
    p_replay.add_argument("--eta-scale", type=float, default=1.0)
    args = parser.parse_args()
    if args.mode == "run":
        run(args.out, args.overrides)
    else:
        replay(args.run_dir, args.checkpoints, args.batches, args.eta_scale)


if __name__ == "__main__":
    main()
