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
  :class:`MnistSigmaNet` is the MnistConvNet followed by FC 500→1; :class:`CifarSigmaNet` is Conv 5×5 (20 ch) →
  ReLU → MaxPool 2 → flatten → FC →1 (20·14·14 inputs for 32×32 images, 20·12·12 for 28×28). Softplus is positive
  in exact arithmetic; in float32 it underflows to 0 only for pre-activations below about −100.

They are the options of the ``encoder`` (MnistConvNet, ResNet18) and ``sigma_net`` groups of the k-NN task, partials
that the task calls with the sizes of the data (``FROM_DATA``: the images' channels and side).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["MnistConvNet", "ResNet18", "SigmaNet", "MnistSigmaNet", "CifarSigmaNet"]


def _conv_pool_size(size: int, kernel: int = 5, pool: int = 2) -> int:
    """Side length after a valid ``kernel``×``kernel`` convolution (stride 1) and a ``pool``×``pool`` max-pool."""
    out = (size - kernel + 1) // pool
    if out < 1:
        raise ValueError(f"image size {size} is too small for a {kernel}x{kernel} convolution and {pool}x pooling")
    return out


class MnistConvNet(nn.Module):
    """LeNet-style embedding ``[B, C, H, W] → [B, 500]`` (``H = W = image_size``, 28 for MNIST)."""

    FROM_DATA = ("in_channels", "image_size")  # given by the task, from the data
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
    """CIFAR-style ResNet-18 without its classifier: ``[B, C, H, W] → [B, 512]`` pooled features (any side)."""

    FROM_DATA = ("in_channels",)  # given by the task, from the data
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


class MnistSigmaNet(SigmaNet):
    """The MnistConvNet layers, then FC 500→1 and Softplus."""

    FROM_DATA = ("in_channels", "image_size")  # given by the task, from the data

    def __init__(self, in_channels: int = 1, image_size: int = 28):
        super().__init__(MnistConvNet(in_channels, image_size), MnistConvNet.out_dim)


class CifarSigmaNet(SigmaNet):
    """Conv 5×5 (20 ch) → ReLU → MaxPool 2 → flatten → FC → 1 → Softplus (20·14·14 inputs for 32×32 images)."""

    FROM_DATA = ("in_channels", "image_size")  # given by the task, from the data

    def __init__(self, in_channels: int = 3, image_size: int = 32):
        side = _conv_pool_size(image_size)
        features = nn.Sequential(
            nn.Conv2d(in_channels, 20, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        super().__init__(features, 20 * side * side)
