"""Every structure against the DESIGN.md §4 contract, by enumeration (§9).

One table of cases, one set of checks: ``map`` is a best vertex, ``log_partition`` and ``marginals`` equal the
enumerated sums, ``sparsemap`` is the Euclidean projection onto conv(Z) (inside the hull, first-order optimal against
every vertex, equal to an independent QP), ``sample`` has the perturb-and-MAP distribution and ``exact_sample`` the
Gibbs one (statistically, against the same computed by brute force over the vertices), float64 gradchecks, and padded
batches equal the cropped problems. Algorithm-specific checks (back-pointers, numerical range, the vertex counts) live
in each structure's own test file; ``enumerate`` is checked there against an independent brute force.
"""

from __future__ import annotations

import pytest
import torch

from latentstruct.structures import Structure, gumbel_like
from latentstruct.structures.parts import parts_to_dense
from tests.structures.reference import (
    CASES,
    brute_log_partition,
    brute_marginals,
    brute_max,
    distance_to_hull,
    enumerated,
    gibbs,
    qp_over_vertices,
    random_scores,
    total_variation,
    vertex_scores,
)

SIZED = [pytest.param(c, n, id=f"{c.name}-n{n}") for c in CASES for n in c.sizes]
BY_CASE = [pytest.param(c, id=c.name) for c in CASES]


def _scores(case, n, batch=4, seed=0, scale=1.5, dtype=torch.float64):
    return random_scores((batch, *case.part_shape(n)), dtype, seed, scale)


def _vertices(name, n):
    case = next(c for c in CASES if c.name == name)
    out = enumerated(case.structure, n)
    assert out.shape[1:] == case.part_shape(n)
    return out


# --------------------------------------------------------------------------------------------------------- MAP


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("case", "n"), SIZED)
def test_map_is_a_best_vertex(case, n, dtype):
    scores = _scores(case, n, batch=6, seed=n, dtype=dtype).requires_grad_(True)
    z = case.structure.map(scores)
    assert z.shape == scores.shape and z.dtype == dtype and not z.requires_grad
    vertices = _vertices(case.name, n)
    best = brute_max(scores.detach().double(), vertices)
    torch.testing.assert_close((z.double() * scores.detach().double()).flatten(1).sum(-1), best, atol=1e-5, rtol=1e-5)
    assert (z.double().flatten(1)[:, None, :] == vertices.flatten(1)[None]).all(-1).any(-1).all(), "MAP not a vertex"


@pytest.mark.parametrize("case", BY_CASE)
def test_map_parts_lists_the_parts_of_map(case):
    """``map_parts`` (the SparseMAP solver's oracle) is ``map`` as lists of flat part indices, padding included."""
    n = max(case.sizes)
    scores = _scores(case, n, batch=3, seed=8)
    lengths = None if case.crop is None else torch.tensor([n, max(n - 1, case.min_length), case.min_length])
    parts, on = case.structure.map_parts(scores, lengths)
    assert parts.dtype == torch.long and on.dtype == torch.bool and parts.shape == on.shape
    dense = parts_to_dense(parts, on, scores[0].numel(), torch.float64)
    assert dense.max() <= 1, "a part is listed twice"
    torch.testing.assert_close(dense, case.structure.map(scores, lengths).flatten(1))


# -------------------------------------------------------------------------------------- log-partition, marginals


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("case", "n"), SIZED)
def test_log_partition_and_marginals_equal_enumeration(case, n, dtype):
    scores = _scores(case, n, seed=10 + n, dtype=dtype)
    if not case.has_marginals:
        for method in (case.structure.marginals, case.structure.log_partition):
            with pytest.raises(NotImplementedError, match="#P-hard"):
                method(scores)
        return
    vertices = _vertices(case.name, n)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-9, "rtol": 1e-9}
    log_z = case.structure.log_partition(scores)
    assert log_z.shape == (scores.shape[0],) and log_z.dtype == dtype
    torch.testing.assert_close(log_z.double(), brute_log_partition(scores.double(), vertices), **tol)
    mu = case.structure.marginals(scores)
    assert mu.shape == scores.shape and mu.dtype == dtype
    expected = brute_marginals(scores.double(), vertices)
    torch.testing.assert_close(mu.double(), expected, **tol)


# ------------------------------------------------------------------------------------------------------ SparseMAP


