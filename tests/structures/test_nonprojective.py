"""latentstruct.structures.NonProjectiveDepTree: what test_contract.py does not check (DESIGN.md §4, §9).

``enumerate(n)`` against an independent brute force (reference.py: a head assignment is a tree iff a breadth-first
search from the root along its arcs reaches every word) and Cayley's counts; the contract compares MAP, the
log-partition and the marginals with it on moderate scores (the slogdet path). Here: the same comparisons on scores
scaled by 30-1000 (where the determinant cancels and the log-space elimination takes over), ties and nested cycles,
the batched Chu-Liu-Edmonds against the recursive reference, junk and ±inf in the scores, gradients with lengths. Junk
off the parts and in the padding, and samples being trees, are checked in test_dependency.py over both structures.
"""

import functools

import pytest
import torch

from latentstruct.structures import ProjectiveDepTree
from latentstruct.structures.nonprojective import (
    NonProjectiveDepTree,
    _incoming_scores,
    _inexact,
    _laplacian,
    _NumPyOps,
    _prepare,
    _rounds,
    _TorchOps,
)
from latentstruct.structures.sparsemap import sparsemap_active_set
from tests.structures.reference import (
    arcs,
    assert_valid_tree,
    brute_log_partition,
    brute_marginals,
    brute_max,
    enumerated,
    heads,
    recursive_chu_liu_edmonds,
    scores_maker,
    spanning_trees,
    thirty_words,
    tol,
)

SIZES = list(range(1, 6))
ROOTS = [True, False]
DTYPES = [torch.float32, torch.float64]
_scores = scores_maker(arcs)


_assert_valid_tree = functools.partial(assert_valid_tree, projective=False)


# --------------------------------------------------------------------------------------------------------- enumerate


def test_number_of_trees_matches_cayley():
    multi = [len(spanning_trees(n, True)) for n in SIZES]
    single = [len(spanning_trees(n, False)) for n in SIZES]
    assert multi == [(n + 1) ** (n - 1) for n in SIZES] == [1, 3, 16, 125, 1296]
    assert single == [n ** (n - 1) for n in SIZES] == [1, 2, 9, 64, 625]
    assert [len(NonProjectiveDepTree(True).enumerate(n)) for n in SIZES] == multi
    assert [len(NonProjectiveDepTree(False).enumerate(n)) for n in SIZES] == single


@pytest.mark.parametrize("multiroot", ROOTS)
@pytest.mark.parametrize("n", SIZES)
def test_enumerate_is_every_tree_once(n, multiroot):
    vertices = NonProjectiveDepTree(multiroot).enumerate(n)
    assert vertices.shape[1:] == (n + 1, n + 1)
    found = [heads(v) for v in vertices]
    assert len(set(found)) == len(found)
    assert set(found) == spanning_trees(n, multiroot)
    assert torch.all(vertices[:, :, 0] == 0)
    assert torch.all(vertices.diagonal(dim1=1, dim2=2) == 0)
    # Strictly more than the projective trees from n = 3 on (the first crossing arcs need three words).
    projective = len(ProjectiveDepTree(multiroot).enumerate(n))
    assert (len(found) > projective) == (n >= 3)


# ------------------------------------------------------------------------------------ map, log-partition, marginals


@pytest.mark.parametrize("multiroot", ROOTS)
def test_map_with_ties_and_nested_cycles(multiroot):
    # Many small-integer score matrices: ties everywhere, and cycles inside contracted cycles.
    struct = NonProjectiveDepTree(multiroot)
    g = torch.Generator().manual_seed(int(multiroot))
    scores = torch.randint(-3, 4, (300, 6, 6), generator=g).double()
    scores[:100, 0] -= 5  # root arcs poor: the greedy heads form cycles
    z = struct.map(scores)
    torch.testing.assert_close(struct.score(z, scores), brute_max(scores, enumerated(struct, 5)))
    for zb in z:
        assert heads(zb) in spanning_trees(5, multiroot)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("multiroot", ROOTS)
