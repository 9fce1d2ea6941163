"""The exact (enumerated) gradient of the expected loss against brute force: the expectation written out vertex by
vertex with the structure's own log-probabilities, differentiated by autograd, and the closed form
Σ_v p_v (L_v − E)(v − μ) (latentstruct/estimators/exact.py)."""

import pytest
import torch

from latentstruct.estimators import Exact, expected_loss
from latentstruct.structures import BinaryVector, Categorical

CASES = {"categorical": (Categorical(), (5, 6), 6), "binary_vector": (BinaryVector(), (4, 3, 2), 3)}


def _loss(c):
    """A nonlinear loss of the vertex, per example: L_b(z) = (<c_b, z> − 1)² + sin <c_b, z>."""
    def loss(z):
        dot = (z * c).flatten(1).sum(-1)
        return (dot - 1) ** 2 + torch.sin(dot)
    return loss


def _brute(structure, s, n, loss):
    """mean_b Σ_v p(v | s_b) L_b(v), one vertex at a time, p from the structure's log_prob (its log-partition)."""
    total = 0.0
    for v in structure.enumerate(n).to(s):
        z = v.expand_as(s)
        total = total + structure.log_prob(z, s).exp() * loss(z)
    return total.mean()


@pytest.mark.parametrize("name", CASES)
def test_expected_loss_equals_brute_force_and_closed_form(name):
    structure, shape, n = CASES[name]
    g = torch.Generator().manual_seed(0)
    s = torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
    loss = _loss(torch.randn(*shape, generator=g, dtype=torch.float64))
    vertices = structure.enumerate(n).double()
    losses = torch.stack([loss(v.expand_as(s)) for v in vertices], -1).requires_grad_(True)  # [B, V]
    ours = expected_loss(s, vertices, losses).mean()
    brute = _brute(structure, s, n, loss)
    torch.testing.assert_close(ours, brute)
    (g_ours, g_losses) = torch.autograd.grad(ours, (s, losses))
    (g_brute,) = torch.autograd.grad(brute, s)
    torch.testing.assert_close(g_ours, g_brute)
    # closed form: (1/B) Σ_v p_v (L_v − E)(v − μ); and ∂/∂L_v = p_v / B
    p = torch.stack([structure.log_prob(v.expand_as(s), s).exp() for v in vertices], -1).detach()
    mu = structure.marginals(s.detach())
    e = (p * losses.detach()).sum(-1, keepdim=True)
    weights = p * (losses.detach() - e)  # [B, V]
    closed = (weights.view(*weights.shape, *[1] * (s.dim() - 1)) * (vertices.unsqueeze(0) - mu.unsqueeze(1))).sum(1)
    torch.testing.assert_close(g_ours, closed / s.shape[0])
    torch.testing.assert_close(g_losses, p / s.shape[0])
    fixed = losses.detach()
    assert torch.autograd.gradcheck(lambda x: expected_loss(x, vertices, fixed), (s.detach().requires_grad_(),))


@pytest.mark.parametrize("name", CASES)
def test_estimator_gives_the_scores_the_exact_gradient(name):
    """Through the §5 interface: downstream called on every vertex, the scores get ∇ mean_b E_b exactly, and the
    forward value is a vertex."""
    structure, shape, n = CASES[name]
    g = torch.Generator().manual_seed(1)
    s = torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
    loss = _loss(torch.randn(*shape, generator=g, dtype=torch.float64))
    z = Exact().train()(s, structure, None, loss)
    vertices = structure.enumerate(n).double().flatten(1)
    assert (z.detach().flatten(1)[:, None, :] == vertices).all(-1).any(-1).all()
    z.sum().backward()  # the incoming gradient is ignored: the estimator returns the expected loss's own
    leaf = s.detach().requires_grad_(True)
    (expected,) = torch.autograd.grad(_brute(structure, leaf, n, loss), leaf)
    torch.testing.assert_close(s.grad, expected)


def test_estimator_refuses_too_many_vertices_and_lengths():
    s = torch.randn(2, 13, 2, requires_grad=True)
    with pytest.raises(ValueError, match="max_vertices"):
        Exact(max_vertices=4096).train()(s, BinaryVector(), None, lambda z: z.flatten(1).sum(-1))
    with pytest.raises(ValueError, match="lengths"):
        Exact().train()(s, BinaryVector(), torch.tensor([13, 12]), lambda z: z.flatten(1).sum(-1))
