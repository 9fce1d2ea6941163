"""latentstruct.structures.BinaryVector: what the contract (test_contract.py) cannot know — ``enumerate`` against an
independent brute force, the part layout, and the bit-level closed forms (sigmoids, clips, coin flips)."""

import itertools

import pytest
import torch

from latentstruct.structures import BinaryVector
from latentstruct.structures.binary_vector import bits

BV = BinaryVector()


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_enumerate_lists_every_bit_vector_once(n):
    vertices = BV.enumerate(n)
    assert vertices.shape == (2**n, n, 2)
    assert (vertices.sum(-1) == 1).all(), "each variable takes exactly one state"
    listed = {tuple(int(b) for b in row) for row in bits(vertices)}
    assert listed == set(itertools.product((0, 1), repeat=n))


def test_bit_closed_forms():
    """With d_i = φ_i(1) − φ_i(0): MAP = [d > 0], P(z_i = 1) = sigmoid(d), log Z = Σ_i φ_i(0) + softplus(d),
    SparseMAP's bit = clip((d + 1) / 2, 0, 1) (sparsemax of two scores)."""
    g = torch.Generator().manual_seed(0)
    s = 3 * torch.randn(6, 4, 2, generator=g, dtype=torch.float64)
    d = s[..., 1] - s[..., 0]
    assert torch.equal(bits(BV.map(s)), (d > 0).double())
    torch.testing.assert_close(bits(BV.marginals(s)), torch.sigmoid(d))
    torch.testing.assert_close(BV.log_partition(s), (s[..., 0] + torch.nn.functional.softplus(d)).sum(-1))
    torch.testing.assert_close(bits(BV.sparsemap(s)), ((d + 1) / 2).clamp(0, 1))


def test_exact_sample_bits_are_coin_flips_with_sigmoid_odds():
    s = torch.tensor([[[0.0, 1.5], [0.3, -0.7], [0.0, 0.0]]], dtype=torch.float64)
    draws = BV.exact_sample(s, generator=torch.Generator().manual_seed(1), num_samples=40_000)
    freq = bits(draws).mean((0, 1))
    torch.testing.assert_close(freq, torch.sigmoid(s[0, :, 1] - s[0, :, 0]), atol=0.01, rtol=0)
