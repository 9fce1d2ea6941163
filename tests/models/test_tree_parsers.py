"""Incremental merge parsers (Gumbel Tree-LSTM, REINFORCE, PPO): trees, compositions, estimators on tiny cases."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from latentstruct.data.listops import (
    LISTOPS_VOCAB,
    gold_tree,
    leaves,
    left_branching,
    parse_expression,
    right_branching,
    serialize,
    tree_depth,
    tree_f1,
)
from latentstruct.estimators import GumbelSoftmax, StGumbel, ppo_loss, ppo_update, reinforce_loss
from latentstruct.models.composition import ChartTreeLSTM
from latentstruct.models.tree_parsers import MergeParser, tree_actions

DT = torch.float64


def make_parser(input_dim=3, dim=4, seed=0) -> MergeParser:
    torch.manual_seed(seed)
    parser = MergeParser(input_dim, dim).to(DT)
    with torch.no_grad():
        parser.query.normal_()  # a policy far from uniform, so that the score-function terms are not negligible
    return parser


def all_action_sequences(length: int) -> list[tuple[int, ...]]:
    return list(itertools.product(*[range(length - 1 - t) for t in range(length - 1)]))


def enumerate_batch(x: torch.Tensor, lengths: list[int]):
    """Every action sequence of every example as one batch: (x rows, lengths, actions [V, n-1], example index)."""
    n = x.shape[1]
    rows, lens, acts, owner = [], [], [], []
    for b, length in enumerate(lengths):
        for seq in all_action_sequences(length):
            rows.append(x[b])
            lens.append(length)
            acts.append(list(seq) + [7] * (n - length))  # junk at padded steps: must be ignored
            owner.append(b)
    return torch.stack(rows), torch.tensor(lens), torch.tensor(acts), torch.tensor(owner)


def spans_of(z: torch.Tensor) -> set[tuple[int, int]]:
    return {(i, j) for i, j in (z != 0).nonzero().tolist()}


def assert_binary_bracketing(z: torch.Tensor, length: int) -> None:
    """z [n, n]: n-1 nested constituents over 0..length-1 including the whole span; 0 elsewhere."""
    spans = spans_of(z)
    assert all(i < j < length for i, j in spans), spans
    assert len(spans) == length - 1
    if length >= 2:
        assert (0, length - 1) in spans
    for (i, j), (k, l) in itertools.combinations(spans, 2):
        assert j < k or l < i or (i <= k and l <= j) or (k <= i and j <= l), (i, j, k, l)  # disjoint or nested


def grads(value: torch.Tensor, params) -> torch.Tensor:
    return torch.cat([g.flatten() for g in torch.autograd.grad(value, params, retain_graph=True)])


# --- REINFORCE: unbiasedness by exact enumeration --------------------------------------------------------------------


@pytest.mark.parametrize("baseline", [None, 0.7, "per_example"])
def test_reinforce_expectation_equals_exact_gradient(baseline):
    """Σ_a π(a) ∇[task_loss(a) + reinforce_loss(a)] = −∇ Σ_a π(a) R(a), R = −task_loss, over all action sequences of
    two padded examples (lengths 4 and 3), with junk in the masked log-probabilities."""
    parser = make_parser()
    params = list(parser.parameters())
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 3, generator=g, dtype=DT)
    v = torch.randn(4, generator=g, dtype=DT)
    xs, lens, acts, owner = enumerate_batch(x, [4, 3])
    out = parser(xs, lens, mode="given", actions=acts)
    depth = torch.tensor([tree_depth(z, int(n)) for z, n in zip(out.z, lens, strict=True)], dtype=DT)
    reward = torch.tanh(out.h @ v) + 0.5 * depth  # depends on the parameters (root) and on the tree
    prob = out.log_prob.exp()
    for b in range(2):
        assert prob[owner == b].sum().item() == pytest.approx(1.0, abs=1e-12)

    exact = grads(-(prob * reward).sum(), params)
    if baseline == "per_example":
        baseline = torch.tensor([0.3, -1.2], dtype=DT)[owner]
    junk = (parser.query.sum() * 3.0).expand_as(out.log_probs)
    log_probs = torch.where(out.mask, out.log_probs, junk)  # a wrong mask would add junk's gradient
    surrogate = -reward + reinforce_loss(log_probs, out.mask, reward, baseline, reduction="none")
    estimate = grads((prob.detach() * surrogate).sum(), params)
    torch.testing.assert_close(estimate, exact, rtol=1e-9, atol=1e-10)

    # the score-function part matters here: with the sign flipped the identity fails
    flipped = -reward - reinforce_loss(log_probs, out.mask, reward, baseline, reduction="none")
    assert (grads((prob.detach() * flipped).sum(), params) - exact).abs().max() > 1e-3


def test_entropy_chain_rule_and_sampling_frequencies():
    """Σ_a π(a) Σ_t H_t(a) = H(π) over action sequences; ``sample`` draws sequences with probability π(a)."""
    parser = make_parser(seed=3)
    x = torch.randn(1, 4, 3, generator=torch.Generator().manual_seed(2), dtype=DT)
    xs, lens, acts, _ = enumerate_batch(x, [4])
    out = parser(xs, lens, mode="given", actions=acts)
    prob = out.log_prob.exp()
    expected_step_entropy = (prob * out.entropy.sum(-1)).sum()
    torch.testing.assert_close(expected_step_entropy, -(prob * out.log_prob).sum())

    draws = 20_000
    with torch.no_grad():
        sampled = parser(x.expand(draws, -1, -1), None, mode="sample", generator=torch.Generator().manual_seed(0))
    for seq, p, lp in zip(acts.tolist(), prob.tolist(), out.log_prob.tolist(), strict=True):
        hits = (sampled.actions == torch.tensor(seq)).all(-1)
        freq = hits.double().mean().item()
        assert abs(freq - p) < 4.5 * math.sqrt(p * (1 - p) / draws) + 1e-3, (seq, freq, p)
        if hits.any():  # the log-probability reported with a sample is that sequence's
            assert sampled.log_prob[hits][0].item() == pytest.approx(lp, abs=1e-9)


def test_reinforce_loss_value_mask_and_entropy_bonus():
    log_probs = torch.tensor([[-1.0, -2.0, 5.0], [-0.5, 9.0, 9.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    reward = torch.tensor([1.0, 0.0])
    entropy = torch.tensor([[0.3, 0.2, 100.0], [0.1, 100.0, 100.0]])
    # −mean_b (R − b) Σ_t log p: b = 0.5 → −((0.5)(−3) + (−0.5)(−0.5)) / 2
    assert reinforce_loss(log_probs, mask, reward, 0.5).item() == pytest.approx(-(-1.5 + 0.25) / 2)
    assert reinforce_loss(log_probs, mask, reward).item() == pytest.approx(3.0 / 2)
    bonus = reinforce_loss(log_probs, mask, reward, 0.5, entropy=entropy, entropy_weight=0.1)
    assert bonus.item() == pytest.approx(-(-1.5 + 0.25) / 2 - 0.1 * (0.5 + 0.1) / 2)
    # reward and baseline are detached
    r = reward.clone().requires_grad_()
    lp = log_probs.clone().requires_grad_()
    reinforce_loss(lp, mask, r, r * 0.5).backward()  # A = R − b = [0.5, 0]: ∂/∂log p = −A / B on real steps
    assert r.grad is None
    torch.testing.assert_close(lp.grad, torch.tensor([[-0.25, -0.25, 0.0], [0.0, 0.0, 0.0]]))


# --- following a given tree ------------------------------------------------------------------------------------------


def listops_inputs(expressions: list[str], dim_in: int, seed: int = 0):
    """Token vectors (one random vector per vocabulary entry), lengths and gold trees, padded to the longest."""
    table = torch.randn(len(LISTOPS_VOCAB), dim_in, generator=torch.Generator().manual_seed(seed), dtype=DT)
    token_lists = [serialize(parse_expression(e.split())) for e in expressions]
    words = [leaves(t) for t in token_lists]
    n = max(len(w) for w in words)
    x = torch.zeros(len(words), n, dim_in, dtype=DT)
    z = torch.zeros(len(words), n, n, dtype=DT)
    for b, (w, toks) in enumerate(zip(words, token_lists, strict=True)):
        x[b, : len(w)] = table[[LISTOPS_VOCAB.index(t) for t in w]]
        z[b, : len(w), : len(w)] = gold_tree(toks, DT)
    return x, torch.tensor([len(w) for w in words]), z


def test_given_gold_tree_reproduces_bracketing_and_composition():
    parser = make_parser(input_dim=3, dim=5)
    x, lengths, gold = listops_inputs(["[SM 3 4 ]", "[MAX 2 9 [MIN 4 7 ] 0 ]", "5"], 3)
    out = parser(x, lengths, mode="given", tree=gold)
    torch.testing.assert_close(out.z, gold, rtol=0, atol=0)
    assert out.mask.sum(-1).tolist() == [3, 8, 0]
    for b, length in enumerate(lengths.tolist()):
        assert tree_f1(out.z[b], gold[b], length) == 100.0

    # "[SM 3 4 ]" is ( ( ( [SM 3 ) 4 ) ] ): by hand, ((([SM 3) 4) ])
    cell = parser.cell
    l0, l1, l2, l3 = (cell.leaf(x[0, i]) for i in range(4))
    p01 = cell(*l0, *l1)
    p02 = cell(*p01, *l2)
    root = cell(*p02, *l3)[0]
    torch.testing.assert_close(out.h[0], root)
    torch.testing.assert_close(out.h[2], cell.leaf(x[2, 0])[0])  # a bare digit: its leaf

    chart = ChartTreeLSTM(3, 5).to(DT)
    chart.cell.load_state_dict(parser.cell.state_dict())
    torch.testing.assert_close(out.h, chart(x, lengths, gold))


def test_a_replay_without_scores_composes_the_same_root_with_one_cell_per_step():
    """``scores=False`` (the composer of Havrylov et al., the gold trees) computes only the merged pair at each step:
    the same root, tree and gradients as the replay that scores every pair, O(n) cells instead of O(n²)."""
    parser = make_parser(input_dim=3, dim=5)
    x, lengths, gold = listops_inputs(["[SM 3 4 ]", "[MAX 2 9 [MIN 4 7 ] 0 ]", "5", "[MED 1 [SM 2 3 ] ]"], 3)
    x.requires_grad_(True)
    full = parser(x, lengths, mode="given", tree=gold)
    calls = []
    hook = parser.cell.register_forward_hook(lambda mod, args, out: calls.append(args[0].shape[1]))
    try:
        replay = parser(x, lengths, mode="given", tree=gold, scores=False)
    finally:
        hook.remove()
    assert calls == [1] * (x.shape[1] - 1)  # one pair a step, for the whole batch
    torch.testing.assert_close(replay.h, full.h)
    torch.testing.assert_close(replay.c, full.c)
    assert torch.equal(replay.z, full.z) and torch.equal(replay.actions, full.actions)
    assert replay.log_probs is None and replay.entropy is None
    weights = torch.randn_like(full.h)
    params = [x, *parser.cell.parameters()]
    torch.testing.assert_close(grads((replay.h * weights).sum(), params), grads((full.h * weights).sum(), params))
    with pytest.raises(ValueError, match="scores=False composes given merges only"):
        parser(x, lengths, mode="argmax", scores=False)


def test_tree_actions_round_trip():
    n = 6
    left, right = left_branching(n, DT), right_branching(n, DT)
    assert tree_actions(left.unsqueeze(0)).tolist() == [[0] * (n - 1)]
    assert tree_actions(right.unsqueeze(0)).tolist() == [[4, 3, 2, 1, 0]]
    parser = make_parser()
    x = torch.randn(5, n, 3, dtype=DT)
    lengths = torch.tensor([6, 1, 2, 5, 3])
    with torch.no_grad():
        sampled = parser(x, lengths, mode="sample", generator=torch.Generator().manual_seed(0))
        replay = parser(x, lengths, mode="given", tree=sampled.z)
    torch.testing.assert_close(replay.z, sampled.z, rtol=0, atol=0)
    torch.testing.assert_close(replay.h, sampled.h)  # same tree, same root, whatever the merge order

    with pytest.raises(ValueError, match="constituents"):
        tree_actions(torch.zeros(1, 3, 3))
    crossing = torch.zeros(1, 4, 4)
    crossing[0, 0, 1] = crossing[0, 1, 2] = crossing[0, 0, 3] = 1
    with pytest.raises(ValueError, match="not a binary bracketing"):
        parser(x[:1, :4], None, mode="given", tree=crossing)
    with pytest.raises(ValueError, match="out of range"):
        parser(x[:1, :4], None, mode="given", actions=torch.tensor([[3, 0, 0]]))
    with pytest.raises(ValueError, match="exactly one"):
        parser(x[:1, :4], None, mode="given")


# --- argmax, validity, padding ----------------------------------------------------------------------------------------


class _PositionalScores(MergeParser):
    """Scores that prefer the leftmost (sign=+1) or rightmost (sign=-1) pair, whatever the states."""

    def __init__(self, sign: float, **kwargs):
        super().__init__(**kwargs)
        self.sign = sign

    def score(self, parent_h):
        position = torch.arange(parent_h.shape[1], dtype=parent_h.dtype)
        return -self.sign * position.expand(parent_h.shape[:2]) + 0 * parent_h.sum(-1)


@pytest.mark.parametrize("sign, branching", [(1.0, left_branching), (-1.0, right_branching)])
def test_argmax_with_positional_scorer(sign, branching):
    parser = _PositionalScores(sign, input_dim=3, dim=4).to(DT).eval()
    lengths = [6, 4, 1, 2]
    out = parser(torch.randn(4, 6, 3, dtype=DT), torch.tensor(lengths), mode="estimate")  # → argmax in eval
    for b, length in enumerate(lengths):
        expected = torch.zeros(6, 6, dtype=DT)
        expected[:length, :length] = branching(length, DT)
        torch.testing.assert_close(out.z[b], expected, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["estimate", "sample", "argmax"])
def test_trees_are_binary_bracketings(mode):
    parser = make_parser()
    g = torch.Generator().manual_seed(4)
    lengths = torch.randint(1, 10, (12,), generator=g)
    x = torch.randn(12, 9, 3, generator=g, dtype=DT)
    out = parser(x, lengths, mode=mode, generator=g, estimator=StGumbel())
    assert out.z.shape == (12, 9, 9) and out.actions.shape == out.log_probs.shape == (12, 8)
    for b, length in enumerate(lengths.tolist()):
        assert_binary_bracketing(out.z[b], length)
    assert (out.log_probs <= 0).all() and (out.entropy >= 0).all()
    assert (out.log_probs[~out.mask] == 0).all() and (out.actions[~out.mask] == 0).all()


@pytest.mark.parametrize("mode", ["argmax", "given"])
def test_padding_invariance(mode):
    parser = make_parser()
    g = torch.Generator().manual_seed(5)
    lengths = torch.tensor([5, 2, 4, 1])
    base = torch.randn(4, 8, 3, generator=g, dtype=DT)
    real = (torch.arange(8) < lengths.view(-1, 1)).unsqueeze(-1)
    small = torch.where(real, base, torch.full_like(base, -7.0))[:, :5]
    big = torch.where(real, base, 1e3 * torch.randn(4, 8, 3, generator=g, dtype=DT))  # n = 8, other junk
    big[1, 3] = float("nan")
    big[2, 6] = float("inf")
    trees = torch.zeros(4, 5, 5, dtype=DT)
    trees[0] = right_branching(5, DT)
    trees[1, 0, 1] = 1
    trees[2, 1, 2] = trees[2, 0, 2] = trees[2, 0, 3] = 1  # ((0 (1 2)) 3)
    given = {"tree": trees} if mode == "given" else {}
    given_big = {"tree": torch.nn.functional.pad(trees, (0, 3, 0, 3))} if mode == "given" else {}
    out = parser(small, lengths, mode=mode, **given)
    out_big = parser(big, lengths, mode=mode, **given_big)
    torch.testing.assert_close(out_big.h, out.h)
    torch.testing.assert_close(out_big.z[:, :5, :5], out.z, rtol=0, atol=0)
    assert out_big.z[:, 5:].sum() == 0 and out_big.z[:, :, 5:].sum() == 0
    torch.testing.assert_close(out_big.log_probs[:, :4], out.log_probs)
    torch.testing.assert_close(out_big.entropy[:, :4], out.entropy)
    assert (out_big.log_probs[:, 4:] == 0).all() and not out_big.mask[:, 4:].any()
    if mode == "given":
        torch.testing.assert_close(out.z, trees, rtol=0, atol=0)
    # the junk (even NaN / inf) reaches no gradient either
    weights = torch.randn(4, 4, dtype=DT)
    params = list(parser.parameters())
    g_small = grads((out.h * weights).sum() + out.log_prob.sum(), params)
    g_big = grads((out_big.h * weights).sum() + out_big.log_prob.sum(), params)
    assert torch.isfinite(g_big).all()
    torch.testing.assert_close(g_big, g_small)
    # and independent of the rest of the batch
    alone = parser(small[2:3], lengths[2:3], mode=mode, **({"tree": trees[2:3]} if mode == "given" else {}))
    torch.testing.assert_close(alone.h, out.h[2:3])
    torch.testing.assert_close(alone.z, out.z[2:3], rtol=0, atol=0)


# --- Gumbel straight-through ------------------------------------------------------------------------------------------


def test_gumbel_parser_is_hard_forward_and_trains_the_query():
    """estimator=st_gumbel at every merge (the Gumbel Tree-LSTM): the forward pass is the hard tree, the gradient
    reaches the query; in eval mode the merges are greedy."""
    parser = make_parser()
    lengths = torch.tensor([6, 3, 1])
    x = torch.randn(3, 6, 3, dtype=DT)
    estimator = StGumbel(0.7)
    torch.manual_seed(0)
    out = parser(x, lengths, mode="estimate", estimator=estimator)
    replay = parser(x, lengths, mode="given", actions=out.actions)
    torch.testing.assert_close(out.h, replay.h, rtol=0, atol=0)  # the forward pass is exactly the hard tree
    torch.testing.assert_close(out.z, replay.z, rtol=0, atol=0)
    (out.h**2).sum().backward()
    assert parser.query.grad is not None and parser.query.grad.abs().sum() > 0
    parser.query.grad = None
    (replay.h**2).sum().backward()
    assert parser.query.grad is None or parser.query.grad.abs().sum() == 0  # teacher forcing: no path to q

    parser.eval()
    torch.testing.assert_close(parser(x, lengths, mode="estimate", estimator=estimator).z, parser(x, lengths).z)
    with pytest.raises(ValueError, match="estimator"):
        parser.train()(x, lengths, mode="estimate")


def test_the_merges_take_the_rule_of_their_estimator():
    """Each merge is one Categorical choice made by the §5 estimator: st_gumbel's one-hot is argmax(s + G) with G the
    noise drawn at that step, and a relaxed estimator (gumbel_softmax) merges softly, its root a smooth mixture."""
    parser = make_parser(seed=6)
    lengths = torch.tensor([5, 4])
    x = torch.randn(2, 5, 3, dtype=DT)
    torch.manual_seed(1)
    hard = parser(x, lengths, mode="estimate", estimator=StGumbel())
    torch.manual_seed(1)  # the same noise: st_gumbel's choices are the Gumbel-max samples of the same scores
    sampled = parser(x, lengths, mode="sample")
    assert torch.equal(hard.actions, sampled.actions) and torch.equal(hard.z, sampled.z)
    torch.testing.assert_close(hard.h, sampled.h, rtol=0, atol=0)
    torch.manual_seed(1)
    soft = parser(x, lengths, mode="estimate", estimator=GumbelSoftmax(1.0))
    assert not torch.allclose(soft.h, hard.h)  # mixed nodes, not one tree's
    for b, length in enumerate(lengths.tolist()):
        assert_binary_bracketing(soft.z[b], length)  # the recorded tree: the argmax of each relaxed choice


# --- PPO -------------------------------------------------------------------------------------------------------------


def test_ppo_loss_ratio_one_and_clipping():
    parser = make_parser()
    params = list(parser.parameters())
    x = torch.randn(4, 5, 3, dtype=DT)
    lengths = torch.tensor([5, 4, 2, 1])
    out = parser(x, lengths, mode="sample", generator=torch.Generator().manual_seed(1))
    advantage = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=DT)  # examples 2, 3 have a single parse
    junk = (parser.query.sum() * 5).expand_as(out.log_probs)
    new = torch.where(out.mask, out.log_probs, junk)
    # ratio 1: the REINFORCE gradient with R − b = A
    loss = ppo_loss(new, out.log_probs.detach(), out.mask, advantage)
    assert loss.item() == pytest.approx(-advantage.mean().item())
    torch.testing.assert_close(grads(loss, params), grads(reinforce_loss(new, out.mask, advantage), params))

    # old log-probabilities shifted on one real step: ratio 1.5 (> 1 + ε) or 0.5 (< 1 − ε)
    for ratio in (1.5, 0.5):
        old = out.log_probs.detach().clone()
        old[:, 0] -= math.log(ratio) * out.mask[:, 0]
        per = ppo_loss(new, old, out.mask, advantage, clip=0.2, reduction="none")
        r = torch.where(out.mask[:, 0], torch.tensor(ratio, dtype=DT), torch.tensor(1.0, dtype=DT))
        expected = -torch.minimum(r * advantage, r.clamp(0.8, 1.2) * advantage)
        torch.testing.assert_close(per.detach(), expected)
        for b in range(2):  # several parses: clipped (zero gradient) exactly when A pushes ρ further out
            g = grads(per[b], params)
            clipped = (ratio > 1 and advantage[b] > 0) or (ratio < 1 and advantage[b] < 0)
            assert (g.abs().max() == 0) if clipped else (g.abs().max() > 0), (ratio, b)


def test_ppo_update_moves_the_policy_towards_the_advantage():
    parser = make_parser(seed=2)
    x = torch.randn(8, 5, 3, dtype=DT)
    lengths = torch.tensor([5, 5, 4, 3, 5, 2, 4, 5])
    with torch.no_grad():
        old = parser(x, lengths, mode="sample", generator=torch.Generator().manual_seed(0))
    advantage = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, 1.0, -1.0, -1.0], dtype=DT)
    opt = torch.optim.SGD(parser.parameters(), lr=0.05)

    def rescore(actions):
        return parser(x, lengths, mode="given", actions=actions).log_probs

    losses = ppo_update(rescore, old.actions, old.log_probs, old.mask, advantage, opt, epochs=3, max_grad_norm=5.0)
    assert len(losses) == 3 and losses[0] == pytest.approx(-advantage.mean().item())
    assert losses[-1] < losses[0]
    with torch.no_grad():
        new = parser(x, lengths, mode="given", actions=old.actions).log_prob
    moved = (new - old.log_prob) * advantage
    real = lengths > 2  # length 2 has a single parse
    assert (moved[real] > 0).sum() >= 5
