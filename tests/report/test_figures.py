"""What the figures show (latentstruct/report/figures.py, drawing.py, listops.py): legends off the data, axis labels
that name the metric, phase boundaries, readable trees, and a redraw from the data written beside each PNG."""

import itertools
import json

import pandas as pd
import pytest
import torch
import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg

from latentstruct.report import figures, tables
from latentstruct.report.drawing import draw_tree, tree_figure
from latentstruct.report.listops import trees_figure
from tests.helpers import ROOT as REPO
from tests.report.test_tables import _four_runs, _run, _spec


def _with_phases(run, phases, epochs_per_step: float = 0.02) -> None:
    """Give a fake run ``trainer.phases`` and a history with an ``epoch`` column (50 steps per epoch)."""
    config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    config["trainer"] = {"phases": [{"split": s, "epochs": e} for s, e in phases]}
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    steps = list(range(50, 50 * (sum(e for _, e in phases) + 1), 50))
    pd.DataFrame(
        {
            "step": steps,
            "epoch": [s * epochs_per_step for s in steps],
            "valid/acc": range(len(steps)),
            "test/acc": range(len(steps)),
            "test/v_measure": range(len(steps)),
        }
    ).to_csv(run / "history.csv", index=False)


def _drawn(png):
    """The figure drawn from the data file beside ``png``, laid out as in the PNG."""
    fig = figures.render(json.loads(png.with_suffix(".data.json").read_text()))
    FigureCanvasAgg(fig).draw()
    return fig


def _legend_clear_of_the_data(fig) -> None:
    renderer = fig.canvas.get_renderer()
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)
    legend = fig.legends[0].get_window_extent(renderer)
    for ax in fig.axes:
        assert not legend.overlaps(ax.get_window_extent(renderer)), "the legend covers an axes"


def _curve_runs(root):
    for exp in ("synthetic_marginals", "synthetic_spigot"):
        for seed in (1, 2):
            _run(root / "curves", f"{exp}_{seed}", exp, k=10, acc=80 + seed, seed=seed, history=True)
    for exp in ("synthetic_ste_i", "synthetic_spigot"):
        for steps, eta, seed in itertools.product((1, 5), (0.1, 1.0), (1, 2)):
            _run(
                root / "sweep",
                f"{exp}_{steps}_{eta}_{seed}",
                exp,
                k=10,
                steps=steps,
                eta=eta,
                acc=70 + steps,
                seed=seed,
            )


def test_every_figure_has_its_legend_outside_the_axes_and_names_its_metric(tmp_path):
    _curve_runs(tmp_path)
    _four_runs(tmp_path / "spec_runs")
    for seed in (1, 2):
        _run(tmp_path / "rows", f"a{seed}", "synthetic_spigot", acc=80 + seed, seed=seed, history=True)
    spec = _spec(tmp_path)
    pngs = {
        "learning": figures.learning_curves(tmp_path / "curves", tmp_path / "fig" / "curves.png"),
        "setting": figures.setting_curves(spec, tmp_path / "spec_runs", "test/acc", tmp_path / "fig" / "s.png"),
    }
    figures.inner_steps(tmp_path / "sweep", tmp_path / "fig" / "inner.png")
    figures.row_curves(spec, tmp_path / "rows", "valid/acc", tmp_path / "fig" / "rows.png")
    pngs.update(inner=tmp_path / "fig" / "inner.png", rows=tmp_path / "fig" / "rows.png")
    labels = {}
    for name, png in pngs.items():
        assert png.read_bytes()[:4] == b"\x89PNG"
        fig = _drawn(png)
        _legend_clear_of_the_data(fig)
        labels[name] = [ax.get_ylabel() for ax in fig.axes]
        assert all(ax.get_xlabel() for ax in fig.axes) or name == "setting"
    assert labels["learning"] == labels["inner"] == ["test accuracy (%)", "test V-measure (%)"]
    assert labels["setting"] == ["test Accuracy (median ± s.e.)"]  # the split and the spec's label of test/acc
    assert labels["rows"] == ["valid Accuracy"]  # valid/acc, named by the spec's label of acc
    rows = json.loads((tmp_path / "fig" / "rows.data.json").read_text())
    assert rows["panels"][0]["xlabel"] == "training step"  # the fake histories have no epoch column


