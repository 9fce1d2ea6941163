import pytest
import torch

from latentstruct.data.listops import left_branching, spans_to_trees
from latentstruct.models.composition import BinaryTreeLSTMCell, ChartTreeLSTM, SequenceLSTM
from latentstruct.structures.binary_tree import BinaryTree


def recursive_root(cell: BinaryTreeLSTMCell, x: torch.Tensor, z: torch.Tensor, length: int) -> torch.Tensor:
    """Plain recursive Tree-LSTM over the tree z [n, n] restricted to the first ``length`` leaves: root h."""
    spans = {(i, j) for i, j in (z[:length, :length] != 0).nonzero().tolist() if i < j}

    def state(i: int, j: int):
        if i == j:
            return cell.leaf(x[i])
        (k,) = [k for k in range(i, j) if (k == i or (i, k) in spans) and (k + 1 == j or (k + 1, j) in spans)]
        h_l, c_l = state(i, k)
        h_r, c_r = state(k + 1, j)
        return cell(h_l, c_l, h_r, c_r)

    return state(0, length - 1)[0]


def random_trees(lengths, n, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(len(lengths), n, n, generator=g, dtype=dtype)
    return BinaryTree().map(scores, torch.tensor(lengths)), scores


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hard_tree_matches_recursive(seed):
    torch.manual_seed(seed)
    lengths = [7, 1, 2, 5, 7, 3]
    n = 7
    model = ChartTreeLSTM(4, 6)
    x = torch.randn(len(lengths), n, 4)
    z, _ = random_trees(lengths, n, seed)
    root = model(x, torch.tensor(lengths), z)
    assert root.shape == (len(lengths), 6)
    for b, length in enumerate(lengths):
        ref = recursive_root(model.cell, x[b], z[b], length)
        torch.testing.assert_close(root[b], ref, atol=1e-5, rtol=1e-5)


def test_left_branching_and_stored_spans():
    torch.manual_seed(3)
    model = ChartTreeLSTM(3, 5)
    n = 6
    x = torch.randn(2, n, 3)
    z = torch.stack([left_branching(n), spans_to_trees(torch.tensor([[[0, 5], [1, 5], [1, 3], [2, 3], [4, 5]]]), n)[0]])
    root = model(x, torch.tensor([n, n]), z)
    for b in range(2):
        torch.testing.assert_close(root[b], recursive_root(model.cell, x[b], z[b], n), atol=1e-5, rtol=1e-5)


def test_junk_outside_parts_is_ignored():
    torch.manual_seed(4)
    model = ChartTreeLSTM(3, 4)
    lengths = torch.tensor([5, 3])
    z, _ = random_trees(lengths.tolist(), 5, seed=4)
    x = torch.randn(2, 5, 3)
    ref = model(x, lengths, z)
    z2, x2 = z.clone(), x.clone()
    z2[1, :, 3:] = float("nan")  # padding spans of example 1
    z2[:, torch.arange(5), torch.arange(5)] = 7.0  # diagonal
    z2[:, 3, 1] = float("nan")  # lower triangle
    x2[1, 3:] = float("nan")
    x2.requires_grad_(True)
    out = model(x2, lengths, z2)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    assert torch.isfinite(x2.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_relaxed_one_hot_and_mixture():
    torch.manual_seed(5)
    n = 6
    model = ChartTreeLSTM(3, 4)
    x = torch.randn(1, n, 3)
    trees = BinaryTree().enumerate(n)
    z1, z2 = trees[3:4], trees[20:21]
    lengths = torch.tensor([n])
    r1, r2 = model(x, lengths, z1), model(x, lengths, z2)
    torch.testing.assert_close(model(x, lengths, z1.clone().requires_grad_(True)), r1)
    mix = (0.3 * z1 + 0.7 * z2).requires_grad_(True)
    rm = model(x, lengths, mix)
    assert (rm - r1).abs().max() > 1e-4 and (rm - r2).abs().max() > 1e-4
    rm.sum().backward()
    assert torch.isfinite(mix.grad).all() and mix.grad.abs().sum() > 0


def test_gradient_through_marginals():
    torch.manual_seed(6)
    lengths = torch.tensor([6, 4, 1])
    model = ChartTreeLSTM(3, 4)
    x = torch.randn(3, 6, 3)
    scores = torch.randn(3, 6, 6, requires_grad=True)
    mu = BinaryTree().marginals(scores, lengths)
    root = model(x, lengths, mu)
    root.pow(2).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert scores.grad[0].abs().sum() > 0 and scores.grad[1].abs().sum() > 0
    assert scores.grad[2].abs().sum() == 0  # a single leaf has no parts


def test_gradcheck_tiny():
    torch.manual_seed(7)
    model = ChartTreeLSTM(2, 3).double()
    x = torch.randn(2, 4, 2, dtype=torch.float64, requires_grad=True)
    z = (0.1 + 0.9 * torch.rand(2, 4, 4, dtype=torch.float64)).triu(1).requires_grad_(True)
    lengths = torch.tensor([4, 3])
    assert torch.autograd.gradcheck(lambda x_, z_: model(x_, lengths, z_), (x, z))


def test_uniform_fallback_gradients_finite():
    model = ChartTreeLSTM(2, 3).double()
    x = torch.randn(1, 4, 2, dtype=torch.float64)
    z = torch.zeros(1, 4, 4, dtype=torch.float64, requires_grad=True)  # no span anywhere: every split uniform
    out = model(x, None, z)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(z.grad).all()


def test_padding_invariance():
    torch.manual_seed(8)
    model = ChartTreeLSTM(3, 5)
    z_small, _ = random_trees([4], 4, seed=8)
    x_small = torch.randn(1, 4, 3)
    alone = model(x_small, torch.tensor([4]), z_small)
    n = 9
    z_big, _ = random_trees([9, 4, 7], n, seed=9)
    z_big[1] = 0.0
    z_big[1, :4, :4] = z_small[0]
    z_big[1, 4:, 4:] = 0.5  # junk in padding
    x_big = torch.randn(3, n, 3)
    x_big[1, :4] = x_small[0]
    batched = model(x_big, torch.tensor([9, 4, 7]), z_big)
    torch.testing.assert_close(batched[1], alone[0], atol=1e-6, rtol=1e-5)


def test_single_leaf():
    torch.manual_seed(9)
    model = ChartTreeLSTM(3, 4)
    x = torch.randn(2, 1, 3, requires_grad=True)
    out = model(x, torch.tensor([1, 1]), torch.zeros(2, 1, 1))
    h, _ = model.cell.leaf(x[:, 0])
    torch.testing.assert_close(out, h)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    # a single leaf inside a longer padded batch
    x2 = torch.randn(2, 3, 3)
    x2[1, 0] = x[1, 0].detach()
    z2, _ = random_trees([3, 1], 3)
    torch.testing.assert_close(model(x2, torch.tensor([3, 1]), z2)[1], h[1].detach())


def test_checkpoint_same_values_and_grads():
    torch.manual_seed(10)
    model = ChartTreeLSTM(3, 4)
    x = torch.randn(2, 5, 3)
    scores = torch.randn(2, 5, 5)
    lengths = torch.tensor([5, 3])
    grads = []
    outs = []
    for ckpt in (False, True):
        model.checkpoint = ckpt
        model.zero_grad()
        s = scores.clone().requires_grad_(True)
        out = model(x, lengths, BinaryTree().marginals(s, lengths))
        out.pow(2).sum().backward()
        outs.append(out.detach())
        grads.append((s.grad.clone(), model.cell.gates.weight.grad.clone()))
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])


def test_sequence_lstm_shapes_and_padding():
    torch.manual_seed(11)
    embedding, model = torch.nn.Embedding(20, 8, padding_idx=0), SequenceLSTM(input_dim=8, dim=12)
    ids = torch.randint(1, 20, (3, 7))
    lengths = torch.tensor([7, 2, 5])
    out = model(embedding(ids), lengths)
    assert out.shape == (3, 12) and not model.uses_tree
    alone = model(embedding(ids[1:2, :2]), torch.tensor([2]))
    torch.testing.assert_close(out[1:2], alone, atol=1e-6, rtol=1e-5)
    ids2 = ids.clone()
    ids2[1, 2:] = 13  # whatever sits in the padding
    torch.testing.assert_close(model(embedding(ids2), lengths), out)
    torch.testing.assert_close(model(embedding(ids), lengths, torch.rand(3, 7, 7)), out)  # z is not read
    out.sum().backward()
    with pytest.raises(ValueError):
        model(embedding(ids), torch.tensor([8, 1, 1]))
