"""Every estimator runs unchanged on every structure (DESIGN.md §2): a smoke test with exact checks where cheap."""

from __future__ import annotations

import copy

import pytest
import torch

from latentstruct.capabilities import missing
from latentstruct.estimators import (
    Blackbox,
    Direct,
    GumbelSoftmax,
    Imle,
    Marginals,
    Perturbed,
    Sfe,
    Sparsemap,
    Spigot,
    SpigotCe,
    SpigotEg,
    SteI,
    SteS,
    StGumbel,
)
from latentstruct.structures import NonProjectiveDepTree, ProjectiveDepTree, TopK
from tests.structures.reference import STRUCTURES

SHAPES = {  # scores [B, *parts] for every structure of tests/structures/reference.py
    "categorical": (4, 6),
    "projective_multiroot": (3, 5, 5),
    "projective_single_root": (3, 5, 5),
    "nonprojective_multiroot": (3, 5, 5),
    "nonprojective_single_root": (3, 5, 5),
    "sequence": (3, 4, 3, 3),
    "binary_tree": (3, 5, 5),
    "matching": (3, 4, 4),
    "topk": (3, 5),
    "binary_vector": (3, 4, 2),
}
ESTIMATORS = [
    SteI(0.5, steps=2),
    SteS(),
    Spigot(0.5, steps=2),
    SpigotCe(0.5, steps=2),
    SpigotEg(0.5, steps=2),
    Marginals(),
    Sparsemap(),
    GumbelSoftmax(),
    StGumbel(),
    Sfe(),
    Sfe(baseline="moving_average"),
    Direct(),
    Direct(epsilon=0.5, sigma=0.0),
    Sfe(baseline="rloo", samples=3),
    Blackbox(),
    Imle(),
    Imle(noise="gumbel", samples=2),
    Perturbed(samples=3),
]


def _unsupported(structure, est):
    """What the estimator calls that the structure lacks, by their declarations (``calls``, ``has``;
    latentstruct.capabilities): the estimator must then raise NotImplementedError, else run."""
    return missing(type(est), type(structure)) or None


def _id(est):
    return "-".join(str(x) for x in (type(est).__name__, getattr(est, "baseline", ""), getattr(est, "noise", ""),
                                     getattr(est, "samples", "")))


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("est", ESTIMATORS, ids=_id)
def test_estimator_runs_on_structure(name, est):
    structure, shape = STRUCTURES[name], SHAPES[name]
    torch.manual_seed(0)
    s = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    c = torch.randn(*shape, dtype=torch.float64)

    def downstream(mu):
        return (mu * c).flatten(1).sum(-1) ** 2

    est.train()
    error = _unsupported(structure, est)
    if error is not None:
        with pytest.raises(NotImplementedError):
            z = est(s, structure, None, downstream)
            torch.autograd.grad(downstream(z).mean(), s)
        return
    z = est(s, structure, None, downstream)
    assert z.shape == s.shape
    (grad,) = torch.autograd.grad(downstream(z).mean(), s)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    est.eval()
    out = est(s, structure, None, downstream)
    if not est.relaxed:
        assert torch.equal(out, structure.map(s))


@pytest.mark.cuda
@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("est", ESTIMATORS, ids=_id)
def test_estimator_runs_on_cuda_as_on_the_cpu(name, est):
    """On CUDA every estimator keeps its tensors (and its buffers, moved as a model's are) on the device; one that
    draws nothing gives the CPU's latent and gradient."""
    structure, shape = STRUCTURES[name], SHAPES[name]
    if _unsupported(structure, est) is not None:
        return
    s = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    c = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def run(device: str, seed: int):
        module, w = copy.deepcopy(est).to(device).train(), c.to(device)
        x = s.to(device).requires_grad_(True)
        torch.manual_seed(seed)  # the CPU's and every CUDA generator

        def downstream(mu):
            return (mu * w).flatten(1).sum(-1) ** 2

        z = module(x, structure, None, downstream)
        (grad,) = torch.autograd.grad(downstream(z).mean(), x)
        return z.detach(), grad

    z, grad = run("cuda", 0)
    assert z.is_cuda and grad.is_cuda and torch.isfinite(grad).all()
    other = run("cuda", 1)
    if torch.equal(z, other[0]) and torch.equal(grad, other[1]):  # no draws: the CPU's numbers
        cpu = run("cpu", 0)
        torch.testing.assert_close(z.cpu(), cpu[0])
        torch.testing.assert_close(grad.cpu(), cpu[1])


def test_spigot_k1_on_trees_is_map_minus_sparsemap():
    structure = ProjectiveDepTree()
    torch.manual_seed(1)
    s = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)
    c = torch.randn(2, 4, 4, dtype=torch.float64)
    z = Spigot(1.0)(s, structure, None, lambda mu: (mu * c).flatten(1).sum(-1))
    (grad,) = torch.autograd.grad((z * c).flatten(1).sum(-1).mean(), s)
    z_hat = structure.map(s)
    expected = z_hat - structure.sparsemap(z_hat - c / 2)
    torch.testing.assert_close(grad, expected)


def test_sfe_on_trees_uses_exact_samples():
    """The dependency trees have exact samplers, so SFE's gradient is an unbiased estimate (not a refusal)."""
    for structure in (ProjectiveDepTree(), NonProjectiveDepTree(multiroot=False)):
        s = torch.randn(2, 4, 4, requires_grad=True)
        z = Sfe()(s, structure, None, lambda mu: mu.flatten(1).sum(-1))
        assert z.shape == s.shape and set(z.unique().tolist()) <= {0.0, 1.0}


@pytest.mark.parametrize("name", [n for n in SHAPES if n != "categorical"])
@pytest.mark.parametrize("est", [Imle(samples=3), Perturbed(samples=3), Sfe(baseline="rloo", samples=3)], ids=_id)
def test_several_draws_keep_each_examples_length(name, est):
    """The draws are the batch repeated along its first dimension, lengths included: every draw of example b is a
    vertex of b's length, so the mean of the draws has as many parts as MAP(s_b) (all vertices of a length do)."""
    structure, shape = STRUCTURES[name], SHAPES[name]
    longest = shape[1] - 1 if "projective" in name else shape[1]
    lengths = torch.tensor([longest, longest - 1, longest - 2])
    torch.manual_seed(2)
    s = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    if _unsupported(structure, est) is not None:
        return
    z = est.train()(s, structure, lengths, lambda mu: mu.flatten(1).sum(-1) ** 2)
    parts = structure.map(s.detach(), lengths).flatten(1).sum(-1)
    torch.testing.assert_close(z.flatten(1).sum(-1), parts)
    if isinstance(structure, TopK):  # k parts at every length: check the padding instead
        assert (z[torch.arange(shape[1]) >= lengths.view(-1, 1)] == 0).all()
    else:
        assert len(set(parts.tolist())) > 1  # the lengths do differ