@pytest.mark.parametrize("scale", [0.3, 1.5, 10.0])
@pytest.mark.parametrize(("case", "n"), SIZED)
def test_sparsemap_is_the_projection(case, n, scale):
    scores = _scores(case, n, batch=3, seed=20 + n, scale=scale)
    mu = case.structure.sparsemap(scores)
    assert mu.shape == scores.shape and mu.dtype == scores.dtype
    vertices = _vertices(case.name, n)
    for b in range(scores.shape[0]):
        assert distance_to_hull(vertices, mu[b]) < 1e-6, "SparseMAP lies outside conv(Z)"
    # First-order optimality of a projection: <s - μ, v - μ> ≤ tol for every vertex v.
    gaps = vertex_scores(scores - mu, vertices) - ((scores - mu) * mu).flatten(1).sum(-1, keepdim=True)
    assert gaps.max() <= 1e-6 * max(1.0, scale * n)
    if vertices.shape[0] <= 150:
        for b in range(scores.shape[0]):
            torch.testing.assert_close(mu[b], qp_over_vertices(vertices, scores[b]).view_as(mu[b]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", BY_CASE)
def test_sparsemap_gradcheck(case):
    n = case.sizes[min(2, len(case.sizes) - 1)]
    scores = _scores(case, n, batch=2, seed=3, scale=0.7).requires_grad_(True)
    assert torch.autograd.gradcheck(case.structure.sparsemap, (scores,), fast_mode=True)


@pytest.mark.parametrize("case", [c for c in BY_CASE if c.values[0].has_marginals])
def test_marginals_gradcheck(case):
    n = case.sizes[min(2, len(case.sizes) - 1)]
    scores = _scores(case, n, batch=2, seed=4).requires_grad_(True)
    assert torch.autograd.gradcheck(case.structure.marginals, (scores,))
    assert torch.autograd.gradgradcheck(case.structure.log_partition, (scores,))


# --------------------------------------------------------------------------------------------------------- sampling

DRAWS = 20_000


def _samples(method, scores, seed):
    """DRAWS samples for the single example ``scores [1, *parts]``, in one batch."""
    return method(scores.expand(DRAWS, *scores.shape[1:]).contiguous(), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("case", BY_CASE)
def test_sample_has_the_perturb_and_map_distribution(case):
    """Our ``sample`` vs perturb-and-MAP done by brute force (argmax over the listed vertices of <s + G, v>)."""
    scores = _scores(case, case.sample_size, batch=1, seed=5, scale=1.0)
    vertices = _vertices(case.name, case.sample_size)
    ours = _samples(case.structure.sample, scores, seed=0)
    noisy = scores.expand(DRAWS, *scores.shape[1:]) + gumbel_like(ours, torch.Generator().manual_seed(1))
    brute = vertex_scores(noisy, vertices).argmax(-1)
    p = torch.bincount(brute, minlength=vertices.shape[0]).double() / DRAWS
    assert total_variation(ours, vertices, p) < 0.04


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", BY_CASE)
def test_exact_sample_is_gibbs(case, dtype):
    if type(case.structure).exact_sample is Structure.exact_sample:
        with pytest.raises(NotImplementedError):
            case.structure.exact_sample(_scores(case, case.sample_size, batch=1))
        return
    scores = _scores(case, case.sample_size, batch=1, seed=6, scale=1.0, dtype=dtype)
    vertices = _vertices(case.name, case.sample_size)
    ours = _samples(case.structure.exact_sample, scores, seed=2)
    assert ours.dtype == dtype and ours.shape == (DRAWS, *scores.shape[1:])
    assert total_variation(ours, vertices, gibbs(scores.double(), vertices)[0]) < 0.03


SAMPLERS = [c for c in BY_CASE if type(c.values[0].structure).exact_sample is not Structure.exact_sample]
TREES = [c for c in BY_CASE if c.values[0].name.startswith(("projective", "nonprojective"))]


@pytest.mark.parametrize("case", [c for c in SAMPLERS if c.values[0].crop is not None])
def test_exact_sample_with_lengths_and_num_samples_is_gibbs(case):
    """M = DRAWS samples of a padded batch in one call: ``[M, batch, *parts]``, 0 on padding (which holds junk), and
    the cropped samples of the short example have the Gibbs distribution of its cropped scores."""
    n, length = case.sample_size + 2, case.sample_size
    scores = _scores(case, n, batch=2, seed=9, scale=1.0)
    alone = case.crop(scores[:1], length).clone()
    scores = 1e3 * torch.randn_like(scores)  # junk everywhere, then the real parts of example 0
    case.crop(scores[:1], length).copy_(alone)
    lengths = torch.tensor([length, n])
    ours = case.structure.exact_sample(scores, lengths, torch.Generator().manual_seed(4), num_samples=DRAWS)
    assert ours.shape == (DRAWS, *scores.shape) and ours.dtype == scores.dtype
    inside = case.crop(ours[:, 0], length)
    assert ours[:, 0].abs().sum() == inside.abs().sum(), "padding not 0"
    vertices = _vertices(case.name, length)
    assert total_variation(inside, vertices, gibbs(alone, vertices)[0]) < 0.03


@pytest.mark.parametrize("case", SAMPLERS)
def test_exact_sample_is_reproducible_and_num_samples_shapes(case):
    n = max(case.sizes)
    scores = _scores(case, n, batch=3, seed=11)
    method = case.structure.exact_sample
    a, b = (method(scores, generator=torch.Generator().manual_seed(5)) for _ in range(2))
    assert torch.equal(a, b) and a.shape == scores.shape
    many = method(scores, generator=torch.Generator().manual_seed(5), num_samples=4)
    assert torch.equal(many, method(scores, None, torch.Generator().manual_seed(5), 4))
    assert many.shape == (4, *scores.shape)
    vertices = _vertices(case.name, n).flatten(1)
    assert (many.flatten(2).double()[..., None, :] == vertices).all(-1).any(-1).all(), "a sample is not a vertex"
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="num_samples"):
            method(scores, num_samples=bad)


@pytest.mark.parametrize("case", TREES)
def test_a_uniform_sampler_fails_the_gibbs_test(case):
    """The Gibbs test has power: DRAWS trees drawn uniformly (a wrong sampler) are far above its tolerance."""
    scores = _scores(case, case.sample_size, batch=1, seed=6, scale=1.0)
    vertices = _vertices(case.name, case.sample_size)
    pick = torch.randint(vertices.shape[0], (DRAWS,), generator=torch.Generator().manual_seed(2))
    assert total_variation(vertices[pick], vertices, gibbs(scores, vertices)[0]) > 0.1


@pytest.mark.parametrize("case", [c for c in TREES if c.values[0].name.startswith("nonprojective")])
def test_nonprojective_chain_rule_sampler_is_gibbs(case, monkeypatch):
    """The chain-rule sampler (peaked scores, where Wilson's walks would be slow) on every example, forced."""
    from latentstruct.structures import nonprojective

    monkeypatch.setattr(nonprojective, "_WILSON_DRAWS_PER_WORD", 0.0)
    scores = _scores(case, case.sample_size, batch=1, seed=6, scale=1.0)
    vertices = _vertices(case.name, case.sample_size)
    ours = case.structure.exact_sample(scores, generator=torch.Generator().manual_seed(3), num_samples=DRAWS)[:, 0]
    assert total_variation(ours, vertices, gibbs(scores, vertices)[0]) < 0.03


def test_perturb_and_map_is_not_gibbs_on_trees():
    """The statistical tests can tell the two distributions apart: part-level perturb-and-MAP on trees is biased."""
    case = next(c for c in CASES if c.name == "projective_multiroot")
    scores = _scores(case, 3, batch=1, seed=5, scale=1.0)
    vertices = _vertices(case.name, 3)
    ours = _samples(case.structure.sample, scores, seed=0)
    assert total_variation(ours, vertices, gibbs(scores, vertices)[0]) > 0.04


# ---------------------------------------------------------------------------------------------------------- lengths


@pytest.mark.parametrize("case", [c for c in BY_CASE if c.values[0].crop is not None])
def test_padded_batch_equals_the_cropped_problems(case):
    n = max(case.sizes)
    lengths = torch.tensor([n, max(n - 1, case.min_length), case.min_length])
    scores = _scores(case, n, batch=3, seed=7)
    junk = 1e3 * torch.randn_like(scores)
    for b, length in enumerate(lengths.tolist()):  # padding holds junk: it must not matter
        keep = case.crop(torch.ones_like(scores[b : b + 1]), length)
        mask = torch.zeros_like(scores[b : b + 1])
        case.crop(mask, length).copy_(keep)
        scores[b] = torch.where(mask[0] > 0, scores[b], junk[b])
    methods = {"map": case.structure.map, "sparsemap": case.structure.sparsemap}
    if case.has_marginals:
        methods |= {"marginals": case.structure.marginals}
    for name, method in methods.items():
        padded = method(scores, lengths)
        for b, length in enumerate(lengths.tolist()):
            alone = method(case.crop(scores[b : b + 1], length))
            inside = case.crop(padded[b : b + 1], length)
            torch.testing.assert_close(inside, alone, atol=1e-6, rtol=1e-6, msg=f"{name}, length {length}")
            assert padded[b].abs().sum().item() == pytest.approx(inside.abs().sum().item()), f"{name}: padding not 0"
    if case.has_marginals:
        log_z = case.structure.log_partition(scores, lengths)
        for b, length in enumerate(lengths.tolist()):
            alone = case.structure.log_partition(case.crop(scores[b : b + 1], length))
            torch.testing.assert_close(log_z[b : b + 1], alone)