def test_a_long_legend_goes_below_many_panels(tmp_path):
    """Seven long row labels over two panels (the MLC figure): one legend, below, clear of both axes."""
    data = {
        "figure": "curves",
        "title": "t",
        "panel_width": 6.5,
        "panels": [
            {
                "title": p,
                "xlabel": "epoch",
                "ylabel": "valid example F1 (%)",
                "series": [
                    figures._series(
                        f"method {i} with a long descriptive label (n=3)",
                        i,
                        [1, 2, 3],
                        [i, i + 1, 0],
                        band=([i - 1] * 3, [i + 1] * 3),
                    )
                    for i in range(7)
                ],
            }
            for p in ("a", "b")
        ],
    }
    fig = figures.render(data)
    FigureCanvasAgg(fig).draw()
    _legend_clear_of_the_data(fig)
    assert len(fig.legends[0].get_texts()) == 7  # shared: a method once, not once per panel


def test_phase_boundaries_come_from_the_runs_configs(tmp_path):
    spec = tables.load_spec(_spec(tmp_path))
    for seed in (1, 2):
        _with_phases(_run(tmp_path / "runs", f"a{seed}", "synthetic_spigot", seed=seed), [("train", 2), ("train", 3)])
    _with_phases(_run(tmp_path / "runs", "b", "synthetic_other"), [("train", 4)])  # one phase: no mark
    figures.row_curves(spec, tmp_path / "runs", "valid/acc", tmp_path / "rows.png")
    panel = json.loads((tmp_path / "rows.data.json").read_text())["panels"][0]
    assert panel["xlabel"] == "epoch" and panel["phases"] == [{"x": 2.0, "label": "pretraining | method"}]
    fig = _drawn(tmp_path / "rows.png")
    marks = [line for line in fig.axes[0].lines if list(line.get_xdata()) == [2.0, 2.0]]
    assert len(marks) == 1 and "pretraining | method" in [t.get_text() for t in fig.axes[0].texts]
    _legend_clear_of_the_data(fig)

    # on a step axis (Figure 2) the boundary is the step of that epoch; other splits are named
    for seed in (1, 2):
        run = _run(tmp_path / "vae", f"v{seed}", "synthetic_spigot", k=10, seed=seed)
        _with_phases(run, [("labelled", 3), ("train", 1)])
    figures.learning_curves(tmp_path / "vae", tmp_path / "steps.png", experiments=("synthetic_spigot",))
    panels = json.loads((tmp_path / "steps.data.json").read_text())["panels"]
    assert [p["phases"] for p in panels] == [[{"x": 150.0, "label": "labelled | train"}]] * 2

    # one phase, no boundary
    figures.row_curves(spec, tmp_path / "runs" / "b", "valid/acc", tmp_path / "none.png")
    assert json.loads((tmp_path / "none.data.json").read_text())["panels"][0]["phases"] == []


def test_redraw_reproduces_a_figure_from_its_data_file(tmp_path):
    _curve_runs(tmp_path)
    png = figures.learning_curves(tmp_path / "curves", tmp_path / "a" / "curves.png")
    data = tmp_path / "a" / "curves.data.json"
    assert figures.main(["redraw", str(data), "--out", str(tmp_path / "b.png")]) == 0
    assert (tmp_path / "b.png").read_bytes() == png.read_bytes()
    series = json.loads(data.read_text())["panels"][0]["series"]
    assert [s["label"] for s in series] == ["Softmax", "SPIGOT"] and series[1]["y"] == [50.0, 70.0, 81.5]

    tree = draw_tree(["It", "'s", "good"], [3, 3, 0], tmp_path / "t" / "tree.png", title="SPIGOT — seed 301")
    assert figures.redraw(tree.with_suffix(".data.json"), tmp_path / "t2.png").read_bytes() == tree.read_bytes()
    with pytest.raises(SystemExit):
        figures.main(["redraw"])