@pytest.mark.parametrize("n", SIZES)
def test_marginals_are_the_gradient_of_the_log_partition(n, multiroot, dtype):
    struct = NonProjectiveDepTree(multiroot)
    scores = _scores(6, n, dtype=dtype, seed=n + 100)
    mu = struct.marginals(scores)
    assert torch.all(mu[:, :, 0] == 0) and torch.all(mu.diagonal(dim1=1, dim2=2) == 0)
    # The closed form is the gradient of the log-partition (the base class's definition).
    torch.testing.assert_close(mu, super(NonProjectiveDepTree, struct).marginals(scores), **tol(dtype))
    # Every word has one head in expectation; the single root has one child.
    torch.testing.assert_close(mu.sum(1)[:, 1:], torch.ones_like(mu[:, 0, 1:]), **tol(dtype))
    if not multiroot:
        torch.testing.assert_close(mu[:, 0].sum(-1), torch.ones_like(mu[:, 0, 0]), **tol(dtype))


@pytest.mark.parametrize("multiroot", ROOTS)
def test_agrees_with_projective_when_only_projective_trees_are_allowed(multiroot):
    # Root arcs and arcs between neighbours only: such trees never cross, so both structures see the same vertices.
    n = 6
    allowed = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    allowed[0, 1:] = True
    allowed[torch.arange(1, n), torch.arange(2, n + 1)] = True
    allowed[torch.arange(2, n + 1), torch.arange(1, n)] = True
    scores = _scores(4, n, seed=8).masked_fill(~allowed, float("-inf"))
    lengths = torch.tensor([6, 4, 2, 1])
    ours, theirs = NonProjectiveDepTree(multiroot), ProjectiveDepTree(multiroot)
    torch.testing.assert_close(ours.log_partition(scores, lengths), theirs.log_partition(scores, lengths))
    torch.testing.assert_close(ours.marginals(scores, lengths), theirs.marginals(scores, lengths))
    assert torch.equal(ours.map(scores, lengths), theirs.map(scores, lengths))


