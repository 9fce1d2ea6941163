"""Discrete (Gaussian-mixture) VAE trained by direct optimisation through argmax (seed 003), and the GSM baseline.

* :class:`GMVAE`: a discrete code z ∈ {0 .. K−1} (K = 10) and per component a Gaussian code h (D = 30). Its
  networks are config options: :class:`Encoder` (x 784 → 400 → 200 shared features), :class:`DiscreteHead` (the
  logits φ(x, ·) ``[B, K]`` of q(z|x)), :class:`Decoder` (K·D → 400 → 784 Bernoulli logits); it adds the Gaussian
  heads (μ, log σ² ``[B, K, D]``). ``embed`` feeds the decoder K blocks of D, block k holding z_k · h_k.
* ``GMVAE.per_category``: θ(x, k) = log p(x | z=k, h_k) − KL(q(h | x, k) ‖ N(0, I)) for all K components in one
  decoder pass ``[B, K]`` (one Gaussian draw shared by the components), as :class:`PerCategory`.
* :func:`negative_elbo`: −(Σ_k q_k θ(x, k) − KL(q(z|x) ‖ uniform)), the bound of the seed's table (nats per image);
  :func:`kl_uniform`, :func:`gaussian_kl`, :func:`bernoulli_log_likelihood`.

Direct optimisation and Gumbel-softmax are estimators (:class:`~latentstruct.estimators.Direct`,
:class:`~latentstruct.estimators.GumbelSoftmax`) on the :class:`~latentstruct.structures.Categorical` code;
:mod:`latentstruct.tasks.vae` wires them.

The architecture in full, our reading of "z one-hot ⊗ Gaussian sample", and why direct optimisation is the direct
loss gradient here: docs/models.md#vae.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from latentstruct.ranges import AtLeast

__all__ = [
    "Decoder",
    "DiscreteHead",
    "DiscreteVAE",
    "Encoder",
    "GMVAE",
    "PerCategory",
    "bernoulli_log_likelihood",
    "gaussian_kl",
    "kl_uniform",
    "negative_elbo",
]


def gaussian_kl(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """KL(N(μ, diag exp(logvar)) ‖ N(0, I)) summed over the last dimension: ½ Σ (μ² + σ² − 1 − log σ²)."""
    return 0.5 * (mu.pow(2) + logvar.exp() - 1.0 - logvar).sum(-1)


class Encoder(nn.Sequential):
    """The shared encoder: x ``[B, input_dim]`` → features f ``[B, hidden[-1]]``, Linear → LeakyReLU per layer.

    Args:
        hidden: the shared encoder's hidden layers (seed 003: 400, 200).
        negative_slope: LeakyReLU slope (seed 003: 0.2).
    """

    FROM_DATA = ("input_dim",)  # given by the model, from the data

    def __init__(
        self, input_dim: int, hidden: Annotated[tuple[int, ...], AtLeast(1)] = (400, 200), negative_slope: float = 0.2
    ):
        sizes = [input_dim, *hidden]
        layers = [(nn.Linear(i, o), nn.LeakyReLU(negative_slope)) for i, o in zip(sizes, sizes[1:], strict=False)]
        super().__init__(*[m for layer in layers for m in layer])
        self.output_dim = sizes[-1]


class _OneHidden(nn.Sequential):
    """Linear → LeakyReLU → Linear."""

    def __init__(self, in_features: int, out_features: int, hidden: int, negative_slope: float):
        super().__init__(nn.Linear(in_features, hidden), nn.LeakyReLU(negative_slope), nn.Linear(hidden, out_features))


class DiscreteHead(_OneHidden):
    """The discrete head (the scorer): features f ``[B, in_features]`` → the logits φ(x, ·) ``[B, num_parts]`` of
    q(z|x), through one hidden layer.

    Args:
        hidden: hidden layer of the discrete head (seed 003: 100).
        negative_slope: LeakyReLU slope (seed 003: 0.2).
    """

    FROM_DATA = ("in_features", "num_parts")  # given by the model, from the data

    def __init__(
        self, in_features: int, num_parts: int, hidden: Annotated[int, AtLeast(1)] = 100, negative_slope: float = 0.2
    ):
        super().__init__(in_features, num_parts, hidden, negative_slope)


class Decoder(_OneHidden):
    """The decoder: the code's embedding ``[B, in_features]`` (:meth:`GMVAE.embed`) → Bernoulli logits of the pixels
    ``[B, out_features]``, through one hidden layer.

    Args:
        hidden: hidden layer of the decoder (seed 003: 400).
        negative_slope: LeakyReLU slope (seed 003: 0.2).
    """

    FROM_DATA = ("in_features", "out_features")  # given by the model, from the data

    def __init__(self, in_features: int, out_features: int, hidden: Annotated[int, AtLeast(1)] = 400,
                 negative_slope: float = 0.2):
        super().__init__(in_features, out_features, hidden, negative_slope)


class PerCategory(NamedTuple):
    """Everything :meth:`GMVAE.per_category` computes for a batch (K components, D Gaussian dimensions)."""

    phi: torch.Tensor  # [B, K] logits of q(z|x)
    mu: torch.Tensor  # [B, K, D]
    logvar: torch.Tensor  # [B, K, D]
    h: torch.Tensor  # [B, K, D] reparameterised sample of each component (one shared noise draw)
    log_lik: torch.Tensor  # [B, K] log p(x | z=k, h_k)
    kl_gauss: torch.Tensor  # [B, K] KL(q(h|x,k) ‖ N(0, I))
    theta: torch.Tensor  # [B, K] log_lik − kl_gauss


class GMVAE(nn.Module):
    """Gaussian-mixture VAE with a discrete component code (the architecture: docs/models.md#vae).

    ``encoder``, ``discrete_head`` and ``decoder`` are callables that take their sizes (the classes, or the partials
    the configs build); they are built here, in that order with the Gaussian heads between the last two, so that one
    seed gives one initialisation. The defaults are seed 003's model.
    """

    def __init__(
        self,
        encoder: Callable[..., nn.Module] = Encoder,
        discrete_head: Callable[..., nn.Module] = DiscreteHead,
        decoder: Callable[..., nn.Module] = Decoder,
        input_dim: int = 784,
        num_components: int = 10,
        gaussian_dim: int = 30,
    ) -> None:
        super().__init__()
        self.input_dim, self.num_components, self.gaussian_dim = input_dim, num_components, gaussian_dim
        self.encoder = encoder(input_dim=input_dim)
        features, code = self.encoder.output_dim, num_components * gaussian_dim
        self.discrete_head = discrete_head(in_features=features, num_parts=num_components)
        self.mu_head = nn.Linear(features, code)
        self.logvar_head = nn.Linear(features, code)
        self.decoder = decoder(in_features=code, out_features=input_dim)

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x`` [B, input_dim] → (φ [B, K] logits, μ [B, K, D], log σ² [B, K, D])."""
        f = self.encoder(x)
        shape = (x.shape[0], self.num_components, self.gaussian_dim)
        return self.discrete_head(f), self.mu_head(f).view(shape), self.logvar_head(f).view(shape)

    def decode(self, h: torch.Tensor) -> torch.Tensor:
        """Decoder input [B, K·D] (see :meth:`embed`) → Bernoulli logits [B, input_dim]."""
        return self.decoder(h)

    def embed(self, z: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Decoder input for a code ``z`` [B, K] (one-hot, or relaxed for GSM) and samples ``h`` [B, K, D]: block k
        of the [B, K·D] result is z_k · h_k (only the selected block is non-zero for a one-hot z)."""
        return (z.unsqueeze(-1) * h).flatten(1)

    def sample_gaussians(
        self, mu: torch.Tensor, logvar: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """h_k = μ_k + exp(½ log σ²_k) ⊙ e with one e ~ N(0, I_D) per example shared by the K components."""
        e = torch.randn((mu.shape[0], 1, mu.shape[2]), generator=generator, dtype=mu.dtype, device=mu.device)
        return mu + torch.exp(0.5 * logvar) * e

    def log_likelihood(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Bernoulli log p(x | logits) summed over pixels; ``logits`` [..., input_dim], ``x`` broadcast to it."""
        return -F.binary_cross_entropy_with_logits(logits, x.expand_as(logits), reduction="none").sum(-1)

    def category_log_likelihood(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """log p(x | z=k, h_k) for every k, ``[B, K]``, from ``x`` [B, input_dim] and ``h`` [B, K, D]: one decoder
        pass over B·K rows."""
        b, k, d = h.shape
        eye = torch.eye(k, dtype=h.dtype, device=h.device)
        # row (b, k) of the decoder input is embed(onehot(k), h_b): block k holds h_{b,k}, the other blocks zero
        inputs = (eye.view(1, k, k, 1) * h.view(b, 1, k, d)).reshape(b * k, k * d)
        return self.log_likelihood(x.unsqueeze(1), self.decode(inputs).view(b, k, -1))

    def per_category(self, x: torch.Tensor, generator: torch.Generator | None = None) -> PerCategory:
        """θ(x, k) = log p(x | z=k, h_k) − KL(q(h|x,k) ‖ N(0,I)) for every k, with h the shared-noise samples;
        the K decoder evaluations are one pass over B·K rows."""
        phi, mu, logvar = self.encode(x)
        h = self.sample_gaussians(mu, logvar, generator)
        log_lik = self.category_log_likelihood(x, h)
        kl_gauss = gaussian_kl(mu, logvar)
        return PerCategory(phi, mu, logvar, h, log_lik, kl_gauss, log_lik - kl_gauss)

    def bound(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Per-example negative ELBO [B] (exact in z, one Gaussian draw), see :func:`negative_elbo`."""
        out = self.per_category(x, generator)
        return negative_elbo(out.phi, out.theta, reduction="none")

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Predicted class [B]: argmax_k φ(x, k), the mode of q(z|x) (component k is trained to be class k)."""
        return self.encode(x)[0].argmax(-1)


def kl_uniform(phi: torch.Tensor) -> torch.Tensor:
    """KL(softmax(φ) ‖ uniform) = Σ_k q_k log q_k + log K over the last dimension of the logits φ ``[..., K]``."""
    log_q = torch.log_softmax(phi, -1)
    return (log_q.exp() * log_q).sum(-1) + math.log(phi.shape[-1])


def negative_elbo(phi: torch.Tensor, theta: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """−ELBO = −Σ_k q_k θ_k + KL(q ‖ uniform) with q = softmax(φ) over the last dimension [B, K]; ``reduction``:
    ``"mean"`` (over the batch), ``"sum"`` or ``"none"`` ([B])."""
    out = -(torch.softmax(phi, -1) * theta).sum(-1) + kl_uniform(phi)
    if reduction == "mean":
        return out.mean()
    if reduction == "sum":
        return out.sum()
    if reduction == "none":
        return out
    raise ValueError(f"unknown reduction {reduction!r}; choose mean, sum or none")


def bernoulli_log_likelihood(x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """log p(x | logits) for every pair of an image ``x`` [B, D] (in {0, 1}) and a decoder output ``logits`` [V, D]
    that does not depend on the image (the decoder of a code alone): ``[B, V]``, as one matrix product,
    x · (log σ(l) − log σ(−l)) + Σ log σ(−l)."""
    on, off = F.logsigmoid(logits), F.logsigmoid(-logits)
    return x @ (on - off).T + off.sum(-1)


class DiscreteVAE(nn.Module):
    r"""A VAE whose whole code is discrete (seed 003's unsupervised experiments): x → ``encoder`` → ``discrete_head``
    → the scores φ(x, ·) of q(z|x) over a structure's parts → z → ``decoder`` → Bernoulli logits of the pixels. The
    same three networks as :class:`GMVAE` (``encoder=gmvae``, ``scorer=gmvae``, ``decoder=gmvae``), without the
    Gaussian code.

    ``latent``: ``categorical`` — z one of ``size`` = K categories, scores ``[B, K]``, the decoder reads the one-hot
    (K inputs); ``binary_vector`` — z ∈ {0, 1}^n, n = ``size``, scores ``[B, n, 2]`` = φ_i(x, z_i) (the unstructured
    encoder φ(x, z) = Σ_i φ_i(x, z_i), :class:`~latentstruct.structures.BinaryVector`), the decoder reads the n bits.
    A relaxed z (Gumbel-softmax) is read the same way: its weights of the categories, or of state 1 of each bit.
    Prior p(z): uniform (K categories; n fair coins).
    """

    LATENTS = ("categorical", "binary_vector")

    def __init__(
        self,
        encoder: Callable[..., nn.Module] = Encoder,
        discrete_head: Callable[..., nn.Module] = DiscreteHead,
        decoder: Callable[..., nn.Module] = Decoder,
        input_dim: int = 784,
        latent: str = "categorical",
        size: int = 10,
    ) -> None:
        super().__init__()
        if latent not in self.LATENTS:
            raise ValueError(f"latent must be one of {self.LATENTS}, got {latent!r}")
        self.input_dim, self.latent, self.size = input_dim, latent, size
        self.part_shape = (size,) if latent == "categorical" else (size, 2)
        self.encoder = encoder(input_dim=input_dim)
        self.discrete_head = discrete_head(in_features=self.encoder.output_dim, num_parts=math.prod(self.part_shape))
        self.decoder = decoder(in_features=size, out_features=input_dim)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [B, input_dim] → φ(x, ·) ``[B, *part_shape]``."""
        return self.discrete_head(self.encoder(x)).view(x.shape[0], *self.part_shape)

    def code(self, z: torch.Tensor) -> torch.Tensor:
        """The decoder's input ``[..., size]`` for vertices or relaxed points ``[..., *part_shape]``."""
        return z if self.latent == "categorical" else z[..., 1]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Bernoulli logits ``[..., input_dim]`` of the pixels given z ``[..., *part_shape]``."""
        return self.decoder(self.code(z))

    def log_likelihood(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """log p(x | z) ``[B]`` for images ``x`` [B, input_dim] and their codes ``z`` [B, *part_shape]."""
        return -F.binary_cross_entropy_with_logits(self.decode(z), x, reduction="none").sum(-1)

    def vertex_log_likelihood(self, x: torch.Tensor, vertices: torch.Tensor) -> torch.Tensor:
        """log p(x | v) ``[B, V]`` for every image and every listed code ``vertices`` [V, *part_shape]: one decoder
        pass over the V codes (the decoder does not see the image)."""
        return bernoulli_log_likelihood(x, self.decode(vertices))

    def kl_prior(self, scores: torch.Tensor) -> torch.Tensor:
        """KL(q(z|x) ‖ p(z)) ``[B]``: against the uniform prior, per categorical variable, summed (exact)."""
        kl = kl_uniform(scores)
        return kl if kl.dim() == 1 else kl.flatten(1).sum(-1)
