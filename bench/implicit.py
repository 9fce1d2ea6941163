"""Benchmark: the implicit gradient of the energy methods (L_CD, L_SSVM, L_DVN; ``latentstruct/models/implicit.py``)
— what one step costs and how close its H⁻¹v is — on the energy tables' configurations (NER, POS, bibtex).

    python bench/implicit.py --out results/bench/implicit.md [--datasets ner pos bibtex] [--pretrain-steps 100]
                             [--method-steps 5] [--rounds 3] [--solvers minres:0.2 ...] [--max-iter 20]
                             [--hvps double_backward forward_over_reverse] [--threads 1]

**State.** Per dataset, each configuration (``+experiment=<prefix>_{cd,ssvm,dvn}``, and ``_spen``, ``_explicit_cd``
for the ratios; composed and built by :func:`bench.tables.build_cell`, as a sweep job) is trained as train.py
trains: the L_CD configuration ``--pretrain-steps`` steps of its phase 0 (pretraining; the Hessian at initialisation
is near zero: ``configs/task/ner_energy.yaml``), whose networks and optimizer state L_SSVM and L_DVN then take (their
phase 0 is the same), and each of the three ``--method-steps`` steps of its method; SPEN and the explicit L_CD take
2 steps of each phase (timed only: their step's cost does not depend on the state).

**Accuracy** (implicit configurations, one training batch, θ and φ fixed): v = ∂L_prim/∂θ; the relative residual
‖v − Hx‖/‖v‖ of the seed's series after each term (``neumann_inverse_hvp``'s history, ``--series-terms`` terms, α as
configured); a reference w* = H⁻¹v by conjugate gradient run to 1e-6 (cap ``--ref-max-iter``), when H is positive
definite on its Krylov space (else the stop is reported); then, for the 20-term series and CG at each ``--tols``:
products, seconds, relative residual, ‖w − w*‖/‖w*‖, and the relative error of the implicit *gradient*
dL_prim/dφ against the one from w* and against the 20-term series' (what the code computed before).

**Products** (same batch): the two ways of making the Hessian-vector products (``task.hvp``,
``latentstruct/models/implicit.py``): ``double_backward`` (one ``create_graph`` backward of L_aux — its *setup* —
then one backward through that graph per product) and ``forward_over_reverse`` (per product, L_aux re-evaluated with
θ as dual numbers and differentiated once; no setup); per way, the seconds of the setup, of one product H v and of
one mixed product (∂²L_aux/∂φ∂θ) v (medians of ``--product-repeats``), the relative difference of its H v from the
double backward's, and of its implicit gradient (MINRES at ``--solvers``' first tolerance) from the double
backward's.

**Cost** (same process, interleaved so that the machine's load affects every row alike): ``--rounds`` rounds, each
one training step (train.py's: forward, backward, optimizer step) of SPEN, of the explicit L_CD, and of every implicit
configuration with the series and with each of ``--solvers`` (``solver:tol``, cap ``--max-iter``), the solvers'
rows once per way of making the products (``--hvps``; a row without a way named is ``double_backward``); the time of
one HVP; the seconds inside the solver, and inside the whole implicit term (``Task.timings``: ∇_θ L_aux, the solver,
the mixed product — what ``train.py`` records as ``time/implicit_share``). Reported: medians over the rounds.

The machine is a shared 2-core CPU (one torch thread): timings are under load, and only ratios within one run mean
anything. ``make bench-implicit`` runs the default and writes ``results/bench/implicit.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib.util
import itertools
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this tree's latentstruct

_spec = importlib.util.spec_from_file_location("bench_tables", ROOT / "bench" / "tables.py")
tables = sys.modules.setdefault("bench_tables", importlib.util.module_from_spec(_spec))
if not hasattr(tables, "build_cell"):
    _spec.loader.exec_module(tables)

from latentstruct.models.energy import auxiliary_loss  # noqa: E402
from latentstruct.models.implicit import (  # noqa: E402
    HVPS,
    ForwardOverReverse,
    cg_inverse_hvp,
    grad_or_zeros,
    hvp,
    implicit_gradient,
    minres_inverse_hvp,
    mixed_vp,
    neumann_inverse_hvp,
)
from latentstruct.records import git_commit  # noqa: E402

#: dataset -> (sweep, overrides, experiment prefix)
DATASETS = {
    "ner": ("energy_ner", ["dataset.features=False"], "ner"),
    "pos": ("energy_pos", ["dataset=twpos"], "ner"),
    "bibtex": ("energy_mlc", ["dataset=bibtex"], "mlc"),
}
PRIMARIES = ("cd", "ssvm", "dvn")
#: where the configurations are built and timed (``--device``; CUDA timings synchronise the device at both ends)
DEVICE = torch.device("cpu")


def _flat(ts) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in ts])


def _rel(a, b) -> float:
    a, b = _flat(a), _flat(b)
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _build(dataset: str, experiment: str, data_cache: dict, extra=()):
    sweep, overrides, prefix = DATASETS[dataset]
    cell = tables.Cell(f"energy/{dataset}", sweep, [f"+experiment={prefix}_{experiment}", *overrides], 1)
    return tables.build_cell(cell, DEVICE, data_cache, extra)


def _stepper(built):
    """train.py's step over the built configuration's phases: ``step(phase)``."""
    tc = built.cfg.trainer
    batches = {i: tables._batches(built.splits[p.split], tc.batch_size, tc.seed, tc.drop_last)
               for i, p in enumerate(built.phases)}
    counters = {i: itertools.count() for i in batches}

    def step(phase: int) -> None:
        tables._train_step(built.model, built.optimizer, batches[phase], phase, counters[phase],
                           built.phases[phase].steps)

    return step, batches


def _losses(model, batch):
    """(L_prim, L_aux, θ, φ, the batch as the step sees it) at the current θ, φ (no inner step), as
    ``_bilevel_step`` forms them."""
    batch = model.trim(batch) if hasattr(model, "trim") else batch
    theta, phi = model.inference_parameters(), model.energy_parameters()
    y_bar, nll = model.inference(model.infnet, batch)
    prim = model.primary_loss(batch, y_bar)
    aux = auxiliary_loss(nll, model.energy(batch, y_bar), model.lam)
    return prim, aux, theta, phi, batch


def _solve(prim, aux, theta, phi, solver, aux_fn=None):
    """The implicit gradient with ``solver`` as H⁻¹ (products by forward-over-reverse given ``aux_fn``), and what
    the solver saw and did."""
    rec: dict = {}

    def inverse(g, p, v):
        history: list[float] = []
        start = time.perf_counter()
        w = solver(g, p, v, history=history)
        rec.update(seconds=time.perf_counter() - start, w=w, v=v, g=g, history=history)
        return w

    rec["grad"] = implicit_gradient(prim, aux, theta, phi, inverse_hvp=inverse, aux_fn=aux_fn)
    return rec


def products(model, batch, prim, aux, theta, phi, v, args) -> dict:
    """The products block of the module docstring."""
    repeat = args.product_repeats

    def median(fn) -> float:
        return statistics.median(_timed(fn) for _ in range(repeat))

    g = grad_or_zeros(aux, theta, create_graph=True)
    want = hvp(g, theta, v)
    out = {"double_backward": {"setup_seconds": median(lambda: grad_or_zeros(aux, theta, create_graph=True)),
                               "product_seconds": median(lambda: hvp(g, theta, v)),
                               "mixed_seconds": median(lambda: mixed_vp(g, theta, phi, v))}}
    try:
        op = ForwardOverReverse(model.aux_function(batch), theta, phi)
        got = op(v)
    except (NotImplementedError, ValueError) as err:
        out["forward_over_reverse"] = {"error": str(err)}
        return out
    out["forward_over_reverse"] = {"setup_seconds": 0.0, "product_seconds": median(lambda: op(v)),
                                   "mixed_seconds": median(lambda: op.mixed(v)), "product_difference": _rel(got, want)}
    kind, _, tol = args.solvers[0].partition(":")
    solver = functools.partial(minres_inverse_hvp if kind == "minres" else cg_inverse_hvp, tol=float(tol),
                               max_iter=args.max_iter)
    torch.manual_seed(0)  # the same L_CD samples for both
    double = _solve(_losses(model, batch)[0], aux, theta, phi, solver)
    torch.manual_seed(0)
    forward = _solve(_losses(model, batch)[0], None, theta, phi, solver, aux_fn=model.aux_function(batch))
    out["forward_over_reverse"]["gradient_difference"] = _rel(forward["grad"], double["grad"])
    out["forward_over_reverse"]["products_used"] = [len(double["history"]), len(forward["history"])]
    return out


def accuracy(model, batch, args) -> dict:
    """The accuracy block of the module docstring for one batch."""
    torch.manual_seed(0)  # L_CD's samples
    prim, aux, theta, phi, batch = _losses(model, batch)
    alpha, terms = model.neumann_alpha, model.neumann_terms
    out: dict = {"alpha": alpha, "terms": terms}
    seed = _solve(prim, aux, theta, phi, functools.partial(neumann_inverse_hvp, terms=terms, alpha=alpha))
    if "g" not in seed:
        return None  # ∂L_prim/∂θ = 0: no implicit term on this batch
    g, v = seed["g"], seed["v"]
    out["hvp_seconds"] = statistics.median(_timed(lambda: hvp(g, theta, v)) for _ in range(5))
    out["products"] = products(model, batch, prim, aux, theta, phi, v, args)
    series: list[float] = []
    neumann_inverse_hvp(g, theta, v, terms=args.series_terms, alpha=alpha, history=series)
    out["series_residuals"] = series  # [k-1]: of the sum of the first k terms
    cg_ref = _solve(prim, aux, theta, phi, functools.partial(cg_inverse_hvp, tol=1e-6, max_iter=args.ref_max_iter))
    out["cg_reference"] = {"products": len(cg_ref["history"]),
                           "negative_curvature": bool(cg_ref["history"]) and cg_ref["history"][-1] == float("inf"),
                           "residuals": cg_ref["history"]}
    ref = _solve(prim, aux, theta, phi, functools.partial(minres_inverse_hvp, tol=1e-6, max_iter=args.ref_max_iter))
    converged = bool(ref["history"]) and ref["history"][-1] <= 1e-6
    out["reference"] = {"products": len(ref["history"]), "converged": converged,
                        "final_residual": ref["history"][-1] if ref["history"] else None,
                        "residuals": ref["history"]}
    explicit = torch.autograd.grad(prim, phi, retain_graph=True, allow_unused=True)
    explicit = [torch.zeros_like(p) if e is None else e for e, p in zip(explicit, phi, strict=True)]
    out["implicit_share_of_gradient"] = float((_flat(seed["grad"]) - _flat(explicit)).norm()
                                              / _flat(seed["grad"]).norm())

    def describe(rec) -> dict:
        hw = hvp(rec["g"], theta, rec["w"])
        row = {"products": len(rec["history"]), "seconds": rec["seconds"],
               "residual": float((_flat(rec["v"]) - _flat(hw)).norm() / _flat(rec["v"]).norm()),
               "w_norm_ratio": float(_flat(rec["w"]).norm() / _flat(ref["w"]).norm().clamp_min(1e-30)),
               "grad_error_vs_series20": _rel(rec["grad"], seed["grad"])}
        row["w_error_vs_reference"] = _rel(rec["w"], ref["w"])
        row["grad_error_vs_reference"] = _rel(rec["grad"], ref["grad"])
        return row

    out["solvers"] = {f"neumann {terms}": describe(seed) | {"products": terms}}
    for name, fn in (("minres", minres_inverse_hvp), ("cg", cg_inverse_hvp)):
        for tol in args.tols:
            rec = _solve(prim, aux, theta, phi, functools.partial(fn, tol=tol, max_iter=args.max_iter))
            out["solvers"][f"{name} tol {tol:g} cap {args.max_iter}"] = describe(rec) | {
                "stopped": "curvature" if rec["history"] and rec["history"][-1] == float("inf") else
                ("tolerance" if rec["history"] and rec["history"][-1] <= tol else "cap")}
    out["solvers"]["reference (minres 1e-6)"] = describe(ref) | {"products": len(ref["history"])}
    return out


def _timed(fn) -> float:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)
    start = time.perf_counter()
    fn()
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)
    return time.perf_counter() - start


def _solver_clock(model):
    """Wrap ``model.inverse_hvp`` so that the seconds spent in the solver are summed into the returned list."""
    spent = [0.0]
    original = type(model).inverse_hvp

    def inverse_hvp(self, history=None):
        solver = original(self, history)

        def timed(*a, **k):
            start = time.perf_counter()
            try:
                return solver(*a, **k)
            finally:
                spent[0] += time.perf_counter() - start

        return timed

    model.inverse_hvp = inverse_hvp.__get__(model)
    return spent


def run_dataset(dataset: str, args) -> dict:
    data_cache: dict = {}
    models = {}
    pretrained = None
    for experiment in (*args.primaries, "spen", "explicit_cd"):
        built = _build(dataset, experiment, data_cache)
        step, batches = _stepper(built)
        start = time.perf_counter()
        last = len(built.phases) - 1
        if experiment in args.primaries and pretrained is not None:  # phase 0 is the same for the three: copy it
            built.model.load_state_dict(pretrained[0])
            built.optimizer.load_state_dict(pretrained[1])
        elif experiment in args.primaries:
            for _ in range(args.pretrain_steps if last else 0):
                step(0)
            pretrained = (copy.deepcopy(built.model.state_dict()), copy.deepcopy(built.optimizer.state_dict()))
        else:  # SPEN and the explicit L_CD: timed only, their cost per step does not depend on the state
            for _ in range(2 if last else 0):
                step(0)
        for _ in range(args.method_steps if experiment in args.primaries else 2):
            step(last)
        print(f"  {dataset} {experiment}: {args.pretrain_steps} pretraining + method steps in "
              f"{time.perf_counter() - start:.1f} s", flush=True)
        models[experiment] = (built, step, batches, last)
    out: dict = {"accuracy": {}, "timing": {}}
    for primary in args.primaries:
        built, _, batches, last = models[primary]
        for tried in range(1, 11):  # a batch where L_prim depends on θ (a hinge may be inactive on every example)
            batch = next(batches[last])
            with built.model.double_backward_context(batch):  # cuDNN's LSTM off on CUDA, as the step runs it
                out["accuracy"][primary] = accuracy(built.model, batch, args)
            if out["accuracy"][primary] is not None:
                out["accuracy"][primary]["batches_tried"] = tried
                break
        else:
            out["accuracy"][primary] = {"none": "∂L_prim/∂θ = 0 on 10 batches"}
            continue
        ref, series = out["accuracy"][primary]["reference"], out["accuracy"][primary]["series_residuals"]
        print(f"  {dataset} {primary}: hvp {out['accuracy'][primary]['hvp_seconds']:.3f} s, series residual after "
              f"{min(20, len(series))} terms {series[min(20, len(series)) - 1]:.3g}, reference "
              f"{'converged' if ref['converged'] else 'not converged'} in {ref['products']}", flush=True)
    # cost: interleaved rounds
    rows = {"spen": [], "explicit_cd": []}
    for primary in args.primaries:
        rows[f"{primary} neumann"] = []
        for solver in args.solvers:
            for way in args.hvps:
                rows[f"{primary} {solver}" + ("" if way == "double_backward" else f" {way}")] = []
    solver_share = {k: [] for k in rows}
    implicit_share = {k: [] for k in rows}
    clocks = {p: _solver_clock(models[p][0].model) for p in args.primaries}
    failed: dict[str, str] = {}
    for _ in range(args.rounds):
        for name in rows:
            experiment, _, rest = name.partition(" ")
            solver, _, way = rest.partition(" ")
            built, step, _, last = models[experiment]
            if solver:
                kind, _, tol = solver.partition(":")
                built.model.inverse_solver = kind
                built.model.solver_tol, built.model.solver_max_iter = float(tol or 0), args.max_iter
                built.model.hvp = way or "double_backward"
                clocks[experiment][0] = 0.0
                before = built.model.timings()["implicit"]
            if name in failed:
                continue
            try:
                seconds = _timed(lambda: step(last))  # noqa: B023
            except (NotImplementedError, ValueError) as err:  # forward-over-reverse on a model without it
                failed[name] = str(err)
                continue
            rows[name].append(seconds)
            solver_share[name].append(clocks[experiment][0] if solver else 0.0)
            implicit_share[name].append(built.model.timings()["implicit"] - before if solver else 0.0)
    for name, times in rows.items():
        if name in failed:
            out["timing"][name] = {"error": failed[name]}
            continue
        out["timing"][name] = {"step_seconds": statistics.median(times), "all": times,
                               "solver_seconds": statistics.median(solver_share[name]),
                               "implicit_seconds": statistics.median(implicit_share[name])}
    return out


# ------------------------------------------------------------------------------------------------------ report


def _f(x, d=3) -> str:
    return "—" if x is None else f"{x:.{d}g}" if abs(x) < 1e-2 else f"{x:.{d}f}"


def cost_lines(res: dict, max_iter: int) -> list[str]:
    """The cost table of one dataset's results (``res["timing"]``)."""
    lines = ["### Cost per training step of the method (seconds, medians)", "",
             "| row | s / step | × SPEN | in the solver (s) | solver share | implicit term (s) | implicit share |",
             "|---|---|---|---|---|---|---|"]
    spen = res["timing"]["spen"]["step_seconds"]
    for name, t in res["timing"].items():
        if "error" in t:
            lines.append(f"| {name} | failed: {t['error']} |  |  |  |  |  |")
            continue
        share = t["solver_seconds"] / t["step_seconds"] if t["step_seconds"] else 0
        implicit = t.get("implicit_seconds")
        whole = "—" if implicit is None else f"{implicit:.3f}"
        whole_share = "—" if implicit is None else f"{100 * implicit / t['step_seconds']:.0f} %"
        lines.append(f"| {name} | {t['step_seconds']:.3f} | {t['step_seconds'] / spen:.1f} | "
                     f"{t['solver_seconds']:.3f} | {100 * share:.0f} % | {whole} | {whole_share} |")
    return lines + ["", f"Rows `<primary> <solver>:<tol> [<hvp>]`: that solver stopped at that relative residual or "
                    f"after {max_iter} products, its products made by double backward unless `forward_over_reverse` "
                    "is named. Implicit term: ∇_θ L_aux, the solver and the mixed product (what train.py records as "
                    "`time/implicit_share`; — where the run predates it).", ""]