# -------------------------------------------------------------------------------------------------- large scores


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("multiroot", ROOTS)
def test_large_offsets_do_not_overflow(multiroot, dtype):
    struct = NonProjectiveDepTree(multiroot)
    n, lengths = 5, torch.tensor([5, 3, 1])
    scores = _scores(3, n, seed=9)
    offsets = 1000.0 * torch.randn(3, 1, n + 1, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    shifted = scores + 1000.0 + offsets  # every arc into m gains 1000 + offsets[m]: each tree gains the same
    words = (torch.arange(n + 1) <= lengths.view(-1, 1)) & (torch.arange(n + 1) > 0)
    gain = ((1000.0 + offsets[:, 0]) * words).sum(-1)
    log_z = struct.log_partition(shifted.to(dtype), lengths)
    assert torch.isfinite(log_z).all()
    torch.testing.assert_close(log_z.double(), struct.log_partition(scores, lengths) + gain, **tol(dtype))
    mu = struct.marginals(shifted.to(dtype), lengths)
    torch.testing.assert_close(mu.double(), struct.marginals(scores, lengths), **tol(dtype))
    assert torch.equal(struct.map(shifted, lengths), struct.map(scores, lengths))


@pytest.mark.parametrize("scale", [30.0, 1000.0])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("multiroot", ROOTS)
def test_large_score_gaps_are_exact(multiroot, dtype, scale):
    # Scaled random scores: the determinant of the shifted Laplacian cancels in float64 for many examples, which must
    # then be recomputed by elimination (checked: some are), and still match the enumeration.
    struct = NonProjectiveDepTree(multiroot)
    n = 5
    scores = _scores(40, n, dtype=dtype, seed=int(scale) + multiroot, scale=scale)
    s, lengths, part = _prepare(scores, None)
    assert _inexact(_laplacian(s, part, lengths, multiroot)[0]).any()
    vertices, double = enumerated(struct, n), scores.double()
    log_z = struct.log_partition(scores)
    assert torch.isfinite(log_z).all()
    torch.testing.assert_close(
        log_z.double(), brute_log_partition(double, vertices), atol=0, rtol=1e-6 if dtype == torch.float32 else 1e-12
    )
    torch.testing.assert_close(
        struct.marginals(scores).double(),
        brute_marginals(double, vertices),
        atol=1e-6 if dtype == torch.float32 else 1e-9,
        rtol=0,
    )
    torch.testing.assert_close(struct.score(struct.map(scores).double(), double), brute_max(double, vertices))


@pytest.mark.parametrize("multiroot", ROOTS)
def test_poor_root_arcs_are_exact(multiroot):
    # Every root arc 40 nats below the arcs between words. With several roots allowed L is then nearly the singular
    # Laplacian without the root: elimination. For a single root the root row is rescaled and slogdet stays accurate.
    struct = NonProjectiveDepTree(multiroot)
    scores = _scores(20, 5, seed=16)
    scores[:, 0] -= 40.0
    s, lengths, part = _prepare(scores, None)
    inexact = _inexact(_laplacian(s, part, lengths, multiroot)[0])
    assert inexact.all() if multiroot else not inexact.any()
    vertices = enumerated(struct, 5)
    torch.testing.assert_close(struct.log_partition(scores), brute_log_partition(scores, vertices), atol=0, rtol=1e-12)
    torch.testing.assert_close(struct.marginals(scores), brute_marginals(scores, vertices), atol=1e-9, rtol=0)


@pytest.mark.parametrize("multiroot", ROOTS)
def test_both_log_partition_paths_agree_on_moderate_scores(multiroot):
    # The elimination is exact at every scale; compare it with slogdet where slogdet is accurate, with lengths.
    from latentstruct.structures.nonprojective import _log_partition_elimination

    scores = _scores(6, 7, seed=12, scale=1.5)
    lengths = torch.tensor([7, 6, 4, 3, 2, 1])
    s, lengths, part = _prepare(scores, lengths)
    assert not _inexact(_laplacian(s, part, lengths, multiroot)[0]).any()
    exact = _log_partition_elimination(s, part, lengths, multiroot)
    fast = NonProjectiveDepTree(multiroot).log_partition(scores, lengths)
    torch.testing.assert_close(exact, fast, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------------------------ lengths


@pytest.mark.parametrize("scale", [2.0, 1000.0])
@pytest.mark.parametrize("multiroot", ROOTS)
def test_lengths_gradients_stay_off_padding(multiroot, scale):
    struct = NonProjectiveDepTree(multiroot)
    lengths = torch.tensor([4, 2])
    scores = _scores(2, 4, seed=5, scale=scale)
    scores[1, 3:, :] = float("nan")
    scores[1, :, 3:] = float("-inf")
    scores = scores.requires_grad_(True)
    struct.log_partition(scores, lengths).sum().backward()
    first = scores.grad.clone()
    scores.grad = None
    (struct.marginals(scores, lengths) * _scores(2, 4, seed=6)).sum().backward()
    for grad in (first, scores.grad):
        assert torch.isfinite(grad).all()
        assert torch.all(grad[1, 3:, :] == 0) and torch.all(grad[1, :, 3:] == 0)
        assert torch.all(grad[:, :, 0] == 0) and torch.all(grad.diagonal(dim1=1, dim2=2) == 0)


def test_invalid_inputs_are_rejected():
    struct = NonProjectiveDepTree()
    with pytest.raises(ValueError, match="batch, n\\+1, n\\+1"):
        struct.log_partition(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="at least one word"):
        struct.map(torch.zeros(2, 1, 1))
    with pytest.raises(ValueError, match="lengths must lie in"):
        struct.marginals(torch.zeros(2, 4, 4), torch.tensor([3, 0]))
    with pytest.raises(ValueError, match="lengths must lie in"):
        struct.map(torch.zeros(2, 4, 4), torch.tensor([4, 1]))


# ------------------------------------------------------------------- MAP: the batched rounds and the recursive CLE


def _messy_scores(batch, n, seed, scale=1.0):
    """Gaussian scores with ±inf and NaN on some parts and junk on the padding, and random lengths (one full)."""
    g = torch.Generator().manual_seed(seed)
    scores = scale * torch.randn(batch, n + 1, n + 1, generator=g, dtype=torch.float64)
    u = torch.rand(scores.shape, generator=g, dtype=torch.float64)
    scores[u < 0.03] = float("-inf")
    scores[(u >= 0.03) & (u < 0.05)] = float("inf")
    scores[(u >= 0.05) & (u < 0.06)] = float("nan")
    lengths = torch.randint(1, n + 1, (batch,), generator=g)
    lengths[0] = n
    return scores, lengths


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("multiroot", ROOTS)
@pytest.mark.parametrize(("n", "scale"), [(10, 1.0), (30, 1.0), (30, 1000.0), (60, 1.0)])
def test_map_equals_the_recursive_reference(n, scale, multiroot, dtype):
    # Continuous scores: the best tree is unique, so both must return the very same tree (with padding and lengths).
    struct = NonProjectiveDepTree(multiroot)
    g = torch.Generator().manual_seed(n + int(scale))
    scores = (scale * torch.randn(32, n + 1, n + 1, generator=g, dtype=torch.float64)).to(dtype)
    lengths = torch.randint(1, n + 1, (32,), generator=g)
    z = struct.map(scores, lengths)
    assert z.dtype == dtype
    assert torch.equal(z.double(), recursive_chu_liu_edmonds(scores, lengths, multiroot))


@pytest.mark.parametrize("multiroot", ROOTS)
def test_map_with_infinite_and_nan_part_scores_equals_the_reference(multiroot):
    # -inf / NaN parts are used as little as possible and +inf parts as much as possible, as in the reference; some
    # examples need a -inf arc (e.g. when every root arc is -inf).
    struct = NonProjectiveDepTree(multiroot)
    scores, lengths = _messy_scores(40, 8, seed=3)
    scores[:4, 0] = float("-inf")
    z = struct.map(scores, lengths)
    assert torch.equal(z, recursive_chu_liu_edmonds(scores, lengths, multiroot))
    for zb, length in zip(z, lengths.tolist(), strict=True):
        _assert_valid_tree(zb, multiroot, length)


@pytest.mark.parametrize("multiroot", ROOTS)
def test_map_numpy_and_torch_rounds_agree(multiroot):
    # The CPU path runs the rounds in NumPy, other devices in torch: the same operations, hence the same tree, ties
    # included (small-integer scores: ties everywhere, nested cycles) and with examples finishing at different rounds.
    g = torch.Generator().manual_seed(5)
    ties = torch.randint(-2, 3, (64, 9, 9), generator=g).double()
    ties[:32, 0] -= 3  # poor root arcs: more and deeper contractions
    messy, messy_lengths = _messy_scores(64, 20, seed=6)
    for scores, lengths in ((ties, torch.randint(1, 9, (64,), generator=g)), (messy, messy_lengths)):
        t = _incoming_scores(*_prepare(scores, lengths), multiroot)
        heads = torch.from_numpy(_rounds(t.numpy(), _NumPyOps()))
        assert torch.equal(heads, _rounds(t, _TorchOps(t.device)))


@pytest.mark.parametrize("multiroot", ROOTS)
def test_map_ties_prefer_the_smallest_head(multiroot):
    # Documented tie-breaking: among equally good trees, every word takes the smallest head it can. With all scores
    # equal: every word hangs from the root, or (single root) word 1 does and every other word hangs from word 1.
    n = 6
    z = NonProjectiveDepTree(multiroot).map(torch.zeros(3, n + 1, n + 1), torch.tensor([6, 3, 1]))
    for zb, length in zip(z, [6, 3, 1], strict=True):
        expected = [0] * length if multiroot else [0] + [1] * (length - 1)
        assert heads(zb[: length + 1, : length + 1]) == tuple(expected)
        _assert_valid_tree(zb, multiroot, length)


@pytest.mark.parametrize("multiroot", ROOTS)
def test_map_batch_does_not_change_the_trees(multiroot):
    # Examples leave the batched rounds at different times (and are dropped from the arrays): each example's tree is
    # the one it gets alone.
    struct = NonProjectiveDepTree(multiroot)
    scores, lengths = _messy_scores(24, 12, seed=7)
    z = struct.map(scores, lengths)
    for b in range(len(lengths)):
        assert torch.equal(z[b : b + 1], struct.map(scores[b : b + 1], lengths[b : b + 1]))


# ---------------------------------------------------------------------------------------------- second derivatives


@pytest.mark.parametrize("multiroot", ROOTS)
def test_marginals_gradcheck_with_lengths_and_by_elimination(multiroot):
    struct = NonProjectiveDepTree(multiroot)
    scores = _scores(2, 3, seed=11).requires_grad_(True)
    lengths = torch.tensor([3, 2])
    assert torch.autograd.gradcheck(lambda s: struct.marginals(s, lengths), (scores,))
    # The elimination path (forced by a two-word cycle that costs ~80 nats to break) is twice differentiable too.
    big = _scores(1, 4, seed=13).repeat(2, 1, 1)
    big[:, 0, 1:] -= 40.0
    big[:, 1, 2] = big[:, 2, 1] = 40.0
    lengths = torch.tensor([4, 3])
    s, length, part = _prepare(big, lengths)
    assert _inexact(_laplacian(s, part, length, multiroot)[0]).all()
    big = big.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s: struct.marginals(s, lengths), (big,))


# --------------------------------------------------------------------------------------------- sample and sparsemap


@pytest.mark.parametrize("multiroot", ROOTS)
def test_sparsemap_is_in_the_polytope(multiroot):
    struct = NonProjectiveDepTree(multiroot)
    lengths = torch.tensor([4, 3, 1])
    scores = _scores(3, 4, seed=14, scale=1.0).requires_grad_(True)
    mu = struct.sparsemap(scores, lengths)
    assert mu.shape == scores.shape
    (mu * _scores(3, 4, seed=15)).sum().backward()
    assert torch.isfinite(scores.grad).all()
    sol = sparsemap_active_set(struct, scores.detach(), lengths)
    torch.testing.assert_close(sol.mu, mu.detach())
    torch.testing.assert_close(sol.weights.sum(-1), torch.ones(3, dtype=torch.float64))
    assert torch.all(sol.weights >= 0)
    for b, length in enumerate(lengths.tolist()):  # μ is a convex combination of trees
        for vertex, weight in zip(sol.vertices[b], sol.weights[b], strict=True):
            if weight > 0:
                _assert_valid_tree(vertex, multiroot, length)
    # Optimality against every tree: <s - μ, v - μ> ≤ 0 for all vertices v (here for the full-length example).
    vertices = enumerated(struct, 4)
    resid = (scores.detach()[0] - mu.detach()[0]).flatten()
    assert torch.all((vertices.flatten(1) - mu.detach()[0].flatten()) @ resid <= 1e-5)


# ---------------------------------------------------------------------------------------------------- larger inputs


@pytest.mark.parametrize("multiroot", ROOTS)
def test_batch_of_sentences_of_thirty_words(multiroot):
    struct = NonProjectiveDepTree(multiroot)
    lengths, scores, z, mu = thirty_words(struct, _scores)
    words = torch.arange(31) <= lengths.view(-1, 1)
    words[:, 0] = False
    assert torch.equal(z.sum(1), words.float())
    torch.testing.assert_close(mu.detach().sum(1), words.float())
    # The MAP tree scores no more than the log-partition, and at least as much as any sampled tree.
    log_z = struct.log_partition(scores.detach(), lengths)
    best = struct.score(z, scores.detach())
    assert torch.all(best <= log_z + 1e-4)
    for _ in range(3):
        assert torch.all(struct.score(struct.sample(scores.detach(), lengths), scores.detach()) <= best + 1e-4)
    for zb, length in zip(z, lengths.tolist(), strict=True):
        _assert_valid_tree(zb, multiroot, length)


@pytest.mark.parametrize("multiroot", ROOTS)
def test_map_of_sixty_words(multiroot):
    struct = NonProjectiveDepTree(multiroot)
    lengths = torch.randint(40, 61, (32,), generator=torch.Generator().manual_seed(1))
    scores = _scores(32, 60, seed=2)
    z = struct.map(scores, lengths)
    for zb, length in zip(z, lengths.tolist(), strict=True):
        _assert_valid_tree(zb, multiroot, length)


@pytest.mark.cuda
@pytest.mark.parametrize("scale", [2.0, 1000.0])
@pytest.mark.parametrize("multiroot", ROOTS)
def test_cuda_matches_cpu(multiroot, scale):
    struct = NonProjectiveDepTree(multiroot)
    lengths = torch.tensor([5, 3, 1])
    for dtype in DTYPES:
        scores = _scores(3, 5, dtype=dtype, seed=4, scale=scale)
        for method in (struct.map, struct.log_partition, struct.marginals):
            on_gpu = method(scores.cuda(), lengths.cuda())
            assert on_gpu.is_cuda and on_gpu.dtype == dtype
            torch.testing.assert_close(on_gpu.cpu(), method(scores, lengths))
