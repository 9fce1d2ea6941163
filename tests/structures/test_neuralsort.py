"""NeuralSort (Grover et al. 2019) against its definition, its τ → 0 limit and the Plackett-Luce sampling it relaxes."""

import itertools

import pytest
import torch

from latentstruct.structures.neuralsort import neuralsort, relaxed_topk


def _by_definition(s: torch.Tensor, tau: float) -> torch.Tensor:
    """P̂[i, j] for one score vector, written entry by entry from the paper's formula (1-based i)."""
    n = len(s)
    out = torch.empty(n, n, dtype=s.dtype)
    for i in range(1, n + 1):
        logits = torch.stack([((n + 1 - 2 * i) * s[j] - sum(abs(s[j] - s[m]) for m in range(n))) / tau
                              for j in range(n)])
        out[i - 1] = torch.softmax(logits, 0)
    return out


def test_matches_the_definition_batched():
    torch.manual_seed(0)
    s = torch.randn(3, 2, 6, dtype=torch.float64)
    p = neuralsort(s, tau=0.7)
    assert p.shape == (3, 2, 6, 6)
    for idx in itertools.product(range(3), range(2)):
        torch.testing.assert_close(p[idx], _by_definition(s[idx], 0.7))
    torch.testing.assert_close(neuralsort(s, 0.7, rows=2), p[..., :2, :])


def test_rows_are_distributions_and_the_limit_is_the_descending_sort():
    torch.manual_seed(1)
    s = torch.randn(4, 7, dtype=torch.float64)
    p = neuralsort(s, tau=1.0)
    torch.testing.assert_close(p.sum(-1), torch.ones(4, 7, dtype=torch.float64))
    hard = neuralsort(s, tau=1e-4)
    expected = torch.nn.functional.one_hot(s.argsort(-1, descending=True), 7).to(s.dtype)
    torch.testing.assert_close(hard, expected, atol=1e-6, rtol=0)
    topk = relaxed_topk(s, 3, tau=1e-4)
    torch.testing.assert_close(topk, expected[:, :3].sum(-2), atol=1e-6, rtol=0)


def test_gradcheck():
    torch.manual_seed(2)
    s = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: relaxed_topk(x, 2, tau=0.5), (s,))


def test_stochastic_topk_is_a_relaxed_plackett_luce_sample():
    """At a small τ, the stochastic relaxed top-1 is the first item of a Plackett-Luce sample: its frequency is
    softmax(s) (the Gumbel-max trick)."""
    torch.manual_seed(3)
    s = torch.tensor([1.0, 0.0, -1.0, 0.5], dtype=torch.float64)
    draws = relaxed_topk(s.expand(20000, 4), 1, tau=1e-3, stochastic=True)
    torch.testing.assert_close(draws.mean(0), torch.softmax(s, 0), atol=0.015, rtol=0)


@pytest.mark.parametrize("kwargs", [{"tau": 0.0}, {"tau": 1.0, "rows": 0}, {"tau": 1.0, "rows": 6}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        neuralsort(torch.zeros(2, 5), **kwargs)


def test_absolute_deviation_sums_match_the_pairwise_matrix():
    from latentstruct.structures.neuralsort import _abs_deviation_sums

    torch.manual_seed(4)
    s = torch.randn(3, 4, 9, dtype=torch.float64, requires_grad=True)
    direct = (s.unsqueeze(-1) - s.unsqueeze(-2)).abs().sum(-1)
    fast = _abs_deviation_sums(s)
    torch.testing.assert_close(fast, direct)
    w = torch.randn_like(direct)
    grads = [torch.autograd.grad((v * w).sum(), s)[0] for v in (fast, direct)]
    torch.testing.assert_close(*grads)


@pytest.mark.cuda
def test_cuda_matches_cpu():
    s = torch.randn(3, 6, generator=torch.Generator().manual_seed(2), requires_grad=True)
    g = torch.randn(3, 6, 6, generator=torch.Generator().manual_seed(3))
    grads = []
    for device in ("cpu", "cuda"):
        x = s.detach().to(device).requires_grad_(True)
        p = neuralsort(x, tau=0.5)
        (p * g.to(device)).sum().backward()
        grads.append((p.detach().cpu(), x.grad.cpu(), relaxed_topk(x.detach(), 2, tau=0.5).cpu()))
    for cpu, cuda in zip(*grads, strict=True):
        torch.testing.assert_close(cuda, cpu, atol=1e-5, rtol=1e-5)
