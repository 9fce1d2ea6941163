r"""Discrete (Gaussian-mixture) VAE trained by direct optimisation through argmax (seed 003), and the GSM baseline.

Model (:class:`GMVAE`)
----------------------
A discrete code z ∈ {0 .. K−1} (K = 10) and, per component, a D-dimensional Gaussian code h (D = 30):

* **Encoder.** x (784) → Linear 400 → LeakyReLU(0.2) → Linear 200 → LeakyReLU(0.2) = shared features f.
  *Discrete head*: f → Linear 100 → LeakyReLU(0.2) → Linear K = the logits φ(x, ·) of q(z|x) = softmax(φ).
  *Gaussian heads*: f → Linear K·D (means μ) and f → Linear K·D (log-variances log σ²), read as [K, D]: row k is
  q(h | x, z=k) = N(μ_k, diag σ_k²).
* **Decoder input (our reading of "z one-hot ⊗ Gaussian sample").** The decoder takes K·D = 300 values: K blocks of
  D, block k holding z_k · h_k. For a discrete z = k only block k is filled (with h_k) and the others are zero; for a
  relaxed z (Gumbel-softmax) block k is h_k scaled by the relaxed weight z_k. See :meth:`GMVAE.embed`.
* **Decoder.** 300 → Linear 400 → LeakyReLU(0.2) → Linear 784 = Bernoulli logits of the binarised pixels.
* **Prior.** p(z) uniform over K, p(h) = N(0, I_D) (the same for every component).

Every size and the LeakyReLU slope are constructor arguments. The optimiser settings of the authors' protocol (Adam,
lr 8e-4, batch 100; ε = 0.05 while the labelled term is on, then ε = max(exp(−1e-5·step), 0.1)) belong to the training
loop; :data:`DEFAULTS` records them and :func:`annealed_epsilon` computes the schedule.

The terms that depend on k (:meth:`GMVAE.per_category`)
-------------------------------------------------------
With one standard-normal draw e ∈ R^D per example, *shared by all components* (common random numbers, so that
θ(x, k) − θ(x, k') is not blurred by independent noise), h_k = μ_k + σ_k ⊙ e and

    θ(x, k) = log p(x | z=k, h_k) − KL(N(μ_k, σ_k²) ‖ N(0, I))

(Bernoulli log-likelihood summed over pixels; the Gaussian KL in closed form). The ELBO is then

    ELBO(x) = Σ_k q_k θ(x, k) − KL(q(z|x) ‖ uniform),   KL(q ‖ uniform) = Σ_k q_k log q_k + log K,

exact in z (the K components are enumerated) and a one-sample estimate in h. :func:`negative_elbo` returns
−ELBO, the "bound" of the seed's table (in nats per image). ``per_category`` computes all K values of θ in one
decoder pass over B·K rows; the direct estimator needs them all for the loss-perturbed argmax.

Direct optimisation (:func:`direct_encoder_surrogate`)
------------------------------------------------------
z^{φ+γ} = argmax_k φ_k + γ_k with γ i.i.d. standard Gumbel is a sample of q(z|x) (Gumbel-max), so
E_γ[θ(x, z^{φ+γ})] = Σ_k softmax(φ)_k θ_k. The seed's theorem gives its gradient through φ as

    ∇_φ E_γ[θ(x, z^{φ+γ})] = lim_{ε→0} E_γ[z_ε − ẑ] / ε,   ẑ = onehot argmax(φ + γ),  z_ε = onehot argmax(φ + γ + εθ).

(With Gumbel-max the finite-ε expectation is exactly (softmax(φ + εθ) − softmax(φ))/ε, so the bias is O(ε).)

**Sign convention.** θ is a log-likelihood, to be *maximised*, while training loops *minimise*. The surrogate is

    S = −(1/B) Σ_b <φ_b, z_ε,b − ẑ_b> / ε,     ∇_{φ_b} S = (ẑ_b − z_ε,b) / (B ε),

i.e. the *negated* direct estimate of ∇_φ E[θ] (batch mean), so that a gradient-descent step on S is an ascent
step on E_γ[θ] (for ε > 0; the formula is valid for ε < 0 too, z_ε then moving "away from best"). The gradient
reaches the encoder weights w through φ(x; w) by the chain rule. S's *value* carries no meaning; only its gradient
does. (This equals the project's direct-loss convention of :mod:`latentstruct.estimators.direct` with the loss
ℓ = −θ and ε_there = −ε_here: "towards best".)

**Labelled examples** (the semi-supervised term E_γ[ℓ(z, z^{φ+γ})]). For an example with a label y, z_ε is replaced
by onehot(y) — the best code, i.e. the ε → ∞ limit of the "towards best" argmax when only the label scores — so
∇_{φ_b} S = (ẑ_b − onehot(y_b)) / (B ε): descent raises φ_y and lowers the sampled code's φ (zero when ẑ = y). This
is what makes component k stand for class k, so that argmax_k φ(x, k) is the predicted class (:meth:`GMVAE.predict`).

Gumbel-softmax baseline (:func:`gumbel_softmax_sample`): softmax((φ + γ)/τ), fed to the same decoder through
:meth:`GMVAE.embed`.

References: G. Lorberbom, A. Gane, T. Jaakkola, T. Hazan (2019), "Direct optimization through argmax for discrete
variational auto-encoder", NeurIPS (seed 003). E. Jang, S. Gu, B. Poole (2017) and C. Maddison, A. Mnih, Y. W. Teh
(2017) for the Gumbel-softmax / Concrete relaxation. D. Kingma, M. Welling (2014) for the Gaussian KL.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from latentstruct.structures.base import gumbel_like

__all__ = [
    "DEFAULTS",
    "GMVAE",
    "PerCategory",
    "annealed_epsilon",
    "direct_encoder_surrogate",
    "gaussian_kl",
    "gumbel_softmax_sample",
    "kl_uniform",
    "negative_elbo",
]

#: the authors' training protocol (for the training loop; nothing here reads it)
DEFAULTS: dict[str, float] = {
    "lr": 8e-4,
    "batch_size": 100,
    "epsilon_labelled": 0.05,
    "epsilon_decay": 1e-5,
    "epsilon_floor": 0.1,
}


def annealed_epsilon(step: int, decay: float = 1e-5, floor: float = 0.1) -> float:
    """ε after the labelled phase: max(exp(−decay · step), floor)."""
    return max(math.exp(-decay * step), floor)


def gaussian_kl(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """KL(N(μ, diag exp(logvar)) ‖ N(0, I)) summed over the last dimension: ½ Σ (μ² + σ² − 1 − log σ²)."""
    return 0.5 * (mu.pow(2) + logvar.exp() - 1.0 - logvar).sum(-1)


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
    """Gaussian-mixture VAE with a discrete component code (see the module docstring for the architecture)."""

    def __init__(
        self,
        input_dim: int = 784,
        num_components: int = 10,
        gaussian_dim: int = 30,
        encoder_hidden: tuple[int, int] = (400, 200),
        head_hidden: int = 100,
        decoder_hidden: int = 400,
        negative_slope: float = 0.2,
    ) -> None:
        super().__init__()
        self.input_dim, self.num_components, self.gaussian_dim = input_dim, num_components, gaussian_dim
        h1, h2 = encoder_hidden
        act = lambda: nn.LeakyReLU(negative_slope)  # noqa: E731
        self.encoder = nn.Sequential(nn.Linear(input_dim, h1), act(), nn.Linear(h1, h2), act())
        self.discrete_head = nn.Sequential(nn.Linear(h2, head_hidden), act(), nn.Linear(head_hidden, num_components))
        self.mu_head = nn.Linear(h2, num_components * gaussian_dim)
        self.logvar_head = nn.Linear(h2, num_components * gaussian_dim)
        self.decoder = nn.Sequential(
            nn.Linear(num_components * gaussian_dim, decoder_hidden), act(), nn.Linear(decoder_hidden, input_dim)
        )

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


def direct_encoder_surrogate(
    phi: torch.Tensor,
    theta: torch.Tensor,
    epsilon: float,
    generator: torch.Generator | None = None,
    target: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Direct-optimisation surrogate for the encoder logits ``phi`` [B, K] given ``theta`` [B, K] (detached here).

    Returns (S, ẑ, z_ε): ẑ = onehot argmax(φ + γ) with γ standard Gumbel drawn from ``generator``; z_ε = onehot
    argmax(φ + γ + εθ), or onehot(target_b) for every b with ``target`` [B] ≥ 0 (a negative target means
    unlabelled); S = −mean_b <φ_b, z_ε,b − ẑ_b>/ε, whose gradient (ẑ − z_ε)/(Bε) is the *negated* direct estimate of
    ∇_φ E_γ[θ], so minimising S ascends E_γ[θ]. ẑ and z_ε carry no gradient. See the module docstring."""
    if epsilon == 0:
        raise ValueError("epsilon must be non-zero")
    if phi.shape != theta.shape or phi.ndim != 2:
        raise ValueError(f"phi and theta must both be [B, K], got {tuple(phi.shape)} and {tuple(theta.shape)}")
    k = phi.shape[-1]
    with torch.no_grad():
        perturbed = phi.detach() + gumbel_like(phi.detach(), generator)
        z_hat = F.one_hot(perturbed.argmax(-1), k).to(phi.dtype)
        z_eps = F.one_hot((perturbed + epsilon * theta.detach()).argmax(-1), k).to(phi.dtype)
        if target is not None:
            target = target.to(device=phi.device, dtype=torch.long)
            if target.shape != phi.shape[:1]:
                raise ValueError(f"target must be [B] = [{phi.shape[0]}], got {tuple(target.shape)}")
            if bool((target >= k).any()):
                raise ValueError(f"target labels must be < K = {k}")
            has_label = target >= 0
            z_label = F.one_hot(target.clamp_min(0), k).to(phi.dtype)
            z_eps = torch.where(has_label.unsqueeze(-1), z_label, z_eps)
    surrogate = -((phi * (z_eps - z_hat)).sum(-1) / epsilon).mean()
    return surrogate, z_hat, z_eps


def gumbel_softmax_sample(
    phi: torch.Tensor, tau: float, generator: torch.Generator | None = None, hard: bool = False
) -> torch.Tensor:
    """Gumbel-softmax (Concrete) sample softmax((φ + γ)/τ) over the last dimension; with ``hard`` the forward value
    is the one-hot argmax and the gradient that of the relaxed sample (straight-through)."""
    if tau <= 0:
        raise ValueError(f"tau={tau} must be positive")
    soft = torch.softmax((phi + gumbel_like(phi, generator)) / tau, -1)
    if not hard:
        return soft
    hard_z = F.one_hot(soft.argmax(-1), phi.shape[-1]).to(soft.dtype)
    return hard_z + soft - soft.detach()
