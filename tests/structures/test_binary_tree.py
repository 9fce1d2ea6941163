"""latentstruct.structures.BinaryTree: what test_contract.py does not check (DESIGN.md §4, §9).

``enumerate(n)`` against an independent brute force written here (a different characterisation: n - 1 pairwise
non-crossing spans of width ≥ 2 that include the full span) and the Catalan numbers; the contract compares CKY, the
inside algorithm, the marginals (inside-outside) and the exact top-down sampler with it. Here: tie-breaking, non-parts
and forbidden constituents, junk in the padding, the exact sampler with lengths, the hand-written backward against
autograd's, longer sentences.
"""

import functools
import itertools
import math

import pytest
import torch

from latentstruct.structures.binary_tree import BinaryTree
from tests.structures.reference import (
    brute_log_partition,
    brute_marginals,
    brute_max,
    enumerated,
    gibbs,
    scores_maker,
    spans,
    thirty_words,
    tol,
)

SIZES = list(range(1, 7))
DTYPES = [torch.float32, torch.float64]


_scores = scores_maker(spans)


@functools.cache
def _independent_bracketings(n):
    """Bracketings as sets of spans, by a brute force that shares no code with the module under test.

    A full binary tree over n ordered leaves ⇔ a laminar (pairwise nested or disjoint) family of n - 1 intervals of
    width ≥ 2 that contains the full interval: every node of the laminar tree has ≥ 2 children, and such a tree with n
    leaves has at most n - 1 internal nodes, with equality exactly when every node has 2 children.
    """
    if n == 1:
        return {frozenset()}
    candidates = [(i, j) for i in range(n) for j in range(i + 1, n)]

    def compatible(a, b):
        (i, j), (k, l) = a, b
        return j < k or l < i or (i <= k and l <= j) or (k <= i and j <= l)

    return {
        frozenset(spans)
        for spans in itertools.combinations(candidates, n - 1)
        if (0, n - 1) in spans and all(compatible(a, b) for a, b in itertools.combinations(spans, 2))
    }


def _spans(z):
    return frozenset((i, j) for i, j in (z != 0).nonzero().tolist())


def _assert_valid_tree(z, length=None):
    """z [n, n] is a bracketing of its first ``length`` leaves and 0 elsewhere."""
    n = z.shape[-1]
    length = n if length is None else length
    assert set(z.unique().tolist()) <= {0.0, 1.0}
    assert torch.all(z[length:, :] == 0) and torch.all(z[:, length:] == 0)
    assert _spans(z[:length, :length]) in _independent_bracketings(length)


# --------------------------------------------------------------------------------------------------------- enumerate