def _no_overlap(boxes) -> None:
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), "two words overlap"


@pytest.mark.parametrize(
    "tokens",
    [
        ["A", "taut", ",", "intelligent", "psychological", "drama", "."],
        ["extraordinarily", "incomprehensible", "i", "counterrevolutionaries", "."],
    ],
)
def test_tree_words_do_not_overlap(tokens):
    fig = tree_figure(tokens, [0] + [1] * (len(tokens) - 1), "SPIGOT-CE — seed 301")
    FigureCanvasAgg(fig).draw()
    words = [t for t in fig.axes[0].texts if (t.get_gid() or "").startswith("token-")]
    assert [t.get_text() for t in words] == ["ROOT", *tokens]
    _no_overlap([t.get_window_extent() for t in words])
    canvas = fig.axes[0].get_window_extent()
    assert all(canvas.contains(*t.get_window_extent().corners()[i]) for t in words for i in (0, 3))  # not cut off


def test_listops_tree_leaves_do_not_overlap():
    tokens = ["[MIN", "2", "9", "[MED", "4", "3", "]", "[SM", "1", "]", "]"]
    n = len(tokens)
    z = torch.zeros(n, n)
    for i in range(n - 1):  # a right-branching tree
        z[i, n - 1] = 1
    spans = [[int(i), int(j)] for i, j in z.nonzero().tolist()]
    data = {
        "figure": "listops-trees",
        "title": "t",
        "columns": 2,
        "panels": [
            {"title": f"chart: SPIGOT-CE  (F1 {k}, label 2)", "tokens": tokens, "spans": spans, "color": "C0"}
            for k in range(2)
        ],
    }
    fig = trees_figure(data)
    FigureCanvasAgg(fig).draw()
    for ax in fig.axes:
        _no_overlap([t.get_window_extent() for t in ax.texts if t.get_gid() == "leaf"])


@pytest.mark.parametrize(
    "spec, metric, label",
    [
        ("energy/mlc", "valid/acc", "valid example F1 (%)"),  # MLC's acc is the example F1 x 100
        ("energy/ner", "valid/acc", "valid span F1 (%)"),
        ("energy/pos", "valid/acc", "valid token accuracy (%)"),
        ("direct/sorting", "test/acc", "% sorted (test sequences sorted perfectly)"),  # the label says the split
        ("direct/vae", "test/acc", "test accuracy"),
        ("direct/vae", "valid/nope", "valid/nope"),  # no label: the metric itself
    ],
)
def test_axis_labels_name_the_metric_of_the_papers_specs(spec, metric, label):
    assert figures._axis_label(tables.load_spec(REPO / "experiments" / f"{spec}.yaml"), metric) == label


def _points(data: dict) -> list:
    """The drawn numbers of a figure description, rounded as the Markdown tables print them."""
    return [
        [
            s["label"],
            [round(v, 2) for v in s["x"]],
            [round(v, 2) for v in s["y"]],
            [round(v, 2) for v in s.get("err", [])],
        ]
        for panel in data["panels"]
        for s in panel["series"]
    ]


