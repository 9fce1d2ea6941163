"""Discrete GM-VAE of seed 003: the direct gradient through argmax, the model's shapes and bound, and the binarised
semi-supervised MNIST splits (tiny generated IDX files, plus the real MNIST if present)."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from latentstruct.data.semisupervised import balanced_subset, binarize, semisupervised_mnist
from latentstruct.estimators import Direct, GumbelSoftmax, StGumbel
from latentstruct.models.vae import GMVAE, Decoder, DiscreteHead, Encoder, gaussian_kl, negative_elbo
from latentstruct.structures import Categorical, gumbel_like
from latentstruct.tasks.vae import SemiSupervisedVAE
from tests.data.test_images import write_mnist

PHI0 = torch.tensor([0.3, -0.5, 1.0, 0.0], dtype=torch.float64)
THETA = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
N_DRAWS = 1_000_000
CAT = Categorical()


def exact_gradient() -> torch.Tensor:
    """∇_φ E_γ[θ(z^{φ+γ})] = ∇_φ Σ_k softmax(φ)_k θ_k by autograd on the Gumbel-max closed form."""
    phi = PHI0.clone().requires_grad_(True)
    (torch.softmax(phi, 0) @ THETA).backward()
    return phi.grad.clone()


def _loss(z: torch.Tensor, theta: torch.Tensor = THETA) -> torch.Tensor:
    """The VAE's ``downstream``: −<z, θ>, each component's loss extended linearly."""
    return -(z * theta).sum(-1)


def direct_estimate(epsilon: float, seed: int = 0, n: int = N_DRAWS) -> torch.Tensor:
    """The VAE's direct estimate of ∇_φ E[θ] (ε > 0: towards best, the estimator's ε = −ε): minus the gradient of the
    mean loss −<z, θ> through ``Direct`` (σ = 1, no ε growth), averaged over ``n`` Gumbel draws (the batch rows all
    share the leaf φ, so its gradient is the batch mean)."""
    torch.manual_seed(seed)
    phi = PHI0.clone().requires_grad_(True)
    z = Direct(epsilon=-epsilon, max_retries=0).train()(phi.expand(n, -1), CAT, None, _loss)
    _loss(z).mean().backward()
    return -phi.grad


# --- the key test: direct gradient → exact gradient as ε → 0 ----------------------------------------------------------


def test_direct_gradient_converges_to_exact_gradient():
    exact = exact_gradient()
    errors = {eps: (direct_estimate(eps) - exact).norm().item() for eps in (1.0, 0.1, 0.01)}
    # bias O(ε) dominates at 1 and 0.1; at 0.01 Monte-Carlo noise (~0.01 for 1e6 draws) takes over
    assert errors[1.0] > errors[0.1] > errors[0.01], errors
    assert errors[1.0] > 0.2 * exact.norm()
    assert errors[0.01] < 0.08 * exact.norm(), errors
    est = direct_estimate(0.01)
    # a wrong sign or scale is far off
    assert (-est - exact).norm() > 1.5 * exact.norm()
    assert (2 * est - exact).norm() > 0.5 * exact.norm()
    assert (0.5 * est - exact).norm() > 0.3 * exact.norm()


@pytest.mark.parametrize("epsilon", [1.0, 0.1, -0.1])
def test_direct_estimate_matches_finite_difference_of_softmax(epsilon):
    """With Gumbel-max, E_γ[z_ε − ẑ]/ε = (softmax(φ + εθ) − softmax(φ))/ε exactly, for either sign of ε."""
    expected = (torch.softmax(PHI0 + epsilon * THETA, 0) - torch.softmax(PHI0, 0)) / epsilon
    est = direct_estimate(epsilon, seed=1)
    assert torch.allclose(est, expected, atol=0.012), (est, expected)


def test_minimising_the_loss_through_direct_ascends_expected_theta():
    phi = PHI0.clone().requires_grad_(True)
    opt = torch.optim.SGD([phi], lr=0.5)
    estimator = Direct(epsilon=-0.1, max_retries=0).train()
    torch.manual_seed(3)
    start = (torch.softmax(PHI0, 0) @ THETA).item()
    for _ in range(50):
        opt.zero_grad()
        _loss(estimator(phi.expand(2000, -1), CAT, None, _loss)).mean().backward()
        opt.step()
    end = (torch.softmax(phi.detach(), 0) @ THETA).item()
    assert end > start + 0.5 and end > 2.5  # max θ is 3


def test_direct_with_a_target_steps_towards_it():
    """The labelled step: ẑ_ε = the label's one-hot, gradient (target − ẑ)/(Bε) for the mean loss, with the same
    Gumbel draw as without a target; ``downstream`` is not needed; ε must be negative (towards best)."""
    gen = torch.Generator().manual_seed(0)
    phi = torch.randn(6, 5, generator=gen, requires_grad=True)
    theta = torch.randn(6, 5, generator=gen)
    target = torch.nn.functional.one_hot(torch.tensor([2, 1, 0, 4, 3, 1]), 5).float()
    estimator = Direct(epsilon=-0.5, max_retries=0).train()
    torch.manual_seed(1)
    noise = gumbel_like(phi)
    torch.manual_seed(1)
    z = estimator(phi, CAT, None, None, target=target)
    assert torch.equal(z, CAT.map(phi + noise)) and z.shape == (6, 5)
    _loss(z, theta).mean().backward()
    torch.testing.assert_close(phi.grad, (target - z.detach()) / (6 * -0.5))
    assert bool((phi.grad * target).sum(-1).le(0).all())  # descent raises the label's logit (or leaves it)
    torch.manual_seed(1)
    without = Direct(epsilon=-0.5, max_retries=0).train()(phi, CAT, None, lambda m: _loss(m, theta))
    assert torch.equal(without, z)  # the target changes the update, not the sample
    with pytest.raises(ValueError, match="negative"):
        Direct(epsilon=0.5).train()(phi, CAT, None, None, target=target)
    with pytest.raises(ValueError, match="shaped like the scores"):
        estimator(phi, CAT, None, None, target=target[:3])


def test_straight_through_gumbel_is_the_hard_gumbel_softmax():
    """``estimator=st_gumbel`` (the old ``gsm_hard``): the forward one-hot argmax of softmax((φ + γ)/τ), the gradient
    that of the relaxed sample, i.e. hard + soft − soft.detach() at the same noise."""
    gen = torch.Generator().manual_seed(0)
    phi = torch.randn(4, 10, generator=gen, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(4, 10, generator=gen, dtype=torch.float64)
    torch.manual_seed(1)
    soft = torch.softmax((phi + gumbel_like(phi)) / 0.5, -1)
    hard = torch.nn.functional.one_hot(soft.argmax(-1), 10).to(soft.dtype)
    (expected,) = torch.autograd.grad(((hard + soft - soft.detach()) * weights).sum(), phi)
    torch.manual_seed(1)
    z = StGumbel(0.5).train()(phi, CAT)
    assert torch.equal(z, hard)
    (grad,) = torch.autograd.grad((z * weights).sum(), phi)
    torch.testing.assert_close(grad, expected)
    # the argmax of φ + γ is a sample of softmax(φ): low temperature ≈ Gumbel-max frequencies
    torch.manual_seed(2)
    relaxed = GumbelSoftmax(0.01).train()(PHI0.float().expand(200_000, -1), CAT)
    assert torch.allclose(relaxed.argmax(-1).bincount() / 2e5, torch.softmax(PHI0.float(), 0), atol=0.01)


# --- the model -----------------------------------------------------------------------------------------------------


def test_gmvae_architecture_sizes():
    model = GMVAE()
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes["encoder.0.weight"] == (400, 784) and shapes["encoder.2.weight"] == (200, 400)
    assert shapes["discrete_head.0.weight"] == (100, 200) and shapes["discrete_head.2.weight"] == (10, 100)
    assert shapes["mu_head.weight"] == (300, 200) and shapes["logvar_head.weight"] == (300, 200)
    assert shapes["decoder.0.weight"] == (400, 300) and shapes["decoder.2.weight"] == (784, 400)
    linear = [(784, 400), (400, 200), (200, 100), (100, 10), (200, 300), (200, 300), (300, 400), (400, 784)]
    assert sum(p.numel() for p in model.parameters()) == sum(i * o + o for i, o in linear)
    slopes = {m.negative_slope for m in model.modules() if isinstance(m, torch.nn.LeakyReLU)}
    assert slopes == {0.2}


def small_model_and_batch():
    torch.manual_seed(0)
    model = GMVAE(functools.partial(Encoder, hidden=(8, 6)), functools.partial(DiscreteHead, hidden=5),
                  functools.partial(Decoder, hidden=7), input_dim=12, num_components=3, gaussian_dim=2).double()
    x = (torch.rand(4, 12, dtype=torch.float64) > 0.5).double()
    return model, x


def test_gmvae_shapes():
    model = GMVAE()
    x = (torch.rand(5, 784) > 0.5).float()
    phi, mu, logvar = model.encode(x)
    assert phi.shape == (5, 10) and mu.shape == (5, 10, 30) and logvar.shape == (5, 10, 30)
    assert model.decode(torch.randn(5, 300)).shape == (5, 784)
    out = model.per_category(x, generator=torch.Generator().manual_seed(0))
    assert out.theta.shape == out.log_lik.shape == out.kl_gauss.shape == (5, 10) and out.h.shape == (5, 10, 30)
    assert bool((out.log_lik <= 0).all()) and bool((out.kl_gauss >= 0).all())
    assert model.predict(x).shape == (5,) and model.bound(x).shape == (5,)


def test_per_category_matches_one_decoder_call_per_component():
    model, x = small_model_and_batch()
    out = model.per_category(x, generator=torch.Generator().manual_seed(0))
    # the Gaussian samples share one noise draw per example
    e = (out.h - out.mu) / torch.exp(0.5 * out.logvar)
    assert torch.allclose(e, e[:, :1].expand_as(e))
    for k in range(3):
        z = torch.nn.functional.one_hot(torch.full((4,), k), 3).double()
        inp = model.embed(z, out.h)
        blocks = inp.view(4, 3, 2)
        assert torch.equal(blocks[:, k], out.h[:, k])
        assert bool((blocks[:, [j for j in range(3) if j != k]] == 0).all())
        logits = model.decode(inp)
        log_lik = (x * torch.log(torch.sigmoid(logits)) + (1 - x) * torch.log(1 - torch.sigmoid(logits))).sum(-1)
        kl = 0.5 * (out.mu[:, k] ** 2 + out.logvar[:, k].exp() - 1 - out.logvar[:, k]).sum(-1)
        assert torch.allclose(out.log_lik[:, k], log_lik) and torch.allclose(out.kl_gauss[:, k], kl)
        assert torch.allclose(out.theta[:, k], log_lik - kl)


def test_negative_elbo_brute_force():
    model, x = small_model_and_batch()
    out = model.per_category(x, generator=torch.Generator().manual_seed(0))
    per_example = []
    for b in range(4):
        q = [math.exp(v) for v in out.phi[b].tolist()]
        q = [v / sum(q) for v in q]
        elbo = sum(q[k] * (out.theta[b, k].item() - math.log(q[k] / (1 / 3))) for k in range(3))
        per_example.append(-elbo)
    expected = torch.tensor(per_example, dtype=torch.float64)
    assert torch.allclose(negative_elbo(out.phi, out.theta, reduction="none"), expected)
    assert torch.allclose(negative_elbo(out.phi, out.theta), expected.mean())
    assert torch.allclose(negative_elbo(out.phi, out.theta, reduction="sum"), expected.sum())
    assert torch.allclose(model.bound(x, generator=torch.Generator().manual_seed(0)), expected)
    assert torch.allclose(gaussian_kl(torch.zeros(2, 3), torch.zeros(2, 3)), torch.zeros(2))


# --- data ----------------------------------------------------------------------------------------------------------


def test_binarize():
    pixels = np.array([[0, 1, 127, 128, 200, 255]], dtype=np.uint8)
    out = binarize(pixels)
    assert out.dtype == torch.float32 and torch.equal(out, torch.tensor([[0, 0, 0, 1, 1, 1]], dtype=torch.float32))
    assert torch.equal(binarize(torch.from_numpy(pixels)), out)
    with pytest.raises(ValueError):
        binarize(np.zeros(3, dtype=np.float32))


def test_balanced_subset():
    labels = np.random.RandomState(0).randint(0, 10, size=2000)
    for n in (50, 100, 300):
        idx = balanced_subset(labels, n, 10, seed=4)
        assert idx.dtype == torch.int64 and len(idx) == n and len(set(idx.tolist())) == n
        assert np.bincount(labels[idx.numpy()], minlength=10).tolist() == [n // 10] * 10
        assert torch.equal(idx, balanced_subset(torch.from_numpy(labels), n, 10, seed=4))
    assert not torch.equal(balanced_subset(labels, 50, 10, seed=4), balanced_subset(labels, 50, 10, seed=5))
    assert set(balanced_subset(labels, 50, 10, 4).tolist()) <= set(balanced_subset(labels, 100, 10, 4).tolist())
    assert len(balanced_subset(labels, 0, 10, 0)) == 0
    with pytest.raises(ValueError):
        balanced_subset(labels, 55, 10, 0)
    with pytest.raises(ValueError):
        balanced_subset(np.array([0, 0, 1]), 4, 2, 0)


def test_semisupervised_mnist_tiny(tmp_path):
    arrays = write_mnist(tmp_path / "mnist", n_train=300, n_test=40)
    data = semisupervised_mnist("mnist", tmp_path, n_labelled=20, seed=1, n_valid=100)
    train, valid, test = data["train"], data["valid"], data["test"]
    assert train["x"].shape == (200, 784) and valid["x"].shape == (100, 784) and test["x"].shape == (40, 784)
    images = arrays["train-images-idx3-ubyte"].reshape(300, -1)
    assert torch.equal(train["x"], torch.from_numpy((images[:200] >= 128).astype(np.float32)))
    assert torch.equal(valid["x"], torch.from_numpy((images[200:] >= 128).astype(np.float32)))
    labels = arrays["train-labels-idx1-ubyte"].astype(np.int64)
    assert torch.equal(train["y"], torch.from_numpy(labels[:200])) and train["y"].dtype == torch.int64
    assert torch.equal(valid["y"], torch.from_numpy(labels[200:]))
    assert torch.equal(test["y"], torch.from_numpy(arrays["t10k-labels-idx1-ubyte"].astype(np.int64)))
    assert train["labelled"].dtype == torch.bool and int(train["labelled"].sum()) == 20
    assert train["y"][train["labelled"]].bincount(minlength=10).tolist() == [2] * 10
    again = semisupervised_mnist("mnist", tmp_path, n_labelled=20, seed=1, n_valid=100)
    assert torch.equal(again["train"]["labelled"], train["labelled"])
    with pytest.raises(ValueError):
        semisupervised_mnist("cifar10", tmp_path, 20)


@pytest.mark.real_data("mnist")
def test_semisupervised_mnist_real_sizes(data_root):
    data = semisupervised_mnist("mnist", data_root, n_labelled=100, seed=0)
    assert len(data["train"]["x"]) == 50_000 and len(data["valid"]["x"]) == 10_000
    assert len(data["test"]["x"]) == 10_000 and data["train"]["x"].shape[1] == 784
    assert set(data["train"]["x"].unique().tolist()) == {0.0, 1.0}
    assert int(data["train"]["labelled"].sum()) == 100
    assert data["train"]["y"][data["train"]["labelled"]].bincount().tolist() == [10] * 10


@pytest.mark.parametrize("make", [lambda: Direct(epsilon=-1.0, max_retries=0), GumbelSoftmax])
@pytest.mark.parametrize("labelled", [True, False])
def test_one_training_step_reaches_every_parameter(make, labelled):
    """Smoke test of how the pieces compose: decoder and Gaussian heads through the sampled code, the discrete head
    through the estimator (direct: θ at every component, or the label)."""
    model, x = small_model_and_batch()
    task = SemiSupervisedVAE(model, make()).double()
    task.train()
    torch.manual_seed(1)
    task({"x": x, **({"y": torch.tensor([0, 1, 2, 1])} if labelled else {})}).loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
