"""Embedding and σ-networks of the image experiments: shapes, positivity, gradients, parameter count, factories."""

from __future__ import annotations

import pytest
import torch

from latentstruct.models.vision import (
    MnistConvNet,
    ResNet18,
    SigmaNet,
    cifar_sigma_net,
    embedding_net,
    mnist_sigma_net,
    sigma_net,
)

# (in_channels, side): Fashion-MNIST / MNIST and CIFAR-10 inputs
INPUTS = [(1, 28), (3, 32)]


def _n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _check_gradients(module: torch.nn.Module, x: torch.Tensor) -> None:
    module.zero_grad()
    module(x).square().sum().backward()
    for name, p in module.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("channels,side", INPUTS)
def test_mnist_convnet(channels, side):
    torch.manual_seed(0)
    net = MnistConvNet(channels, image_size=side)
    x = torch.randn(2, channels, side, side)
    assert net(x).shape == (2, 500) and net.out_dim == 500
    _check_gradients(net, x)


def test_mnist_convnet_layout():
    net = MnistConvNet()
    linear = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linear] == [(800, 500)]
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(m.out_channels, m.kernel_size) for m in convs] == [(20, (5, 5)), (50, (5, 5))]


@pytest.mark.parametrize("channels,side", INPUTS)
def test_resnet18(channels, side):
    torch.manual_seed(0)
    net = ResNet18(channels)
    x = torch.randn(2, channels, side, side)
    assert net(x).shape == (2, 512) and net.out_dim == 512
    _check_gradients(net, x)


def test_resnet18_parameter_count():
    # the kuangliu CIFAR ResNet18 has 11,173,962 parameters with its 512→10 linear layer (5130 parameters)
    assert _n_params(ResNet18(3)) == 11_173_962 - 5130


@pytest.mark.parametrize("builder", [mnist_sigma_net, cifar_sigma_net])
@pytest.mark.parametrize("channels,side", INPUTS)
def test_sigma_nets(builder, channels, side):
    torch.manual_seed(0)
    net = builder(channels, image_size=side)
    assert isinstance(net, SigmaNet)
    x = torch.randn(2, channels, side, side)
    sigma = net(x)
    assert sigma.shape == (2, 1) and (sigma > 0).all()
    _check_gradients(net, x)


def test_sigma_net_layouts():
    assert (mnist_sigma_net().head.in_features, mnist_sigma_net().head.out_features) == (500, 1)
    assert cifar_sigma_net().head.in_features == 20 * 14 * 14
    assert cifar_sigma_net(1, image_size=28).head.in_features == 20 * 12 * 12
    assert isinstance(mnist_sigma_net().activation, torch.nn.Softplus)


def test_factories():
    assert isinstance(embedding_net("mnist_convnet", 1), MnistConvNet)
    assert isinstance(embedding_net("resnet18", 3), ResNet18)
    assert sigma_net("mnist_convnet", 1)(torch.randn(1, 1, 28, 28)).shape == (1, 1)
    assert sigma_net("cifar_convnet", 3)(torch.randn(1, 3, 32, 32)).shape == (1, 1)
    assert sigma_net("cifar_convnet", 1)(torch.randn(1, 1, 28, 28)).shape == (1, 1)
    with pytest.raises(ValueError, match="mnist_convnet, resnet18"):
        embedding_net("vgg", 3)
    with pytest.raises(ValueError, match="mnist_convnet, cifar_convnet"):
        sigma_net("resnet18", 3)


def test_too_small_image():
    with pytest.raises(ValueError, match="too small"):
        MnistConvNet(1, image_size=10)
