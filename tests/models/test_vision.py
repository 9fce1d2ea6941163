"""Embedding and σ-networks of the image experiments: shapes, positivity, gradients, parameter count, options."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

import latentstruct.config  # noqa: F401  (registers the schemas the options name)
from latentstruct.models.vision import CifarSigmaNet, MnistConvNet, MnistSigmaNet, ResNet18, SigmaNet
from tests.helpers import CONFIGS

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


@pytest.mark.parametrize("builder", [MnistSigmaNet, CifarSigmaNet])
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
    assert (MnistSigmaNet().head.in_features, MnistSigmaNet().head.out_features) == (500, 1)
    assert CifarSigmaNet().head.in_features == 20 * 14 * 14
    assert CifarSigmaNet(1, image_size=28).head.in_features == 20 * 12 * 12
    assert isinstance(MnistSigmaNet().activation, torch.nn.Softplus)


def _part(group: str, option: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return instantiate(compose("train", overrides=["task=knn", f"{group}={option}"]).task[group])


def test_options_build_the_networks_from_the_image_sizes():
    """The encoder and sigma_net options are partials that take the sizes of the data (FROM_DATA)."""
    assert isinstance(_part("encoder", "mnist_convnet")(in_channels=1, image_size=28), MnistConvNet)
    assert isinstance(_part("encoder", "resnet18")(in_channels=3), ResNet18)
    assert _part("sigma_net", "mnist_convnet")(in_channels=1, image_size=28)(torch.randn(1, 1, 28, 28)).shape == (1, 1)
    assert _part("sigma_net", "cifar_convnet")(in_channels=3, image_size=32)(torch.randn(1, 3, 32, 32)).shape == (1, 1)
    assert _part("sigma_net", "cifar_convnet")(in_channels=1, image_size=28)(torch.randn(1, 1, 28, 28)).shape == (1, 1)
    assert MnistConvNet.FROM_DATA == MnistSigmaNet.FROM_DATA == CifarSigmaNet.FROM_DATA == ("in_channels", "image_size")
    assert ResNet18.FROM_DATA == ("in_channels",)  # adaptive pooling: any side


def test_too_small_image():
    with pytest.raises(ValueError, match="too small"):
        MnistConvNet(1, image_size=10)
