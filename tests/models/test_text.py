"""latentstruct.models.text: shapes, padding invariance, eq. 23 against a naive computation, head vectors, frozen
embeddings, masked softmax, attention pooling and the end-to-end latent-tree path (MAP and marginals)."""

from __future__ import annotations

import pytest
import torch

from latentstruct.models.masks import check_lengths, masked_softmax, masked_sum
from latentstruct.models.text import (
    ArcScorer,
    BaselineSST,
    BiLSTMEncoder,
    DecomposableAttention,
    Embedder,
    SSTDecoder,
    head_vectors,
)
from latentstruct.structures import ProjectiveDepTree

LENGTHS = torch.tensor([5, 2, 4])
N = 5
TOL = {"atol": 1e-10, "rtol": 1e-10}


def _words(batch: int = 3, n: int = N, d: int = 6, seed: int = 0) -> torch.Tensor:
    """Random float64 word vectors with garbage (large values) at the padding of ``LENGTHS``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n, d, generator=g, dtype=torch.float64)
    pad = torch.arange(n).view(1, -1) >= LENGTHS[:batch].view(-1, 1)
    return x.masked_fill(pad.unsqueeze(-1), 1e3)


def _module(cls, *args, **kwargs):
    torch.manual_seed(0)
    return cls(*args, **kwargs).double().eval()


def _naive_scores(scorer: ArcScorer, h: torch.Tensor) -> torch.Tensor:
    """Eq. 23 literally: vᵀ tanh(W [x_i; x_j] + b) over the materialised [B, N, N, 2d] concatenations."""
    x = torch.cat([scorer.root.expand(h.shape[0], 1, -1), h], dim=1)
    size = x.shape[1]
    pairs = torch.cat([x.unsqueeze(2).expand(-1, -1, size, -1), x.unsqueeze(1).expand(-1, size, -1, -1)], -1)
    w = torch.cat([scorer.head.weight, scorer.modifier.weight], dim=1)  # [k, 2d]
    return torch.tanh(pairs @ w.T + scorer.head.bias) @ scorer.v.weight.squeeze(0)


# ---------------------------------------------------------------------------------------------------- embedding


def test_embedder_random_init_trainable_with_zero_pad_row():
    emb = Embedder(10, 4)
    assert emb.embedding.weight.requires_grad and emb.out_dim == 4
    assert torch.all(emb.embedding.weight[0] == 0)
    ids = torch.tensor([[3, 4, 0]])
    assert emb(ids).shape == (1, 3, 4)
    emb(ids).sum().backward()
    grad = emb.embedding.weight.grad
    assert grad[3].abs().sum() > 0 and torch.all(grad[0] == 0)


def test_embedder_pretrained_frozen_and_trainable():
    pretrained = torch.randn(10, 4)
    frozen = Embedder(10, 4, pretrained=pretrained)
    assert torch.equal(frozen.embedding.weight, pretrained)
    assert not frozen.embedding.weight.requires_grad
    out = frozen(torch.tensor([[1, 2]]))
    assert not out.requires_grad and frozen.embedding.weight.grad is None

    trainable = Embedder(10, 4, pretrained=pretrained, freeze=False)
    trainable(torch.tensor([[1, 2]])).sum().backward()
    assert trainable.embedding.weight.grad[1].abs().sum() > 0
    with pytest.raises(ValueError):
        Embedder(10, 5, pretrained=pretrained)


# ------------------------------------------------------------------------------------------------------ encoder


def test_encoder_shapes_zero_padding_and_padding_invariance():
    enc = _module(BiLSTMEncoder, 6, 8)
    x = _words()
    out = enc(x, LENGTHS)
    assert out.shape == (3, N, 8) and enc.out_dim == 8
    pad = torch.arange(N).view(1, -1) >= LENGTHS.view(-1, 1)
    assert torch.all(out[pad] == 0)
    for b, length in enumerate(LENGTHS.tolist()):
        alone = enc(x[b : b + 1, :length], LENGTHS[b : b + 1])
        torch.testing.assert_close(out[b : b + 1, :length], alone, **TOL)
    with pytest.raises(ValueError):
        BiLSTMEncoder(6, 7)
    with pytest.raises(ValueError):
        enc(x, torch.tensor([5, 0, 4]))


def test_encoder_runs_over_time_not_batch():
    """The backward direction at word 0 depends on the last word; nothing depends on another example."""
    enc = _module(BiLSTMEncoder, 6, 8)
    x = _words()
    changed = x.clone()
    changed[0, 4] += 1.0  # last word of example 0
    a, b = enc(x, LENGTHS), enc(changed, LENGTHS)
    assert not torch.allclose(a[0, 0, 4:], b[0, 0, 4:])  # backward half of word 0 sees word 4
    torch.testing.assert_close(a[0, :4, :4], b[0, :4, :4], **TOL)  # forward half of words 0..3 does not
    torch.testing.assert_close(a[1:], b[1:], **TOL)


# --------------------------------------------------------------------------------------------------- arc scorer


def test_arc_scorer_matches_naive_eq23_and_zeros():
    scorer = _module(ArcScorer, 6, 7)
    h = _words()
    scores = scorer(h, LENGTHS)
    assert scores.shape == (3, N + 1, N + 1)
    naive = _naive_scores(scorer, h)
    for b, length in enumerate(LENGTHS.tolist()):
        size = length + 1
        expected = naive[b, :size, :size].clone()
        expected.fill_diagonal_(0.0)
        expected[:, 0] = 0.0
        torch.testing.assert_close(scores[b, :size, :size], expected, **TOL)
        assert torch.all(scores[b, size:] == 0) and torch.all(scores[b, :, size:] == 0)
        off = ~torch.eye(size, dtype=torch.bool)
        off[:, 0] = False
        assert torch.all(scores[b, :size, :size][off] != 0)
    # Without lengths every word is real.
    full = scorer(h[:1])
    torch.testing.assert_close(full[0], scores[0], **TOL)


def test_arc_scorer_padding_invariance():
    scorer = _module(ArcScorer, 6, 7)
    h = _words()
    scores = scorer(h, LENGTHS)
    for b, length in enumerate(LENGTHS.tolist()):
        alone = scorer(h[b : b + 1, :length], LENGTHS[b : b + 1])
        torch.testing.assert_close(scores[b : b + 1, : length + 1, : length + 1], alone, **TOL)


# ------------------------------------------------------------------------------------------------- head vectors


def test_head_vectors_one_hot_tree_and_uniform():
    h = _words(batch=1, n=4, d=3)
    root = torch.randn(3, dtype=torch.float64)
    heads = [0, 3, 1, 0]  # heads of words 1..4 (a tree: 0 → 1, 0 → 4, 1 → 3, 3 → 2)
    z = torch.zeros(1, 5, 5, dtype=torch.float64)
    for m, head in enumerate(heads, start=1):
        z[0, head, m] = 1.0
    out = head_vectors(z, h, root)
    assert out.shape == (1, 4, 3)
    table = torch.cat([root.view(1, 3), h[0]])
    for m, head in enumerate(heads, start=1):
        torch.testing.assert_close(out[0, m - 1], table[head], **TOL)

    uniform = (1.0 - torch.eye(5, dtype=torch.float64)) / 4  # every other position, weight 1/4
    uniform[:, 0] = 0.0
    out = head_vectors(uniform.unsqueeze(0), h, root)
    for m in range(1, 5):
        expected = (table.sum(0) - table[m]) / 4
        torch.testing.assert_close(out[0, m - 1], expected, **TOL)


def test_head_vectors_zero_at_padding_and_batched_root():
    tree = ProjectiveDepTree()
    scores = torch.randn(3, N + 1, N + 1, dtype=torch.float64)
    z = tree.map(scores, LENGTHS)
    h = _words()
    root = torch.randn(6, dtype=torch.float64)
    out = head_vectors(z, h, root)
    pad = torch.arange(N).view(1, -1) >= LENGTHS.view(-1, 1)
    assert torch.all(out[pad] == 0)
    torch.testing.assert_close(head_vectors(z, h, root.expand(3, 6)), out, **TOL)


# -------------------------------------------------------------------------------------------------------- masks


def test_masked_softmax_all_masked_row():
    scores = torch.tensor([[1.0, 2.0, float("nan")], [3.0, 4.0, 5.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [False, False, False]])
    p = masked_softmax(scores, mask, dim=-1)
    torch.testing.assert_close(p[0, :2], torch.softmax(torch.tensor([1.0, 2.0]), 0))
    assert p[0, 2] == 0
    assert torch.all(p[1] == 0)
    (p * torch.arange(3.0)).sum().backward()
    assert torch.isfinite(scores.grad).all() and torch.all(scores.grad[1] == 0) and scores.grad[0, 2] == 0


def test_masked_sum_and_lengths_ignore_padding():
    x = _words()  # garbage (1e3) at the padding
    sums = masked_sum(x, LENGTHS)
    torch.testing.assert_close(sums, torch.stack([x[b, :n].sum(0) for b, n in enumerate(LENGTHS.tolist())]), **TOL)
    assert check_lengths(None, 3, N, x.device).tolist() == [N] * 3
    assert check_lengths([5, 2, 4], 3, N, x.device).dtype == torch.long
    with pytest.raises(ValueError, match="lie in 1..5"):
        check_lengths(torch.tensor([5, 0, 4]), 3, N, x.device)
    with pytest.raises(ValueError, match="shape"):
        check_lengths(torch.tensor([5, 2]), 3, N, x.device)


# ----------------------------------------------------------------------------------------------------- decoders


def test_sst_decoder_shapes_and_padding_invariance():
    dec = _module(SSTDecoder, 6, 5, num_classes=2)
    h, heads = _words(seed=1), _words(seed=2)
    logits = dec(h, heads, LENGTHS)
    assert logits.shape == (3, 2) and torch.isfinite(logits).all()
    for b, length in enumerate(LENGTHS.tolist()):
        alone = dec(h[b : b + 1, :length], heads[b : b + 1, :length], LENGTHS[b : b + 1])
        torch.testing.assert_close(logits[b : b + 1], alone, **TOL)


def test_sst_decoder_attention_is_a_softmax_not_a_sum():
    dec = _module(SSTDecoder, 6, 5)
    h, heads = _words(seed=1), _words(seed=2)
    pooled, weights = dec.pool(h, heads, LENGTHS)
    pad = torch.arange(N).view(1, -1) >= LENGTHS.view(-1, 1)
    assert torch.all(weights[pad] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, dtype=torch.float64), **TOL)
    assert not torch.allclose(weights[0], torch.full((N,), 1.0 / N, dtype=torch.float64))

    # Feed chosen attention scores: the weights are their masked softmax, so raising word 0's score raises its
    # weight and lowers every other word's (a plain sum would keep every weight at 1), and the pool follows them.
    class Fixed(torch.nn.Module):
        def __init__(self, scores):
            super().__init__()
            self.scores = scores

        def forward(self, u):
            return self.scores.unsqueeze(-1)

    u = torch.relu(dec.hidden(torch.cat([h, heads], -1)))
    scores = torch.zeros(3, N, dtype=torch.float64)
    dec.attention = Fixed(scores)
    _, flat = dec.pool(h, heads, LENGTHS)
    torch.testing.assert_close(flat[0], torch.full((N,), 1.0 / N, dtype=torch.float64), **TOL)
    torch.testing.assert_close(flat[1, :2], torch.full((2,), 0.5, dtype=torch.float64), **TOL)
    raised = scores.clone()
    raised[:, 0] = 2.0
    dec.attention = Fixed(raised)
    pooled, peaked = dec.pool(h, heads, LENGTHS)
    assert torch.all(peaked[:, 0] > flat[:, 0])
    assert torch.all(peaked[0, 1:] < flat[0, 1:])
    torch.testing.assert_close(peaked[0], torch.softmax(raised[0], 0), **TOL)
    torch.testing.assert_close(pooled, (peaked.unsqueeze(-1) * u).sum(1), **TOL)


def test_baseline_sst_shapes_and_padding_invariance():
    dec = _module(BaselineSST, 6, 5, num_classes=2)
    h = _words()
    logits = dec(h, LENGTHS)
    assert logits.shape == (3, 2)
    for b, length in enumerate(LENGTHS.tolist()):
        torch.testing.assert_close(logits[b : b + 1], dec(h[b : b + 1, :length], LENGTHS[b : b + 1]), **TOL)


@pytest.mark.parametrize("aggregate_layers", [1, 2])
def test_decomposable_attention_shapes_and_padding_invariance(aggregate_layers):
    da = _module(DecomposableAttention, 6, hidden=8, num_classes=3, aggregate_layers=aggregate_layers)
    a = _words(seed=3)
    len_b = torch.tensor([3, 4, 1])
    b = _words(n=4, seed=4)
    b = b.masked_fill((torch.arange(4).view(1, -1) >= len_b.view(-1, 1)).unsqueeze(-1), -1e3)
    logits = da(a, b, LENGTHS, len_b)
    assert logits.shape == (3, 3) and torch.isfinite(logits).all()
    for i in range(3):
        la, lb = int(LENGTHS[i]), int(len_b[i])
        alone = da(a[i : i + 1, :la], b[i : i + 1, :lb], LENGTHS[i : i + 1], len_b[i : i + 1])
        torch.testing.assert_close(logits[i : i + 1], alone, **TOL)
    # The defaults of Table 4 (hidden 200, dropout 0.2) and dropout being active in training mode.
    default = DecomposableAttention(6)
    assert default.out.in_features == 200 and default.out.out_features == 3
    assert any(isinstance(m, torch.nn.Dropout) and m.p == 0.2 for m in default.modules())


def test_decomposable_attention_gradients_reach_both_sentences():
    da = _module(DecomposableAttention, 6, hidden=8)
    da.train()
    a = _words(seed=3).requires_grad_(True)
    b = _words(n=4, seed=4).requires_grad_(True)
    da(a, b, LENGTHS, torch.tensor([3, 4, 1])).sum().backward()
    assert a.grad[0, :5].abs().sum() > 0 and b.grad[1].abs().sum() > 0
    assert torch.all(a.grad[1, 2:] == 0) and torch.all(b.grad[2, 1:] == 0)  # padding gets nothing


# -------------------------------------------------------------------------------------------------- end to end


def test_end_to_end_map_and_marginals():
    torch.manual_seed(0)
    emb = Embedder(20, 6, padding_idx=0)
    enc = BiLSTMEncoder(6, 8)
    scorer = ArcScorer(8, 7)
    dec = SSTDecoder(8, 5)
    tree = ProjectiveDepTree(multiroot=True)
    ids = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 0, 0, 0], [10, 11, 12, 13, 0]])

    h = enc(emb(ids), LENGTHS)
    scores = scorer(h, LENGTHS)
    z = tree.map(scores, LENGTHS)
    torch.testing.assert_close(z[:, :, 1:].sum(1), (torch.arange(1, N + 1) <= LENGTHS.view(-1, 1)).float())
    logits = dec(h, head_vectors(z, h, scorer.root), LENGTHS)
    assert logits.shape == (3, 2) and torch.isfinite(logits).all()

    # Relaxed path; the decoder reads detached vectors, so the encoder's gradient can only come through μ.
    mu = tree.marginals(scorer(h, LENGTHS), LENGTHS)
    hd = h.detach()
    logits = dec(hd, head_vectors(mu, hd, scorer.root.detach()), LENGTHS)
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 1])).backward()
    for module in (scorer, enc, emb):
        grads = [p.grad for p in module.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert sum(float(g.abs().sum()) for g in grads) > 0
