"""The gradient microscope (latentstruct/diagnose.py) against hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from latentstruct import diagnose
from latentstruct.estimators import Sfe
from latentstruct.structures import Categorical


def _softmax_case():
    s = torch.tensor([[0.3, -0.2, 0.9]], dtype=torch.float64)
    c = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    p = s.softmax(-1)
    return s, c, p, p * (c - (p * c).sum())  # ∇_s Σ_k p_k c_k = p ⊙ (c − <p, c>)


def test_the_exact_gradient_of_a_softmax_with_a_linear_loss():
    s, c, _, expected = _softmax_case()
    got = diagnose.exact_gradient(s, Categorical().enumerate(3), lambda z: z.flatten(1) @ c.to(z.dtype))
    torch.testing.assert_close(got, expected)


def test_sfe_mean_gradient_is_the_exact_one_within_monte_carlo_error():
    s, c, _, expected = _softmax_case()
    torch.manual_seed(0)
    loss = lambda z: z.flatten(1) @ c.to(z.dtype)  # noqa: E731
    grads = torch.stack([diagnose._estimator_gradient(Sfe(), Categorical(), s, loss) for _ in range(4000)])
    mean, stderr = grads.mean(0), grads.std(0) / math.sqrt(len(grads))
    assert ((mean - expected).abs() <= 4 * stderr + 1e-12).all(), (mean, expected, stderr)
    assert ((mean - expected).abs() > 1e-3).any()  # a Monte-Carlo mean, not the exact value by construction


def test_ste_i_points_along_the_loss_gradient_so_its_cosine_is_known(monkeypatch):
    """STE-I's backward is a positive multiple of γ = ∂L/∂z = c for a linear loss, so its cosine with the exact
    gradient is cos(c, p ⊙ (c − <p, c>)), whatever the scores' draw."""
    monkeypatch.setitem(diagnose.STRUCTURES, "cat3", (Categorical(), 3, (3,)))
    got = diagnose.measure("ste_i", diagnose.build_estimator("ste_i"), "cat3", "linear", batch=4, draws=3, seed=1)
    gen = torch.Generator().manual_seed(1)
    scores = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    c = diagnose.make_loss("linear", (3,), gen)(torch.eye(3, dtype=torch.float64))  # L(e_k) = c_k
    p = scores.softmax(-1)
    exact = p * (c - (p * c).sum(-1, keepdim=True))
    expected = torch.nn.functional.cosine_similarity(c.expand_as(exact), exact, dim=-1).mean()
    assert got.deterministic and got.variance == 0 and got.draws == 1
    assert got.cosine == pytest.approx(float(expected), abs=1e-9)


def test_a_structure_an_estimator_cannot_serve_is_said_not_measured():
    got = diagnose.measure("marginals", diagnose.build_estimator("marginals"), "matching", "linear", 2, 3, 0)
    assert isinstance(got, str) and "NotImplementedError" in got


def test_main_writes_the_tables_the_csv_and_the_figure(tmp_path):
    out = tmp_path / "lab" / "gradients.md"
    assert diagnose.main(["--estimators", "ste_i", "sfe", "--structures", "categorical", "matching", "--draws", "5",
                          "--out", str(out)]) == 0
    text = out.read_text()
    assert "| `ste_i` (det.) |" in text and "| `sfe` |" in text
    assert "- `sfe` on matching:" in text  # no exact sampler / marginals for matchings
    assert out.with_suffix(".png").stat().st_size > 0 and len(out.with_suffix(".csv").read_text().splitlines()) > 3


@pytest.mark.parametrize("name", ["sequence", "binary_tree", "projective", "nonprojective"])
def test_past_enumeration_the_exact_gradient_is_the_marginals_jvp(name):
    """At the enumerable size the JVP of the marginals equals the enumerated gradient for the linear and the
    quadratic loss (linear on 0/1 vertices); the sampled reference of the mlp loss is within its standard error."""
    structure, n, shape = diagnose.STRUCTURES[name]
    assert diagnose.part_shape(name, n) == shape
    vertices = structure.enumerate(n)
    for loss_name in ("linear", "quadratic"):
        gen = torch.Generator().manual_seed(3)
        scores = torch.randn(2, *shape, generator=gen, dtype=torch.float64)
        loss = diagnose.make_loss(loss_name, shape, gen)
        exact = diagnose.exact_gradient(scores, vertices, loss)
        torch.testing.assert_close(diagnose.marginal_gradient(scores, structure, loss.vertex_weights), exact)
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(2, *shape, generator=gen, dtype=torch.float64)
    loss = diagnose.make_loss("mlp", shape, gen)
    assert not hasattr(loss, "vertex_weights")
    exact = diagnose.exact_gradient(scores, vertices, loss)
    ref, se = diagnose.sampled_gradient(scores, structure, loss, 4000, seed=0)
    assert ((ref - exact).abs() <= 5 * se + 1e-9).all()
    assert float((ref - exact).norm() / exact.norm()) < 0.5


def test_a_real_size_cell_uses_the_jvp_and_skips_enumerating_estimators():
    got = diagnose.measure("marginals", diagnose.build_estimator("marginals"), "projective", "linear", 2, 3, 0, n=12)
    assert got.exact == "marginals JVP" and got.n == 12 and got.cosine == pytest.approx(1.0)  # exact for a linear L
    assert len(got.examples["cosine"]) == 2
    assert "enumerates" in diagnose.measure("exact", diagnose.build_estimator("exact"), "projective", "linear", 2, 3,
                                            0, n=12)
    mlp = diagnose.measure("ste_i", diagnose.build_estimator("ste_i"), "sequence", "mlp", 2, 3, 0, n=7,
                           reference_samples=300)
    assert mlp.exact == "300 exact samples" and 0 < mlp.reference_se < 1


def test_real_sizes_a_second_run_merged_and_the_page_rebuilt_from_the_records(tmp_path):
    common = ["--structures", "sequence", "--sizes", "5", "--draws", "3", "--real-draws", "3",
              "--reference-samples", "100"]
    first, second = tmp_path / "a" / "gradients.md", tmp_path / "b" / "gradients.md"
    assert diagnose.main(["--estimators", "ste_i", "exact", *common, "--out", str(first)]) == 0
    assert diagnose.main(["--estimators", "marginals", *common, "--real-only", "--out", str(second)]) == 0
    text = first.read_text()
    assert "| `ste_i` (det.) | " in text and "sequence n=5" in text
    assert "- `exact` on sequence n = 5: enumerates" in text
    assert diagnose.main(["--report-only", "--merge", str(second), "--out", str(first)]) == 0
    merged = first.read_text()
    assert "| `marginals` (det.) | — | 0." in merged.split("### Cosine of one call")[1]  # real size only
    row = "| `ste_i` (det.) |"
    assert merged.split("## Cost")[0].count(row) == text.split("## Cost")[0].count(row)
