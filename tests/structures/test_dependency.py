"""latentstruct.structures.ProjectiveDepTree: what test_contract.py does not check (DESIGN.md §4, §9).

``enumerate(n)`` against an independent brute force (reference.py: a different characterisation of projectivity: every
word between a head and its modifier descends from the head) and the known counts; the contract compares MAP, the
log-partition and the marginals with it. Here: Eisner's tie-breaking against a scalar reference, non-parts and
forbidden arcs, junk in the padding, gradients with lengths, the exact backward, longer sentences, float32. The checks
that are the same for NonProjectiveDepTree (junk off the parts and in the padding, samples are trees) run here over
both structures; the brute forces (``projective_trees``, ``spanning_trees``) live in tests/structures/reference.py.
"""

import math

import pytest
import torch

from latentstruct.structures import NonProjectiveDepTree, ProjectiveDepTree
from tests.structures.reference import (
    arcs,
    assert_valid_tree,
    brute_log_partition,
    brute_marginals,
    enumerated,
    gibbs,
    heads,
    projective_trees,
    scores_maker,
    thirty_words,
    tol,
)

SIZES = list(range(1, 6))
ROOTS = [True, False]
DTYPES = [torch.float32, torch.float64]
_scores = scores_maker(arcs)


# --------------------------------------------------------------------------------------------------------- enumerate


