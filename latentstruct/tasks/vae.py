r"""Semi-supervised discrete VAE on binarised MNIST / Fashion-MNIST (seed 003, the authors' protocol as read).

The model is :class:`~latentstruct.models.vae.GMVAE` (K = 10 components, a 30-dimensional Gaussian each); the data
is :func:`~latentstruct.data.semisupervised.semisupervised_dataset`, and training runs in two phases
(``trainer.phases``): first epochs over the ``labelled`` split only, then epochs over all of ``train`` without labels.
Component k is trained to stand for class k, so the predicted class is argmax_k φ(x, k).

**Direct optimisation** (``method=direct``). For a batch, with ẑ = onehot argmax(φ + γ), γ standard Gumbel:

    loss = mean_b [ −log p(x | ẑ, h_ẑ) + KL(q(h | x, ẑ) ‖ N(0, I)) + KL(q(z|x) ‖ uniform) ] + S

The first two terms train the decoder and the Gaussian heads through the sampled component (its reparameterised h);
the third is the exact categorical KL (its gradient through softmax(φ)); S is
:func:`~latentstruct.models.vae.direct_encoder_surrogate`, whose gradient is the direct estimate of
−∇_φ E_γ[θ(x, z^{φ+γ})]: z_ε = onehot argmax(φ + γ + εθ) with θ(x, k) = log p(x | z=k, h_k) for every k
(``theta=likelihood``, the decoder's log-likelihood term as in the seed; ``theta=elbo`` subtracts each component's
Gaussian KL, the whole part of the ELBO that depends on z). In the labelled phase z_ε is the label's one-hot (the
seed's semi-supervised term E_γ[ℓ(z, z^{φ+γ})], the authors' "towards the label" update) and ε =
``labelled_epsilon`` (0.05); in the unsupervised phase ε = max(``anneal_start`` · exp(−``anneal_rate`` · t),
``anneal_floor``), t the steps taken in that phase.

**Gumbel-softmax** (``method=gsm``, the baseline with the same model). z̃ = softmax((φ + γ)/τ) (straight-through
with ``gsm_hard``) is fed to the decoder through :meth:`~latentstruct.models.vae.GMVAE.embed`:

    loss = mean_b [ −log p(x | z̃, h) + Σ_k z̃_k KL(q(h | x, k) ‖ N(0, I)) + KL(q(z|x) ‖ uniform) ]
           + ``gsm_label_weight`` · mean_b −log z̃_{b, y_b}    (labelled phase only)

τ = ``anneal_start`` in the labelled phase, then annealed as ε above (the authors' GSM shares the schedule).

**Evaluation** (both methods, noise-free where it matters): ``acc`` = 100 × the fraction of images whose mode
argmax_k φ(x, k) is their label; ``bound`` = the mean negative ELBO in nats, exact in z (all K components
enumerated) with one Gaussian draw per image from a fixed generator (:meth:`GMVAE.bound`); ``rec`` and ``kl`` split it
into −E_q log p(x | z, h) and the two KL terms.

**Where this differs from the authors' code** (recorded in the table notes): their direct run leaves KL(q(z|x) ‖
uniform) out of the training loss (it is only reported; the seed's objective has it, so we train on it by default;
``kl_discrete=false`` drops it, as they did); they
predict with the Gumbel-perturbed argmax (a sample) and report a one-sample bound, where we use the mode and the bound
exact in z; their ε/τ schedule multiplies the epoch index, which counts the labelled epochs, by the unsupervised
epoch's length, so ε reaches its floor after one unsupervised epoch, while here t counts the unsupervised steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from latentstruct.config import option_name
from latentstruct.data.base import iterate_batches
from latentstruct.models.vae import (
    GMVAE,
    annealed_epsilon,
    direct_encoder_surrogate,
    gaussian_kl,
    gumbel_softmax_sample,
    kl_uniform,
    negative_elbo,
)
from latentstruct.tasks.base import Task

__all__ = ["METHODS", "SemiSupervisedVAE", "VAEOutput"]

METHODS = ("direct", "gsm")


@dataclass
class VAEOutput:
    loss: torch.Tensor  # scalar: the batch's training loss (see the module docstring)
    z: torch.Tensor  # [B, K] the code fed to the decoder (one-hot for direct, relaxed for gsm)


class SemiSupervisedVAE(Task):
    """The seed-003 semi-supervised GM-VAE trained by direct optimisation or Gumbel-softmax (module docstring).

    Args:
        input_dim, num_classes: pixels per image and K (one component per class).
        method: ``direct`` or ``gsm``.
        gaussian_dim, encoder_hidden, head_hidden, decoder_hidden, negative_slope: :class:`GMVAE`'s sizes.
        theta: ``likelihood`` or ``elbo``: what scores each component in the direct loss-perturbed argmax.
        labelled_epsilon: ε of the labelled phase (direct).
        anneal_start, anneal_rate, anneal_floor: ε (direct) or τ (gsm) of the unsupervised phase,
            max(start · exp(−rate · t), floor); ``anneal_start`` is also gsm's τ in the labelled phase.
        gsm_label_weight: weight of gsm's labelled cross-entropy; gsm_hard: straight-through Gumbel-softmax.
        kl_discrete: train on KL(q(z|x) ‖ uniform) (the seed's objective); false drops it from the training loss,
            as the authors' direct code did (it is reported in the bound either way).

    Batches hold ``x`` [B, input_dim] in {0, 1} and, in the labelled phase, ``y`` [B].
    """

    def __init__(
        self,
        input_dim: int,
        num_classes: int,
        method: str = "direct",
        gaussian_dim: int = 30,
        encoder_hidden: tuple[int, int] = (400, 200),
        head_hidden: int = 100,
        decoder_hidden: int = 400,
        negative_slope: float = 0.2,
        theta: str = "likelihood",
        labelled_epsilon: float = 0.05,
        anneal_start: float = 1.0,
        anneal_rate: float = 1e-5,
        anneal_floor: float = 0.1,
        gsm_label_weight: float = 10.0,
        gsm_hard: bool = False,
        kl_discrete: bool = True,
    ):
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if theta not in ("likelihood", "elbo"):
            raise ValueError(f"theta must be likelihood or elbo, got {theta!r}")
        if not (labelled_epsilon > 0 and anneal_start > 0 and anneal_floor > 0 and anneal_rate >= 0):
            raise ValueError("need labelled_epsilon, anneal_start, anneal_floor > 0 and anneal_rate >= 0")
        self.vae = GMVAE(input_dim, num_classes, gaussian_dim, tuple(encoder_hidden), head_hidden, decoder_hidden,
                         negative_slope)
        self.method, self.theta = method, theta
        self.labelled_epsilon = float(labelled_epsilon)
        self.anneal = (float(anneal_start), float(anneal_rate), float(anneal_floor))
        self.gsm_label_weight, self.gsm_hard = float(gsm_label_weight), bool(gsm_hard)
        self.kl_discrete = bool(kl_discrete)
        self._phase_step = 0

    @classmethod
    def from_config(cls, cfg, dims: dict[str, int], extras: dict | None = None) -> SemiSupervisedVAE:
        """Reads ``task`` only; the sizes come from the data (``dataset=semisupervised_mnist``)."""
        if "input_dim" not in dims or "num_classes" not in dims:
            raise ValueError("task=vae needs an image dataset with labels (dataset=semisupervised_mnist)")
        t = cfg.task
        return cls(
            input_dim=dims["input_dim"], num_classes=dims["num_classes"], method=option_name(t.method),
            gaussian_dim=t.gaussian_dim, encoder_hidden=tuple(t.encoder_hidden), head_hidden=t.head_hidden,
            decoder_hidden=t.decoder_hidden, negative_slope=t.negative_slope, theta=option_name(t.theta),
            labelled_epsilon=t.labelled_epsilon, anneal_start=t.anneal_start, anneal_rate=t.anneal_rate,
            anneal_floor=t.anneal_floor, gsm_label_weight=t.gsm_label_weight, gsm_hard=t.gsm_hard,
            kl_discrete=t.kl_discrete,
        )

    def begin_step(self, phase: int, step: int) -> None:
        self._phase_step = step

    def temperature(self, labelled: bool) -> float:
        """ε (direct) or τ (gsm) for the next step: fixed in the labelled phase, annealed after it."""
        start, rate, floor = self.anneal
        if labelled:
            return self.labelled_epsilon if self.method == "direct" else start
        return max(start * annealed_epsilon(self._phase_step, rate, 0.0), floor)

    def forward(self, batch: dict[str, torch.Tensor]) -> VAEOutput:
        x, y = batch["x"], batch.get("y")
        vae = self.vae
        phi, mu, logvar = vae.encode(x)
        h = vae.sample_gaussians(mu, logvar)
        kl_gauss = gaussian_kl(mu, logvar)  # [B, K]
        temperature = self.temperature(y is not None)
        if self.method == "direct":
            with torch.no_grad():  # θ(x, k) for every k only steers the argmax: no gradient through it
                theta = vae.category_log_likelihood(x, h)
                if self.theta == "elbo":
                    theta = theta - kl_gauss
            surrogate, z, _ = direct_encoder_surrogate(phi, theta, temperature, target=y)
            rec = vae.log_likelihood(x, vae.decode(vae.embed(z, h)))
            loss = (-rec + (z * kl_gauss).sum(-1) + self.kl_discrete * kl_uniform(phi)).mean() + surrogate
            return VAEOutput(loss, z)
        z = gumbel_softmax_sample(phi, temperature, hard=self.gsm_hard)
        rec = vae.log_likelihood(x, vae.decode(vae.embed(z, h)))
        loss = (-rec + (z * kl_gauss).sum(-1) + self.kl_discrete * kl_uniform(phi)).mean()
        if y is not None:
            loss = loss + self.gsm_label_weight * F.nll_loss(torch.log(z.clamp_min(1e-20)), y)
        return VAEOutput(loss, z)

    @torch.no_grad()
    def evaluate(self, data: dict[str, torch.Tensor], batch_size: int | None = None) -> dict[str, float]:
        """``acc`` (×100), ``bound`` (the mean negative ELBO, nats), ``rec`` and ``kl`` over the split (module
        docstring); the Gaussian draws come from a generator seeded 0, so evaluating twice gives the same numbers."""
        was_training = self.training
        self.eval()
        generator = torch.Generator(device=data["x"].device).manual_seed(0)
        correct = bound = rec = 0.0
        for batch in iterate_batches(data, batch_size or 1000):
            out = self.vae.per_category(batch["x"], generator)
            q = torch.softmax(out.phi, -1)
            correct += float((out.phi.argmax(-1) == batch["y"]).sum())
            bound += float(negative_elbo(out.phi, out.theta, reduction="sum"))
            rec += float(-(q * out.log_lik).sum())
        self.train(was_training)
        n = len(data["x"])
        return {"acc": 100 * correct / n, "bound": bound / n, "rec": rec / n, "kl": (bound - rec) / n}
