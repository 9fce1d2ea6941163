"""latentstruct.structures.sequence.SequenceTagging against brute-force enumeration (DESIGN.md §4 contract, §9).

The ground truth is ``enumerate(n)``, itself checked against an independent brute force written here (explicit loops
over tag tuples) and the known count T^n. Viterbi, the forward algorithm, the marginals (forward-backward) and the
exact sampler (forward filtering, backward sampling) are compared with it for every small size, with and without
lengths; torch-struct's LinearChainCRF is a second reference when it is importable.
"""

import itertools

import pytest
import torch

from latentstruct.structures.sequence import SequenceTagging
from tests.structures.reference import (
    brute_log_partition,
    brute_marginals,
    brute_max,
    enumerated,
    gibbs,
    scores_maker,
    tol,
)

SIZES = list(range(1, 5))
TAGS = [2, 3]
DTYPES = [torch.float32, torch.float64]


_scores = scores_maker(lambda n, num: (n, num, num))


def _independent_vertex(tags, num):
    """The indicator of a tag tuple, written with explicit loops (shares no code with the module under test)."""
    z = torch.zeros(len(tags), num, num)
    for i, tag in enumerate(tags):
        z[i, tags[i - 1] if i > 0 else 0, tag] = 1.0
    return z


def _tags(z):
    """Tag tuple of a 0/1 vertex [n, T, T]: each position has exactly one 1, in the column of its tag."""
    assert torch.all(z.sum((-2, -1)) == 1)
    return tuple(int(z[i].sum(0).argmax()) for i in range(z.shape[0]))


def _assert_valid(z, num, length=None):
    """z [n, T, T] is the indicator of a tag sequence over its first ``length`` positions and 0 elsewhere."""
    length = z.shape[0] if length is None else length
    assert set(z.unique().tolist()) <= {0.0, 1.0}
    assert torch.all(z[length:] == 0)
    tags = _tags(z[:length])
    assert torch.equal(z[:length], _independent_vertex(tags, num).to(z))


# --------------------------------------------------------------------------------------------------------- enumerate


@pytest.mark.parametrize("num", TAGS)
@pytest.mark.parametrize("n", SIZES)
def test_enumerate_is_every_tag_sequence_once(n, num):
    vertices = SequenceTagging(num).enumerate(n)
    assert vertices.shape == (num**n, n, num, num)
    tags = [_tags(v) for v in vertices]
    assert len(set(tags)) == len(tags) == num**n
    assert set(tags) == set(itertools.product(range(num), repeat=n))
    for v, t in zip(vertices, tags, strict=True):
        assert torch.equal(v, _independent_vertex(t, num))
    assert torch.all(vertices[:, 0, 1:] == 0)  # rows 1.. of position 0 are never parts


# ------------------------------------------------------------------------------------ map, log-partition, marginals


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num", TAGS)
@pytest.mark.parametrize("n", SIZES)
def test_map_is_the_best_enumerated_sequence(n, num, dtype):
    struct = SequenceTagging(num)
    scores = _scores(6, n, num, dtype=dtype, seed=10 * n + num).requires_grad_(True)
    z = struct.map(scores)
    assert z.shape == scores.shape and z.dtype == dtype and not z.requires_grad
    vertices = enumerated(struct, n).to(scores)
    torch.testing.assert_close(struct.score(z, scores.detach()), brute_max(scores.detach(), vertices), **tol(dtype))
    for zb in z:
        assert (vertices == zb).flatten(1).all(-1).any(), "MAP is not a vertex"
        _assert_valid(zb, num)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num", TAGS)