def product_lines(res: dict) -> list[str]:
    """The products table (double backward vs forward-over-reverse) of one dataset's results, if measured."""
    ways = {p: acc["products"] for p, acc in res["accuracy"].items() if "products" in acc}
    if not ways:
        return []
    lines = ["### Products: double backward vs forward-over-reverse (seconds, one batch)", "",
             "| configuration | way | setup | one H v | one mixed product | × double backward (H v) | "
             "H v difference | implicit gradient difference | products (db, fo-r) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for primary, way in ways.items():
        base = way["double_backward"]["product_seconds"]
        for name, w in way.items():
            if "error" in w:
                lines.append(f"| L_{primary.upper()} | {name} | failed: {w['error']} |  |  |  |  |  |  |")
                continue
            used = w.get("products_used")
            lines.append(
                f"| L_{primary.upper()} | {name} | {w['setup_seconds']:.4f} | {w['product_seconds']:.4f} | "
                f"{w['mixed_seconds']:.4f} | {w['product_seconds'] / base:.2f} | "
                f"{_f(w.get('product_difference'))} | {_f(w.get('gradient_difference'))} | "
                f"{'' if used is None else f'{used[0]}, {used[1]}'} |")
    return lines + ["", "Setup: the `create_graph` backward of L_aux that every double-backward product then "
                    "reuses (forward-over-reverse has none). Differences: relative, against the double backward's "
                    "H v and its implicit gradient (MINRES at the first `--solvers` tolerance), float32 — round-off, "
                    "if the two ways compute the same thing.", ""]


def render(sheet: dict) -> list[str]:
    runs = sheet.get("runs") or [sheet]
    lines = [
        "# The implicit gradient's cost and accuracy (`bench/implicit.py`)", "",
        "**Status: reduced protocol** — a timing and accuracy benchmark, not a paper table: one batch per "
        "configuration for the accuracy, a few interleaved training steps per row for the cost, after a short "
        "pretraining; the datasets and settings each run measured are listed below (reading: "
        "docs/implicit_gradient.md).", "",
        *[f"- Generated {r['generated']} by `{r['command']}` at commit {r['commit']}: "
          f"{', '.join(r['args'].get('primaries', PRIMARIES))}, {r['args']['pretrain_steps']} pretraining steps then "
          f"{r['args']['method_steps']} method steps from the configuration's seed, {r['args']['rounds']} rounds."
          for r in runs], "",
        f"Torch "
        f"{sheet['torch']}, {sheet.get('device', 'cpu').upper()}, {sheet['threads']} torch thread, on "
        + (f"{sheet['gpu']} (the device machine's 16 cores; " if sheet.get("gpu") else
           "a shared 2-core machine under load from other jobs (")
        + "load averages at the start and end of each run: "
        + "; ".join(f"{' → '.join(f'{x:.1f}' for x in r['load_average'])}" for r in runs if r.get("load_average"))
        + ("" if sheet.get("gpu") else "; absolute seconds are many times the unloaded ones and noisy")
        + "; every row of one table was timed "
        "interleaved in one process, so the ratios between rows are the comparable numbers). One training batch for "
        "the accuracy block; interleaved rounds of one training step per row for the cost block (medians).", "",
        "Systems: the series with K terms returns α Σ_{i≤K} (I − αH)^i v (it solves no system; its residual is "
        "(I − αH)^{K+1} v); MINRES and CG solve H w = v (no damping) and stop at relative residual `tol` or after "
        "`cap` products; CG also at a direction of non-positive curvature (then it returns its last iterate). "
        "Series residual after k terms: of the sum of the first k terms (k − 1 products).", "",
    ]
    for dataset, res in sheet["datasets"].items():
        a = res.get("args", sheet["args"])  # the run's that measured this dataset
        lines += [f"## {dataset}", ""] + cost_lines(res, a["max_iter"]) + product_lines(res)
        for primary, acc in res["accuracy"].items():
            if "none" in acc:
                lines += [f"### {dataset} L_{primary.upper()}: {acc['none']}", ""]
                continue
            ref = acc["reference"]
            series = acc["series_residuals"]
            picks = [k for k in (1, 2, 5, 10, 20, 50, 100, 200, 500) if k <= len(series)]
            lines += [f"### {dataset} L_{primary.upper()}: H⁻¹v on one batch", "",
                      f"One HVP: {acc['hvp_seconds']:.3f} s. α = {acc['alpha']:g}. The implicit term is "
                      f"{100 * acc['implicit_share_of_gradient']:.0f} % of the gradient's norm (series, "
                      f"‖g − ∂L_prim/∂φ‖ / ‖g‖). Reference w* = H⁻¹v by MINRES (tol 1e-6, cap {a['ref_max_iter']}): "
                      + ("converged in " + str(ref["products"]) + " products" if ref["converged"] else
                         f"not converged after {ref['products']} products (residual {_f(ref['final_residual'])}; "
                         "the errors against w* below are against this iterate)")
                      + ". CG to 1e-6 " + (f"stopped on non-positive curvature after "
                                           f"{acc['cg_reference']['products']} products"
                                           if acc["cg_reference"]["negative_curvature"] else
                                           f"ran {acc['cg_reference']['products']} products") + ".", "",
                      "Series residual ‖v − H x_k‖/‖v‖ after k terms: "
                      + ", ".join(f"k={k}: {_f(series[k - 1])}" for k in picks) + ".", "",
                      "| solver | products | seconds | residual | ‖w‖/‖w*‖ | w error vs w* | gradient error vs w* | "
                      "gradient change vs series-20 | stopped |", "|---|---|---|---|---|---|---|---|---|"]
            for name, row in acc["solvers"].items():
                lines.append(f"| {name} | {row['products']} | {row['seconds']:.3f} | {_f(row['residual'])} | "
                             f"{_f(row['w_norm_ratio'])} | {_f(row.get('w_error_vs_reference'))} | "
                             f"{_f(row.get('grad_error_vs_reference'))} | {_f(row['grad_error_vs_series20'])} | "
                             f"{row.get('stopped', '')} |")
            lines.append("")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the Markdown report (and .json beside it)")
    parser.add_argument("--datasets", nargs="*", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--primaries", nargs="*", default=list(PRIMARIES), choices=PRIMARIES)
    parser.add_argument("--pretrain-steps", type=int, default=100)
    parser.add_argument("--method-steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--series-terms", type=int, default=200)
    parser.add_argument("--ref-max-iter", type=int, default=200)
    parser.add_argument("--tols", type=float, nargs="*", default=[0.3, 0.2, 0.1, 0.03])
    parser.add_argument("--solvers", nargs="*", default=["minres:0.2", "minres:0.1"],
                        help="solver:tol pairs timed beside the series in the cost block")
    parser.add_argument("--max-iter", type=int, default=20, help="the solvers' cap (both blocks)")
    parser.add_argument("--hvps", nargs="*", default=list(HVPS), choices=HVPS,
                        help="the ways of making the products timed in the cost block's solver rows")
    parser.add_argument("--product-repeats", type=int, default=5, help="timings per product (medians)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the GPU check runs it on cuda)")
    parser.add_argument("--merge", type=Path, nargs="*", help="only write --out from these sheets' datasets (runs "
                        "of one dataset each, e.g. run side by side)")
    args = parser.parse_args(argv)
    if args.merge:
        sheets = [json.loads(p.read_text()) for p in args.merge]
        for sh in sheets:
            for res in sh["datasets"].values():
                res.setdefault("args", sh["args"])
        for sh in sheets:  # the --out of a run is where it wrote, a machine path: its name only
            words = sh["command"].split()
            sh["command"] = " ".join(Path(w).name if i and words[i - 1] == "--out" else w
                                     for i, w in enumerate(words))
        sheet = {**sheets[0], "datasets": {k: v for sh in sheets for k, v in sh["datasets"].items()},
                 "runs": [{k: sh.get(k) for k in ("generated", "commit", "command", "args", "load_average")}
                          for sh in sheets]}
        args.out.with_suffix(".json").write_text(json.dumps(sheet, indent=1) + "\n")
        args.out.write_text("\n".join(render(sheet)) + "\n")
        print(f"wrote {args.out}")
        return 0
    torch.set_num_threads(args.threads)
    global DEVICE
    DEVICE = torch.device(args.device)
    sha, dirty = git_commit()
    commit = sha[:7] + ("+dirty" if dirty else "")
    words = list(argv if argv is not None else sys.argv[1:])
    words = [Path(w).name if i and words[i - 1] == "--out" else w for i, w in enumerate(words)]  # no machine paths
    sheet = {"generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit,
             "command": "python bench/implicit.py " + " ".join(words),
             "torch": torch.__version__, "threads": torch.get_num_threads(), "device": DEVICE.type,
             **({"gpu": torch.cuda.get_device_name(DEVICE)} if DEVICE.type == "cuda" else {}),
             "load_average": [os.getloadavg()[0]], "args": {
                 k: getattr(args, k) for k in ("pretrain_steps", "method_steps", "rounds", "series_terms",
                                               "ref_max_iter", "tols", "solvers", "max_iter", "primaries", "hvps",
                                               "product_repeats")},
             "datasets": {}}
    for dataset in args.datasets:
        sheet["datasets"][dataset] = {**run_dataset(dataset, args), "args": sheet["args"]}
        sheet["load_average"] = [sheet["load_average"][0], os.getloadavg()[0]]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(sheet, indent=1) + "\n")
        args.out.write_text("\n".join(render(sheet)) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