def test_number_of_projective_trees_matches_the_known_counts():
    counts = [len(projective_trees(n, True)) for n in SIZES]
    assert counts == [1, 3, 12, 55, 273]
    assert counts == [math.comb(3 * n, n) // (2 * n + 1) for n in SIZES]
    assert [len(ProjectiveDepTree(True).enumerate(n)) for n in SIZES] == counts
    # Single root: the root's one child j splits the words into two multi-rooted halves, hence
    # Σ_j T(j-1) T(n-j) with T the multiroot counts (T(0) = 1).
    t = [1, *counts]
    single = [len(projective_trees(n, False)) for n in SIZES]
    assert single == [sum(t[j - 1] * t[n - j] for j in range(1, n + 1)) for n in SIZES] == [1, 2, 7, 30, 143]


@pytest.mark.parametrize("multiroot", ROOTS)
@pytest.mark.parametrize("n", SIZES)
def test_enumerate_is_every_projective_tree_once(n, multiroot):
    vertices = ProjectiveDepTree(multiroot).enumerate(n)
    assert vertices.shape[1:] == (n + 1, n + 1)
    found = [heads(v) for v in vertices]
    assert len(set(found)) == len(found)
    assert set(found) == projective_trees(n, multiroot)
    assert torch.all(vertices[:, :, 0] == 0)
    assert torch.all(vertices.diagonal(dim1=1, dim2=2) == 0)


# ------------------------------------------------------------------------------------ map, log-partition, marginals


def _eisner_reference(s, length, multiroot):
    """Scalar Eisner over the nested list ``s`` (a tree over words 1..length), ties to the smallest split and the
    smallest root child → the head tuple. Shares no code with the module under test."""
    size = length + 1
    best = {}  # (kind, i, j) -> (value, split point k)

    def first_max(pairs):  # pairs of (value, k) in increasing k; the first maximum wins
        top = max(v for v, _ in pairs)
        return next((v, k) for v, k in pairs if v == top)

    for i in range(size):
        best["CR", i, i] = best["CL", i, i] = (0.0, None)
    for w in range(1, size):
        for i in range(size - w):
            j = i + w
            v, k = first_max([(best["CR", i, k][0] + best["CL", k + 1, j][0], k) for k in range(i, j)])
            best["IR", i, j], best["IL", i, j] = (v + s[i][j], k), (v + s[j][i], k)
            best["CR", i, j] = first_max([(best["IR", i, k][0] + best["CR", k, j][0], k) for k in range(i + 1, j + 1)])
            best["CL", i, j] = first_max([(best["CL", i, k][0] + best["IL", k, j][0], k) for k in range(i, j)])
    heads = [None] * size

    def follow(kind, i, j):
        if i == j:
            return
        k = best[kind, i, j][1]
        if kind == "CR":
            follow("IR", i, k), follow("CR", k, j)
        elif kind == "CL":
            follow("CL", i, k), follow("IL", k, j)
        else:
            heads[j if kind == "IR" else i] = i if kind == "IR" else j
            follow("CR", i, k), follow("CL", k + 1, j)

    if multiroot:
        follow("CR", 0, length)
    else:
        _, child = first_max([(best["CL", 1, j][0] + s[0][j] + best["CR", j, length][0], j) for j in range(1, size)])
        heads[child] = 0
        follow("CL", 1, child), follow("CR", child, length)
    return tuple(heads[1:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("multiroot", ROOTS)
def test_map_breaks_ties_like_a_scalar_reference(multiroot, dtype):
    """Small integer scores make many trees tie: the batched MAP takes the smallest split everywhere."""
    struct = ProjectiveDepTree(multiroot)
    g = torch.Generator().manual_seed(3)
    n, batch = 9, 12
    scores = torch.randint(-1, 2, (batch, n + 1, n + 1), generator=g).to(dtype)
    scores[:3] = 0.0  # every tree ties
    lengths = torch.randint(1, n + 1, (batch,), generator=g)
    lengths[0] = lengths[3] = n
    z = struct.map(scores, lengths)
    for b, length in enumerate(lengths.tolist()):
        want = _eisner_reference(scores[b].tolist(), length, multiroot)
        assert heads(z[b, : length + 1, : length + 1]) == want
        assert torch.all(z[b, length + 1 :] == 0) and torch.all(z[b, :, length + 1 :] == 0)


@pytest.mark.parametrize("multiroot", ROOTS)
def test_map_equals_a_scalar_reference_on_random_scores(multiroot):
    """The batched walk over longer sentences and mixed lengths, and the same examples one at a time (the SparseMAP
    solver calls ``map`` on a few examples)."""
    struct = ProjectiveDepTree(multiroot)
    g = torch.Generator().manual_seed(8)
    n, batch = 13, 10
    scores = torch.randn(batch, n + 1, n + 1, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, n + 1, (batch,), generator=g)
    lengths[0] = n
    z = struct.map(scores, lengths)
    for b, length in enumerate(lengths.tolist()):
        assert heads(z[b, : length + 1, : length + 1]) == _eisner_reference(scores[b].tolist(), length, multiroot)
        assert torch.equal(struct.map(scores[b : b + 1], lengths[b : b + 1]), z[b : b + 1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("multiroot", ROOTS)
@pytest.mark.parametrize("n", SIZES)
def test_marginals_are_zero_off_the_parts_and_give_each_word_one_head(n, multiroot, dtype):
    struct = ProjectiveDepTree(multiroot)
    scores = _scores(6, n, dtype=dtype, seed=n + 100)
    mu = struct.marginals(scores)
    assert torch.all(mu[:, :, 0] == 0) and torch.all(mu.diagonal(dim1=1, dim2=2) == 0)
    # Every word has one head in expectation; the single root has one child.
    torch.testing.assert_close(mu.sum(1)[:, 1:], torch.ones_like(mu[:, 0, 1:]), **tol(dtype))
    if not multiroot:
        torch.testing.assert_close(mu[:, 0].sum(-1), torch.ones_like(mu[:, 0, 0]), **tol(dtype))


@pytest.mark.parametrize("multiroot", ROOTS)
def test_forbidden_arcs_get_no_mass(multiroot):
    """−inf on real arcs removes the trees that use them. Forbidding 1 → 2 makes every split of I→[1, 2] and of
    C→[1, 2] −inf, where a log-sum-exp's gradient is NaN unless handled."""
    struct = ProjectiveDepTree(multiroot)
    scores = _scores(3, 4, seed=13)
    forbid = torch.zeros_like(scores, dtype=torch.bool)
    forbid[:, 1, 2] = forbid[:, 4, 3] = True
    forbid[0, 0, 2] = True
    constrained = scores.masked_fill(forbid, float("-inf"))
    vertices = enumerated(struct, 4)  # a tree on a forbidden arc scores −inf: it gets no mass
    torch.testing.assert_close(struct.marginals(constrained), brute_marginals(constrained, vertices))
    torch.testing.assert_close(struct.log_partition(constrained), brute_log_partition(constrained, vertices))
    assert torch.all(struct.map(constrained)[forbid] == 0)
    x = scores.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: struct.marginals(x.masked_fill(forbid, float("-inf"))), (x,))


# ------------------------------------------------------------------------------------------------------------ lengths


@pytest.mark.parametrize("multiroot", ROOTS)
def test_lengths_gradients_stay_off_padding(multiroot):
    struct = ProjectiveDepTree(multiroot)
    lengths = torch.tensor([4, 2])
    scores = _scores(2, 4, seed=5).requires_grad_(True)
    struct.log_partition(scores, lengths).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert torch.all(scores.grad[1, 3:, :] == 0) and torch.all(scores.grad[1, :, 3:] == 0)


# ---------------------------------------------------------------------------------------------- second derivatives


@pytest.mark.parametrize("multiroot", ROOTS)
def test_marginals_gradcheck_with_lengths(multiroot):
    struct = ProjectiveDepTree(multiroot)
    scores = _scores(2, 3, seed=11).requires_grad_(True)
    lengths = torch.tensor([3, 2])
    assert torch.autograd.gradcheck(lambda s: struct.marginals(s, lengths), (scores,))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("multiroot", ROOTS)
def test_marginals_backward_is_the_covariance_times_g(multiroot, dtype):
    """The backward of μ is H g with H = ∇² log Z = Cov_p(z) = Σ_v p_v v vᵀ − μ μᵀ, by enumeration (exact, no finite
    differences), with padding in the batch."""
    struct = ProjectiveDepTree(multiroot)
    n, lengths = 4, torch.tensor([4, 3, 4])
    scores = _scores(3, n, dtype=dtype, seed=21).requires_grad_(True)
    g = _scores(3, n, dtype=dtype, seed=22, scale=1.0)
    (struct.marginals(scores, lengths) * g).sum().backward()
    for b, length in enumerate(lengths.tolist()):
        crop = (slice(None), slice(0, length + 1), slice(0, length + 1))
        block, vertices = scores.detach()[b : b + 1][crop].double(), enumerated(struct, length)
        p, gb = gibbs(block, vertices)[0], g[b][crop[1:]].double()
        mu = brute_marginals(block, vertices)[0]
        inner = torch.einsum("vhm,hm->v", vertices, gb)
        expected = torch.einsum("v,vhm->hm", p * inner, vertices) - mu * (mu * gb).sum()
        torch.testing.assert_close(scores.grad[b][crop[1:]].double(), expected, **tol(dtype))
        assert torch.all(scores.grad[b, length + 1 :] == 0) and torch.all(scores.grad[b, :, length + 1 :] == 0)


def test_marginals_are_differentiable_once():
    """A third derivative of log Z is not supported: it raises instead of returning something wrong."""
    scores = _scores(2, 3).requires_grad_(True)
    mu = ProjectiveDepTree().marginals(scores)
    with pytest.raises(RuntimeError, match="differentiable once"):
        torch.autograd.grad((mu * torch.randn_like(mu)).sum(), scores, create_graph=True)


# ------------------------------------------------------------------ both dependency structures: the same checks


TREES = [pytest.param(ProjectiveDepTree, id="projective"), pytest.param(NonProjectiveDepTree, id="nonprojective")]


@pytest.mark.parametrize("multiroot", ROOTS)
@pytest.mark.parametrize("cls", TREES)
def test_column_zero_and_diagonal_are_ignored(cls, multiroot):
    struct = cls(multiroot)
    scores = _scores(3, 4, seed=7)
    junk = scores.clone()
    junk[:, :, 0] = float("nan")
    junk.diagonal(dim1=1, dim2=2).fill_(float("inf"))
    torch.testing.assert_close(struct.log_partition(junk), struct.log_partition(scores))
    torch.testing.assert_close(struct.marginals(junk), struct.marginals(scores))
    assert torch.equal(struct.map(junk), struct.map(scores))


@pytest.mark.parametrize("multiroot", ROOTS)
@pytest.mark.parametrize(
    ("cls", "scale", "inf_root_padding"),
    [
        pytest.param(ProjectiveDepTree, 2.0, False, id="projective"),
        pytest.param(NonProjectiveDepTree, 2.0, True, id="nonprojective-2.0"),
        pytest.param(NonProjectiveDepTree, 1000.0, True, id="nonprojective-1000.0"),
    ],
)
def test_lengths_equal_the_cropped_problems(cls, scale, inf_root_padding, multiroot):
    struct = cls(multiroot)
    n, lengths = 5, torch.tensor([5, 3, 1, 4, 2])
    scores = _scores(len(lengths), n, seed=3, scale=scale)
    for b, length in enumerate(lengths.tolist()):  # padding may hold anything, even the −inf of a masked scorer
        scores[b, length + 1 :, :] = float("-inf")
        scores[b, :, length + 1 :] = float("nan")
        if inf_root_padding:
            scores[b, 0, length + 1 :] = float("inf")
    z = struct.map(scores, lengths)
    log_z = struct.log_partition(scores, lengths)
    mu = struct.marginals(scores, lengths)
    for b, length in enumerate(lengths.tolist()):
        block = scores[b : b + 1, : length + 1, : length + 1]
        for got, want in ((z[b], struct.map(block)[0]), (mu[b], struct.marginals(block)[0])):
            torch.testing.assert_close(got[: length + 1, : length + 1], want)
            assert torch.all(got[length + 1 :, :] == 0) and torch.all(got[:, length + 1 :] == 0)
        torch.testing.assert_close(log_z[b], struct.log_partition(block)[0])
        assert_valid_tree(z[b], multiroot, length, projective=cls is ProjectiveDepTree)


@pytest.mark.parametrize("multiroot", ROOTS)
@pytest.mark.parametrize(
    ("cls", "half", "nan_padding"),
    [pytest.param(ProjectiveDepTree, 32, False, id="projective"), pytest.param(NonProjectiveDepTree, 16, True,
                                                                                  id="nonprojective")],
)
def test_perturb_and_map_samples_are_trees(cls, half, nan_padding, multiroot):
    struct = cls(multiroot)
    lengths = torch.tensor([4] * half + [2] * half)
    scores = _scores(2 * half, 4, seed=2, scale=0.5)
    if nan_padding:
        scores[half:, 3:] = float("nan")
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        z = struct.sample(scores, lengths, generator=g)
        assert z.shape == scores.shape
        for zb, length in zip(z, lengths.tolist(), strict=True):
            assert_valid_tree(zb, multiroot, length, projective=cls is ProjectiveDepTree)


# ---------------------------------------------------------------------------------------------------- larger inputs


@pytest.mark.parametrize("multiroot", ROOTS)
def test_batch_of_sentences_of_thirty_words(multiroot):
    struct = ProjectiveDepTree(multiroot)
    lengths, scores, z, mu = thirty_words(struct, _scores)
    # Every word has one head; the MAP tree scores no more than the log-partition.
    words = torch.arange(31) <= lengths.view(-1, 1)
    words[:, 0] = False
    assert torch.equal(z.sum(1), words.float())
    torch.testing.assert_close(mu.detach().sum(1), words.float())
    assert torch.all(struct.score(z, scores.detach()) <= struct.log_partition(scores.detach(), lengths) + 1e-4)
    if not multiroot:
        assert torch.all(z[:, 0].sum(-1) == 1)


@pytest.mark.parametrize("multiroot", ROOTS)
def test_float32_marginals_and_their_backward_track_float64(multiroot):
    struct = ProjectiveDepTree(multiroot)
    lengths = torch.tensor([30, 17, 30, 1])
    scores, g = _scores(4, 30, seed=6, scale=3.0), _scores(4, 30, seed=7, scale=1.0)
    out = {}
    for dtype in DTYPES:
        x = scores.to(dtype).requires_grad_(True)
        mu = struct.marginals(x, lengths)
        (mu * g.to(dtype)).sum().backward()
        out[dtype] = mu.detach().double(), x.grad.double()
    for single, double in zip(out[torch.float32], out[torch.float64], strict=True):
        torch.testing.assert_close(single, double, atol=1e-4, rtol=0)


@pytest.mark.cuda
@pytest.mark.parametrize("multiroot", ROOTS)
def test_cuda_matches_cpu(multiroot):
    struct = ProjectiveDepTree(multiroot)
    lengths = torch.tensor([5, 3, 1])
    scores = _scores(3, 5, seed=4)
    for method in (struct.map, struct.log_partition, struct.marginals):
        on_gpu = method(scores.cuda(), lengths.cuda())
        assert on_gpu.is_cuda
        torch.testing.assert_close(on_gpu.cpu(), method(scores, lengths))