def test_number_of_bracketings_is_catalan():
    counts = [len(_independent_bracketings(n)) for n in SIZES]
    assert counts == [1, 1, 2, 5, 14, 42]
    assert counts == [math.comb(2 * (n - 1), n - 1) // n for n in SIZES]
    assert [len(BinaryTree().enumerate(n)) for n in SIZES] == counts
    assert len(BinaryTree().enumerate(8)) == 429


@pytest.mark.parametrize("n", SIZES)
def test_enumerate_is_every_bracketing_once(n):
    vertices = BinaryTree().enumerate(n)
    assert vertices.shape[1:] == (n, n)
    spans = [_spans(v) for v in vertices]
    assert len(set(spans)) == len(spans)
    assert set(spans) == _independent_bracketings(n)
    assert torch.all(vertices.sum((1, 2)) == n - 1)
    assert torch.all(vertices.tril() == 0)  # the diagonal and the lower triangle are never parts
    if n >= 2:
        assert torch.all(vertices[:, 0, n - 1] == 1)


# ------------------------------------------------------------------------------------ map, log-partition, marginals


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_marginals_are_zero_off_the_parts_and_count_n_minus_one_constituents(n, dtype):
    struct = BinaryTree()
    scores = _scores(6, n, dtype=dtype, seed=n + 100)
    mu = struct.marginals(scores)
    assert torch.all(mu.tril() == 0)
    torch.testing.assert_close(mu.sum((1, 2)), torch.full_like(mu[:, 0, 0], n - 1), **tol(dtype))
    if n >= 2:
        torch.testing.assert_close(mu[:, 0, n - 1], torch.ones_like(mu[:, 0, 0]), **tol(dtype))


def test_map_breaks_ties_towards_the_first_split():
    # Zero scores tie every bracketing; each span then splits off its first leaf: the right-branching tree.
    lengths = torch.tensor([6, 4, 1])
    z = BinaryTree().map(torch.zeros(3, 6, 6), lengths)
    for b, length in enumerate(lengths.tolist()):
        assert _spans(z[b]) == {(i, length - 1) for i in range(length - 1)}


def test_diagonal_and_lower_triangle_are_ignored():
    struct = BinaryTree()
    scores = _scores(3, 5, seed=7)
    junk = scores.clone()
    junk.diagonal(dim1=1, dim2=2).fill_(float("inf"))
    junk[:, 3, 1] = float("nan")
    junk[:, 4, 0] = float("-inf")
    torch.testing.assert_close(struct.log_partition(junk), struct.log_partition(scores))
    torch.testing.assert_close(struct.marginals(junk), struct.marginals(scores))
    assert torch.equal(struct.map(junk), struct.map(scores))


def test_forbidden_constituents_get_zero_marginals_not_nan():
    # Forbidding (0, 1) and (1, 2) forbids every bracketing of (0, 2) as well: β[0, 2] is a log-sum-exp over −inf only.
    struct = BinaryTree()
    scores = _scores(3, 5, seed=12)
    scores[:, 0, 1] = float("-inf")
    scores[:, 1, 2] = float("-inf")
    scores[:, 2, 4] = float("-inf")
    scores.requires_grad_(True)
    vertices = enumerated(struct, 5)
    mu = struct.marginals(scores)
    torch.testing.assert_close(mu.detach(), brute_marginals(scores.detach(), vertices))
    assert torch.all(mu[:, 0, 2] == 0)
    torch.testing.assert_close(struct.log_partition(scores).detach(), brute_log_partition(scores.detach(), vertices))
    (grad,) = torch.autograd.grad((mu * torch.randn_like(mu)).sum(), scores)
    assert torch.isfinite(grad).all()
    z = struct.map(scores)
    ours = torch.where(z.bool(), scores.detach(), 0.0).flatten(1).sum(-1)
    torch.testing.assert_close(ours, brute_max(scores.detach(), vertices))
    sample = struct.exact_sample(scores.detach().repeat(125, 1, 1), generator=torch.Generator().manual_seed(0))
    assert torch.all(sample[:, 0, 1] == 0) and torch.all(sample[:, 1, 2] == 0) and torch.all(sample[:, 2, 4] == 0)


# ------------------------------------------------------------------------------------------------------------ lengths


def test_lengths_equal_the_cropped_problems():
    struct = BinaryTree()
    n, lengths = 6, torch.tensor([6, 3, 1, 4, 2, 5])
    scores = _scores(len(lengths), n, seed=3)
    for b, length in enumerate(lengths.tolist()):  # padding may hold anything, even NaN or the −inf of a mask
        scores[b, length:, :] = float("-inf")
        scores[b, :, length:] = float("nan")
    z = struct.map(scores, lengths)
    log_z = struct.log_partition(scores, lengths)
    mu = struct.marginals(scores, lengths)
    for b, length in enumerate(lengths.tolist()):
        block = scores[b : b + 1, :length, :length]
        for got, want in ((z[b], struct.map(block)[0]), (mu[b], struct.marginals(block)[0])):
            torch.testing.assert_close(got[:length, :length], want)
            assert torch.all(got[length:, :] == 0) and torch.all(got[:, length:] == 0)
        torch.testing.assert_close(log_z[b], struct.log_partition(block)[0])
        _assert_valid_tree(z[b], length)
    assert log_z[2] == 0 and torch.all(z[2] == 0)  # a single leaf: one tree, no parts
    torch.testing.assert_close(struct.log_partition(scores, lengths.tolist()), log_z)


def test_lengths_gradients_stay_off_padding():
    struct = BinaryTree()
    lengths = torch.tensor([5, 3])
    scores = _scores(2, 5, seed=5)
    scores[1, :, 3:] = float("nan")
    scores.requires_grad_(True)
    struct.log_partition(scores, lengths).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert torch.all(scores.grad[1, 3:, :] == 0) and torch.all(scores.grad[1, :, 3:] == 0)
    assert torch.all(scores.grad.tril() == 0)


# ---------------------------------------------------------------------------------------------- second derivatives


def test_marginals_gradcheck():
    struct = BinaryTree()
    scores = _scores(2, 4, seed=11).requires_grad_(True)
    lengths = torch.tensor([4, 3])
    assert torch.autograd.gradcheck(lambda s: struct.marginals(s), (scores,))
    assert torch.autograd.gradcheck(lambda s: struct.marginals(s, lengths), (scores,))


@pytest.mark.parametrize("dtype", DTYPES)
def test_marginals_backward_is_the_hessian_vector_product(dtype):
    # The hand-written backward (tangent inside-outside) against autograd's double backward of the log-partition, on
    # a padded batch with forbidden constituents, junk in the padded scores and junk in the incoming gradient wherever
    # the marginals are constant (padding, diagonal, lower triangle).
    struct = BinaryTree()
    n, lengths = 9, torch.tensor([9, 6, 1, 2, 8])
    scores = _scores(len(lengths), n, dtype=dtype, seed=13)
    scores[1, 0, 2] = scores[1, 3, 5] = scores[4, 0, 7] = float("-inf")
    g = torch.randn(scores.shape, generator=torch.Generator().manual_seed(14), dtype=torch.float64).to(dtype)
    part = torch.ones(n, n, dtype=torch.bool).triu(1) & (torch.arange(n) < lengths.view(-1, 1, 1))
    g.diagonal(dim1=1, dim2=2).fill_(float("inf"))
    g.masked_fill_(torch.ones(n, n, dtype=torch.bool).tril(-1), float("nan"))
    for b, length in enumerate(lengths.tolist()):
        scores[b, :, length:] = float("nan")
        g[b, :, length:] = float("nan")
    x = scores.clone().requires_grad_(True)
    (ours,) = torch.autograd.grad(struct.marginals(x, lengths), x, g)
    x = scores.clone().requires_grad_(True)
    (mu,) = torch.autograd.grad(struct.log_partition(x, lengths).sum(), x, create_graph=True)
    (expected,) = torch.autograd.grad((mu * torch.where(part, g, 0.0)).sum(), x)
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours, expected, **tol(dtype))
    for b, length in enumerate(lengths.tolist()):
        assert torch.all(ours[b, length:, :] == 0) and torch.all(ours[b, :, length:] == 0)
    assert torch.all(ours.tril() == 0)