@pytest.mark.parametrize("n", SIZES)
def test_log_partition_is_logsumexp_over_sequences(n, num, dtype):
    struct = SequenceTagging(num)
    scores = _scores(6, n, num, dtype=dtype, seed=n + num)
    log_z = struct.log_partition(scores)
    assert log_z.shape == (6,) and log_z.dtype == dtype
    torch.testing.assert_close(log_z, brute_log_partition(scores, enumerated(struct, n)), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num", TAGS)
@pytest.mark.parametrize("n", SIZES)
def test_marginals_are_the_expected_sequence(n, num, dtype):
    struct = SequenceTagging(num)
    scores = _scores(6, n, num, dtype=dtype, seed=n + 100 * num)
    mu = struct.marginals(scores)
    torch.testing.assert_close(mu, brute_marginals(scores, enumerated(struct, n)), **tol(dtype))
    assert torch.all(mu[:, 0, 1:] == 0)
    # Every position has one (previous, current) tag pair in expectation.
    torch.testing.assert_close(mu.sum((-2, -1)), torch.ones_like(mu[..., 0, 0]), **tol(dtype))


def test_non_parts_of_position_zero_are_ignored():
    struct = SequenceTagging(3)
    scores = _scores(4, 4, 3, seed=7)
    junk = scores.clone()
    junk[:, 0, 1] = float("nan")
    junk[:, 0, 2] = float("inf")
    torch.testing.assert_close(struct.log_partition(junk), struct.log_partition(scores))
    torch.testing.assert_close(struct.marginals(junk), struct.marginals(scores))
    assert torch.equal(struct.map(junk), struct.map(scores))
    g = torch.Generator().manual_seed(0)
    assert torch.equal(struct.exact_sample(junk, generator=g), struct.exact_sample(scores, generator=g.manual_seed(0)))


def test_forbidden_transitions_get_zero_marginals_not_nan():
    # A constrained CRF: tag 2 may neither start a sequence nor follow tag 0, and tag 1 never reaches tag 1; with
    # start = -inf on tag 2 and every transition into 2 forbidden, tag 2 is unreachable everywhere.
    struct = SequenceTagging(3)
    for forbid_all in (False, True):
        scores = _scores(4, 4, 3, seed=12)
        scores[:, 0, 0, 2] = float("-inf")
        scores[:, 1:, 0, 2] = float("-inf")
        scores[:, 1:, 1, 1] = float("-inf")
        if forbid_all:
            scores[:, 1:, :, 2] = float("-inf")
        scores.requires_grad_(True)
        vertices = enumerated(struct, 4)
        mu = struct.marginals(scores)
        torch.testing.assert_close(mu.detach(), brute_marginals(scores.detach(), vertices))
        log_z = struct.log_partition(scores).detach()
        torch.testing.assert_close(log_z, brute_log_partition(scores.detach(), vertices))
        (grad,) = torch.autograd.grad((mu * torch.randn_like(mu)).sum(), scores)
        assert torch.isfinite(grad).all()
        z = struct.map(scores)
        ours = torch.where(z.bool(), scores.detach(), 0.0).flatten(1).sum(-1)
        torch.testing.assert_close(ours, brute_max(scores.detach(), vertices))
        sample = struct.exact_sample(scores.detach().repeat(125, 1, 1, 1), generator=torch.Generator().manual_seed(0))
        assert torch.all(sample[:, 0, 0, 2] == 0) and torch.all(sample[:, 1:, 0, 2] == 0)
        assert torch.all(sample[:, 1:, 1, 1] == 0)


# ------------------------------------------------------------------------------------------------------------ lengths


@pytest.mark.parametrize("num", TAGS)
def test_lengths_equal_the_cropped_problems(num):
    struct = SequenceTagging(num)
    n, lengths = 5, torch.tensor([5, 3, 1, 4, 2])
    scores = _scores(len(lengths), n, num, seed=3)
    for b, length in enumerate(lengths.tolist()):  # padding may hold anything, even NaN or the −inf of a mask
        scores[b, length:, 0] = float("-inf")
        scores[b, length:, 1:] = float("nan")
    z = struct.map(scores, lengths)
    log_z = struct.log_partition(scores, lengths)
    mu = struct.marginals(scores, lengths)
    for b, length in enumerate(lengths.tolist()):
        block = scores[b : b + 1, :length]
        for got, want in ((z[b], struct.map(block)[0]), (mu[b], struct.marginals(block)[0])):
            torch.testing.assert_close(got[:length], want)
            assert torch.all(got[length:] == 0)
        torch.testing.assert_close(log_z[b], struct.log_partition(block)[0])
        _assert_valid(z[b], num, length)
    assert torch.isfinite(mu).all() and torch.isfinite(log_z).all()
    # Lengths given as a list work too.
    torch.testing.assert_close(struct.log_partition(scores, lengths.tolist()), log_z)


def test_lengths_gradients_stay_off_padding():
    struct = SequenceTagging(3)
    lengths = torch.tensor([4, 2])
    scores = _scores(2, 4, 3, seed=5)
    scores[1, 2:] = float("nan")
    scores.requires_grad_(True)
    struct.log_partition(scores, lengths).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert torch.all(scores.grad[1, 2:] == 0)
    assert torch.all(scores.grad[:, 0, 1:] == 0)


# ---------------------------------------------------------------------------------------------- second derivatives


def test_marginals_gradcheck():
    struct = SequenceTagging(2)
    scores = _scores(2, 3, 2, seed=11).requires_grad_(True)
    lengths = torch.tensor([3, 2])
    assert torch.autograd.gradcheck(lambda s: struct.marginals(s), (scores,))
    assert torch.autograd.gradcheck(lambda s: struct.marginals(s, lengths), (scores,))
    assert torch.autograd.gradgradcheck(lambda s: struct.log_partition(s, lengths), (scores,))


# ----------------------------------------------------------------------------------------------------------- sample


def _frequencies(z, vertices):
    """Empirical frequency of each vertex among samples z [N, ...] (every sample must be a vertex)."""
    match = (z.flatten(1).unsqueeze(1) == vertices.flatten(1).unsqueeze(0)).all(-1)  # [N, V]
    assert torch.all(match.sum(-1) == 1), "a sample is not a vertex"
    return match.double().mean(0)


def _total_variation(sampler, n, num, length, draws):
    """TV distance between ``draws`` samples of ``sampler`` and the exact Gibbs distribution over tag sequences."""
    scores = _scores(1, n, num, seed=21, scale=1.0)
    scores[:, length:] = float("nan")
    lengths = torch.full((draws,), length)
    z = sampler(scores.expand(draws, -1, -1, -1), lengths, generator=torch.Generator().manual_seed(0))
    assert z.shape == (draws, n, num, num) and z.dtype == scores.dtype
    assert torch.all(z[:, length:] == 0)
    vertices = enumerated(SequenceTagging(num), length)
    exact = gibbs(scores[:, :length], vertices)[0]
    return 0.5 * (_frequencies(z[:, :length], vertices) - exact).abs().sum()


@pytest.mark.parametrize(("n", "num", "length"), [(3, 3, 3), (4, 2, 3), (4, 2, 4)])
def test_exact_sample_matches_the_gibbs_distribution(n, num, length):
    tv = _total_variation(SequenceTagging(num).exact_sample, n, num, length, draws=20000)
    assert tv < 0.03, f"total variation {tv:.4f}"


def test_the_sampling_test_has_power():
    # Perturb-and-MAP with part-level noise is not an exact sampler: the same test rejects it, even with fewer draws.
    assert _total_variation(SequenceTagging(3).sample, 3, 3, 3, draws=5000) > 0.05


def test_exact_sample_is_reproducible_with_a_generator():
    struct = SequenceTagging(3)
    scores = _scores(8, 5, 3, seed=1, dtype=torch.float32)
    a = struct.exact_sample(scores, generator=torch.Generator().manual_seed(3))
    b = struct.exact_sample(scores, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.dtype == torch.float32


def test_perturb_and_map_samples_and_sparsemap():
    struct = SequenceTagging(3)
    lengths = torch.tensor([4] * 16 + [2] * 16)
    scores = _scores(32, 4, 3, seed=2, scale=0.5)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        z = struct.sample(scores, lengths, generator=g)
        assert z.shape == scores.shape
        for zb, length in zip(z, lengths.tolist(), strict=True):
            _assert_valid(zb, 3, length)
    # SparseMAP (the projection onto the polytope: test_contract.py) is exactly 0 off the parts.
    mu = struct.sparsemap(_scores(3, 3, 3, seed=9, scale=0.5))
    assert torch.all(mu[:, 0, 1:] == 0) and torch.all(mu >= -1e-9)


# ----------------------------------------------------------------------------------------------------------- helpers


def test_parts_builds_the_crf_score():
    g = torch.Generator().manual_seed(4)
    batch, n, num = 3, 4, 3
    emissions = torch.randn(batch, n, num, generator=g, dtype=torch.float64)
    transitions = torch.randn(num, num, generator=g, dtype=torch.float64)
    start, end = torch.randn(num, generator=g, dtype=torch.float64), torch.randn(num, generator=g, dtype=torch.float64)
    lengths = torch.tensor([4, 2, 1])
    scores = SequenceTagging.parts(emissions, transitions, start, end, lengths)
    assert scores.shape == (batch, n, num, num)
    assert torch.all(scores[:, 0, 1:] == 0)
    for b, length in enumerate(lengths.tolist()):
        for tags in itertools.product(range(num), repeat=length):
            crf = start[tags[0]] + end[tags[-1]] + sum(emissions[b, i, tags[i]] for i in range(length))
            crf = crf + sum(transitions[tags[i - 1], tags[i]] for i in range(1, length))
            z = _independent_vertex(tags, num).to(scores)
            torch.testing.assert_close((z * scores[b, :length]).sum(), crf)
    # Per-example transitions broadcast the same way; no start/end leaves the emissions alone at position 0.
    per_example = SequenceTagging.parts(emissions, transitions.expand(batch, num, num))
    torch.testing.assert_close(per_example[:, 1:], emissions[:, 1:].unsqueeze(-2) + transitions)
    torch.testing.assert_close(per_example[:, 0, 0], emissions[:, 0])
    torch.testing.assert_close(per_example, SequenceTagging.parts(emissions, transitions))


def test_tags_reads_back_the_sequence():
    struct = SequenceTagging(3)
    vertices = struct.enumerate(3)
    torch.testing.assert_close(
        SequenceTagging.tags(vertices), torch.tensor(list(itertools.product(range(3), repeat=3)))
    )
    lengths = torch.tensor([4, 2])
    z = struct.map(_scores(2, 4, 3, seed=8), lengths)
    tags = SequenceTagging.tags(z)
    assert tags.dtype == torch.long and torch.all(tags[1, 2:] == -1) and torch.all(tags[0] >= 0)
    assert tags[0].tolist() == list(_tags(z[0])) and tags[1, :2].tolist() == list(_tags(z[1, :2]))


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="expects scores"):
        SequenceTagging(3).map(torch.zeros(2, 4, 3, 2))
    with pytest.raises(ValueError, match="num_tags"):
        SequenceTagging(0)


# ------------------------------------------------------------------------------------------ torch-struct cross-check


@pytest.mark.parametrize("num", TAGS)
def test_agrees_with_torch_struct_linear_chain_crf(num):
    torch_struct = pytest.importorskip("torch_struct")
    struct = SequenceTagging(num)
    n, lengths = 5, torch.tensor([5, 3, 2, 4])
    scores = _scores(len(lengths), n, num, seed=13)
    # torch-struct: log_potentials [B, N-1, C, C], entry [b, k, c_next, c_prev] = φ(k, z_{k+1} = c_next, z_k = c_prev),
    # with the first position's own score folded into the first edge. Ours: scores[b, k+1, c_prev, c_next].
    theirs = scores[:, 1:].transpose(-1, -2).clone()
    theirs[:, 0] += scores[:, 0, 0].unsqueeze(-2)

    def ours_from_edges(edges):
        out = torch.zeros_like(scores)
        out[:, 1:] = edges.transpose(-1, -2)
        out[:, 0, 0] = edges[:, 0].sum(-2)  # marginal of z_0: sum over z_1
        for b, length in enumerate(lengths.tolist()):
            out[b, length:] = 0
        return out

    dist = torch_struct.LinearChainCRF(theirs, lengths=lengths)
    torch.testing.assert_close(struct.log_partition(scores, lengths), dist.partition.detach())
    torch.testing.assert_close(struct.marginals(scores, lengths), ours_from_edges(dist.marginals.detach()))
    assert torch.equal(struct.map(scores, lengths), ours_from_edges(dist.argmax.detach()))


# ---------------------------------------------------------------------------------------------------- larger inputs


def test_batch_of_sequences_of_thirty_positions():
    struct = SequenceTagging(5)
    lengths = torch.randint(1, 31, (32,), generator=torch.Generator().manual_seed(0))
    lengths[0] = 30
    scores = _scores(32, 30, 5, dtype=torch.float32, seed=1).requires_grad_(True)
    z = struct.map(scores, lengths)
    mu = struct.marginals(scores, lengths)
    (mu * torch.randn_like(mu)).sum().backward()
    assert torch.isfinite(scores.grad).all()
    live = (torch.arange(30) < lengths.view(-1, 1)).float()
    assert torch.equal(z.sum((-2, -1)), live)
    torch.testing.assert_close(mu.detach().sum((-2, -1)), live, atol=1e-4, rtol=0)  # float32 over 30 steps
    assert torch.all(struct.score(z, scores.detach()) <= struct.log_partition(scores.detach(), lengths) + 1e-4)
    sample = struct.exact_sample(scores, lengths, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample.sum((-2, -1)), live)


@pytest.mark.cuda
def test_cuda_matches_cpu():
    struct = SequenceTagging(3)
    lengths = torch.tensor([5, 3, 1])
    scores = _scores(3, 5, 3, seed=4)
    for method in (struct.map, struct.log_partition, struct.marginals):
        on_gpu = method(scores.cuda(), lengths.cuda())
        assert on_gpu.is_cuda
        torch.testing.assert_close(on_gpu.cpu(), method(scores, lengths))
    sample = struct.exact_sample(scores.cuda(), lengths, generator=torch.Generator("cuda").manual_seed(0))
    assert sample.is_cuda and torch.equal(sample.sum((-2, -1)).cpu(), (torch.arange(5) < lengths.view(-1, 1)).float())
