"""Image embedding networks and σ-networks of the image experiments (seed 002, App. C.2).

* :class:`MnistConvNet` — the LeNet-style MNIST network: Conv 5×5 (20 ch) → ReLU → MaxPool 2 → Conv 5×5 (50 ch) →
  ReLU → MaxPool 2 → flatten → FC 500 → ReLU. On 28×28 inputs the maps are 24→12→8→4, so the flattened size is
  50·4·4 = 800. Other square sizes are handled by computing the flattened size arithmetically (``image_size``).
* :class:`ResNet18` — the CIFAR variant of ResNet-18: a 3×3 stride-1 stem with 64 channels and no max-pool, four
  stages of two BasicBlocks (64, 128, 256, 512 channels; strides 1, 2, 2, 2), BatchNorm after every convolution, a
  1×1 convolution + BatchNorm projection shortcut where the shape changes, then global average pooling. The
  classification layer is left out: the 512-d pooled features are the embedding. Adaptive pooling lets it take
  28×28 single-channel (Fashion-MNIST) as well as 32×32 three-channel (CIFAR-10) inputs.
* σ-networks map an image to one strictly positive scalar ``[B, 1]`` through a final Softplus:
  :func:`mnist_sigma_net` is the MnistConvNet followed by FC 500→1; :func:`cifar_sigma_net` is Conv 5×5 (20 ch) →
  ReLU → MaxPool 2 → flatten → FC →1 (20·14·14 inputs for 32×32 images, 20·12·12 for 28×28). Softplus is positive
  in exact arithmetic; in float32 it underflows to 0 only for pre-activations below about −100.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = [
    "MnistConvNet",
    "ResNet18",
    "SigmaNet",
    "cifar_sigma_net",
    "embedding_net",
    "mnist_sigma_net",
    "sigma_net",
]


def _conv_pool_size(size: int, kernel: int = 5, pool: int = 2) -> int:
    """Side length after a valid ``kernel``×``kernel`` convolution (stride 1) and a ``pool``×``pool`` max-pool."""
    out = (size - kernel + 1) // pool
    if out < 1:
        raise ValueError(f"image size {size} is too small for a {kernel}x{kernel} convolution and {pool}x pooling")
    return out


class MnistConvNet(nn.Module):
    """LeNet-style embedding ``[B, C, H, W] → [B, 500]`` (``H = W = image_size``, 28 for MNIST)."""

    out_dim = 500

    def __init__(self, in_channels: int = 1, image_size: int = 28):
        super().__init__()
        side = _conv_pool_size(_conv_pool_size(image_size))
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 20, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(20, 50, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(50 * side * side, self.out_dim),
            nn.ReLU(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


class BasicBlock(nn.Module):
    """Two 3×3 conv + BN layers with a residual connection (identity, or 1×1 conv + BN when the shape changes)."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """CIFAR-style ResNet-18 without its classifier: ``[B, C, H, W] → [B, 512]`` pooled features."""

    out_dim = 512

    def __init__(self, in_channels: int = 3):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
        )
        stages = []
        in_planes = 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(nn.Sequential(BasicBlock(in_planes, planes, stride), BasicBlock(planes, planes, 1)))
            in_planes = planes
        self.layers = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.pool(self.layers(self.stem(x))), 1)


class SigmaNet(nn.Module):
    """``features`` (→ ``[B, feature_dim]``) followed by a linear layer to one unit and a Softplus: ``[B, 1] > 0``."""

    def __init__(self, features: nn.Module, feature_dim: int):
        super().__init__()
        self.features = features
        self.head = nn.Linear(feature_dim, 1)
        self.activation = nn.Softplus()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.head(self.features(x)))


def mnist_sigma_net(in_channels: int = 1, image_size: int = 28) -> SigmaNet:
    """The MnistConvNet layers, then FC 500→1 and Softplus."""
    return SigmaNet(MnistConvNet(in_channels, image_size), MnistConvNet.out_dim)


def cifar_sigma_net(in_channels: int = 3, image_size: int = 32) -> SigmaNet:
    """Conv 5×5 (20 ch) → ReLU → MaxPool 2 → flatten → FC → 1 → Softplus (20·14·14 inputs for 32×32 images)."""
    side = _conv_pool_size(image_size)
    features = nn.Sequential(
        nn.Conv2d(in_channels, 20, kernel_size=5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
    )
    return SigmaNet(features, 20 * side * side)


_DEFAULT_SIZE = {1: 28, 3: 32}


def _image_size(in_channels: int, image_size: int | None) -> int:
    """Default side length: 28 for single-channel (MNIST-like) inputs, 32 otherwise (CIFAR-like)."""
    if image_size is not None:
        return image_size
    return _DEFAULT_SIZE.get(in_channels, 32)


def embedding_net(name: str, in_channels: int, image_size: int | None = None) -> nn.Module:
    """Embedding network by name: ``"mnist_convnet"`` or ``"resnet18"``; the result has an ``out_dim``.
    ``image_size`` matters only for ``mnist_convnet`` (default 28 for one channel, 32 otherwise)."""
    if name == "mnist_convnet":
        return MnistConvNet(in_channels, _image_size(in_channels, image_size))
    if name == "resnet18":
        return ResNet18(in_channels)
    raise ValueError(f"unknown embedding network {name!r}; choose one of mnist_convnet, resnet18")


def sigma_net(name: str, in_channels: int, image_size: int | None = None) -> SigmaNet:
    """σ-network by name: ``"mnist_convnet"`` or ``"cifar_convnet"``; output ``[B, 1]``, strictly positive.
    ``image_size`` defaults to 28 for one channel and 32 otherwise."""
    if name == "mnist_convnet":
        return mnist_sigma_net(in_channels, _image_size(in_channels, image_size))
    if name == "cifar_convnet":
        return cifar_sigma_net(in_channels, _image_size(in_channels, image_size))
    raise ValueError(f"unknown sigma network {name!r}; choose one of mnist_convnet, cifar_convnet")