def test_from_table_redraws_the_figures_of_a_committed_table_without_its_runs(tmp_path):
    """setting-curves and Figure 3 rebuilt from the Markdown alone draw what the runs drew; the description says so."""
    _curve_runs(tmp_path)
    _four_runs(tmp_path / "spec_runs")
    spec = yaml.safe_load(_spec(tmp_path).read_text())
    spec["output"] = str(tmp_path / "t1.md")
    spec["reproduce"] = {
        "sweeps": [],
        "steps": [{"figure": "setting-curves", "metric": "test/acc", "out": str(tmp_path / "s.png")}],
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec, allow_unicode=True))
    runs = tables.load_runs(tmp_path / "spec_runs")
    tables.write_markdown(
        tables.build_table(tmp_path / "spec.yaml", runs),
        tables.load_spec(tmp_path / "spec.yaml"),
        tmp_path / "t1.md",
        runs,
    )
    from_runs = json.loads(
        figures.setting_curves(tmp_path / "spec.yaml", runs, "test/acc", tmp_path / "s.png")
        .with_suffix(".data.json")
        .read_text()
    )
    figure3 = {
        "paper": "spigot",
        "table": "figure3_inner_steps",
        "title": "Figure 3",
        "command": "make fig3",
        "paper_protocol": {"length": "10,000 steps", "steps": 10000, "runs": 4},
        "reproduce": {"sweeps": [], "steps": [{"figure": "inner-steps", "out": str(tmp_path / "f3.png")}]},
    }
    (tmp_path / "f3.yaml").write_text(yaml.safe_dump(figure3, allow_unicode=True))
    figures.inner_steps(tmp_path / "sweep", tmp_path / "f3.png", spec=tmp_path / "f3.yaml")
    inner = json.loads((tmp_path / "f3.data.json").read_text())
    companion = (tmp_path / "f3.md").read_text().splitlines()
    assert companion[2].startswith("**Status: reduced protocol** — 2 run(s) per cell instead of the paper's 4")
    assert json.loads((tmp_path / "f3.json").read_text())["status"] == "reduced"
    assert "- regenerate with: `make fig3`" in companion

    written = figures.from_table(tmp_path / "spec.yaml") + figures.from_table(tmp_path / "f3.yaml")
    assert written == [tmp_path / "s.png", tmp_path / "f3.png"]
    rebuilt = [json.loads(p.with_suffix(".data.json").read_text()) for p in written]
    assert _points(rebuilt[0]) == _points(from_runs) and _points(rebuilt[1]) == _points(inner)
    assert rebuilt[1]["title"] == inner["title"]  # the seeds counted from the companion's provenance
    assert rebuilt[0]["source"] == f"rebuilt from the committed table {tmp_path / 't1.md'}; run records not kept"
    (tmp_path / "other").mkdir()
    with pytest.raises(ValueError, match="no setting-curves or inner-steps figure"):
        figures.from_table(_spec(tmp_path / "other"))


def test_setting_curves_draw_a_panel_per_section_so_no_line_joins_two_datasets():
    """The semi-supervised VAE's settings run over MNIST then Fashion-MNIST: one panel drew a line from MNIST's last
    label count to Fashion-MNIST's first. With two sections with runs, each gets its panel, its own x axis and its
    ticks without the dataset; a section without runs gets none; one section (or none) keeps one panel."""
    settings = [f"{d} {n}" for d in ("mnist", "fashion") for n in (50, 100)]
    spec = {"table": "t", "title": "T", "aggregate": "mean_std", "metrics": [{"name": "test/acc", "label": "acc"}],
            "settings": [{"name": s} for s in [*settings, "cifar 50"]], "rows": [{"name": "a"}, {"name": "b"}],
            "sections": [{"title": "MNIST", "settings": settings[:2]}, {"title": "Fashion", "settings": settings[2:]},
                         {"title": "CIFAR", "settings": ["cifar 50"]}]}
    df = pd.DataFrame([{"row": r, "setting": s, "metric": "test/acc", "ours": float(i), "ours_err": 0.0, "n_runs": 1,
                        "paper": 90.0 if r == "a" else None} for i, (r, s) in enumerate(itertools.product("ab",
                                                                                                         settings))])
    data = figures._setting_data(spec, df, "test/acc")
    assert [p["title"] for p in data["panels"]] == ["MNIST: n = 1 run per line", "Fashion: n = 1 run per line"]
    for panel in data["panels"]:
        assert panel["xticklabels"] == ["50", "100"] and panel["xticks"] == [0, 1]
        assert [s["x"] for s in panel["series"]] == [[0, 1]] * 3  # a's line, a's paper (dashed), b's line
    assert data["panels"][1]["series"][0]["y"] == [2.0, 3.0]
    one = figures._setting_data({**spec, "sections": spec["sections"][:1]}, df, "test/acc")
    assert len(one["panels"]) == 1 and one["panels"][0]["xticklabels"] == settings