def test_marginals_are_differentiable_once_only():
    scores = _scores(2, 4).requires_grad_(True)
    (grad,) = torch.autograd.grad((BinaryTree().marginals(scores) ** 2).sum(), scores, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()


# ----------------------------------------------------------------------------------------------------------- sample


def _frequencies(z, vertices):
    """Empirical frequency of each vertex among samples z [N, ...] (every sample must be a vertex)."""
    match = (z.flatten(1).unsqueeze(1) == vertices.flatten(1).unsqueeze(0)).all(-1)  # [N, V]
    assert torch.all(match.sum(-1) == 1), "a sample is not a vertex"
    return match.double().mean(0)


def _total_variation(sampler, n, length, draws):
    """TV distance between ``draws`` samples of ``sampler`` and the exact Gibbs distribution over bracketings."""
    scores = _scores(1, n, seed=21, scale=1.0)
    scores[:, :, length:] = float("nan")
    lengths = torch.full((draws,), length)
    z = sampler(scores.expand(draws, -1, -1), lengths, generator=torch.Generator().manual_seed(0))
    assert z.shape == (draws, n, n) and z.dtype == scores.dtype
    assert torch.all(z[:, length:, :] == 0) and torch.all(z[:, :, length:] == 0)
    vertices = enumerated(BinaryTree(), length)
    exact = gibbs(scores[:, :length, :length], vertices)[0]
    return 0.5 * (_frequencies(z[:, :length, :length], vertices) - exact).abs().sum()


@pytest.mark.parametrize(("n", "length"), [(6, 5)])  # without padding: test_contract.py
def test_exact_sample_matches_the_gibbs_distribution(n, length):
    tv = _total_variation(BinaryTree().exact_sample, n, length, draws=20000)
    assert tv < 0.03, f"total variation {tv:.4f}"


def test_the_sampling_test_has_power():
    # Perturb-and-MAP with part-level noise is not an exact sampler: the same test rejects it, even with fewer draws.
    assert _total_variation(BinaryTree().sample, 5, 5, draws=5000) > 0.05


def test_exact_sample_is_reproducible_with_a_generator():
    struct = BinaryTree()
    scores = _scores(8, 6, seed=1, dtype=torch.float32)
    a = struct.exact_sample(scores, generator=torch.Generator().manual_seed(3))
    b = struct.exact_sample(scores, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.dtype == torch.float32


def test_perturb_and_map_samples_and_sparsemap():
    struct = BinaryTree()
    lengths = torch.tensor([5] * 16 + [2] * 8 + [1] * 8)
    scores = _scores(32, 5, seed=2, scale=0.5)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        z = struct.sample(scores, lengths, generator=g)
        assert z.shape == scores.shape
        for zb, length in zip(z, lengths.tolist(), strict=True):
            _assert_valid_tree(zb, length)
    # SparseMAP (the projection onto the polytope: test_contract.py) is exactly 0 off the parts.
    mu = struct.sparsemap(_scores(3, 5, seed=9, scale=0.5))
    assert torch.all(mu.tril() == 0) and torch.all(mu >= -1e-9)


def test_spans_lists_the_constituents():
    z = BinaryTree().map(_scores(3, 5, seed=6), torch.tensor([5, 3, 1]))
    spans = BinaryTree.spans(z)
    assert [len(s) for s in spans] == [4, 2, 0]
    for b in range(3):
        assert frozenset(spans[b]) == _spans(z[b]) and spans[b] == sorted(spans[b])


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="expects scores"):
        BinaryTree().map(torch.zeros(2, 4, 3))


# ---------------------------------------------------------------------------------------------------- larger inputs


def test_batch_of_sentences_of_thirty_words():
    struct = BinaryTree()
    lengths, scores, z, mu = thirty_words(struct, _scores)
    # n - 1 constituents, including the full span; the MAP tree scores no more than the log-partition.
    assert torch.equal(z.sum((1, 2)), (lengths - 1).float())
    torch.testing.assert_close(mu.detach().sum((1, 2)), (lengths - 1).float(), atol=1e-3, rtol=1e-5)
    long = lengths >= 2
    assert torch.all(z[long, 0, lengths[long] - 1] == 1)
    assert torch.all(struct.score(z, scores.detach()) <= struct.log_partition(scores.detach(), lengths) + 1e-4)
    sample = struct.exact_sample(scores, lengths, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample.sum((1, 2)), (lengths - 1).float())


@pytest.mark.cuda
def test_cuda_matches_cpu():
    struct = BinaryTree()
    lengths = torch.tensor([5, 3, 1])
    scores = _scores(3, 5, seed=4)
    for method in (struct.map, struct.log_partition, struct.marginals):
        on_gpu = method(scores.cuda(), lengths.cuda())
        assert on_gpu.is_cuda
        torch.testing.assert_close(on_gpu.cpu(), method(scores, lengths))
    sample = struct.exact_sample(scores.cuda(), lengths, generator=torch.Generator("cuda").manual_seed(0))
    assert sample.is_cuda and torch.equal(sample.sum((1, 2)).cpu(), (lengths - 1).double())
