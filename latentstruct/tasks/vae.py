r"""Semi-supervised discrete VAE on binarised MNIST / Fashion-MNIST (seed 003, the authors' protocol as read).

The model is :class:`~latentstruct.models.vae.GMVAE` (K = 10 components, a 30-dimensional Gaussian each), built from
the ``encoder``, ``scorer`` (the discrete head: the logits φ of q(z|x)) and ``decoder`` groups; the code z is a
:class:`~latentstruct.structures.Categorical` over the K components, and the ``estimator`` group says how gradients
cross its argmax. The data is :func:`~latentstruct.data.semisupervised.semisupervised_dataset`, and training runs in
two phases (``trainer.phases``): first epochs over the ``labelled`` split only, then epochs over all of ``train``
without labels. Component k is trained to stand for class k, so the predicted class is argmax_k φ(x, k).

For a batch, with z the estimator's code (a sample of q(z|x)) and h the Gaussian samples:

    loss = mean_b [ −log p(x | z, h) + Σ_k z_k KL(q(h | x, k) ‖ N(0, I)) + KL(q(z|x) ‖ uniform) ]
           + ``label_weight`` · mean_b −log z_{b, y_b}    (labelled phase; every estimator but ``direct``)

The first two terms train the decoder and the Gaussian heads through the code (its reparameterised h); the third is
the exact categorical KL (its gradient through softmax(φ)).

**Direct optimisation** (``estimator=direct``, seed 003's method). :class:`~latentstruct.estimators.Direct` with σ = 1
forwards ẑ = onehot argmax(φ + γ), γ Gumbel, and gives φ the direct gradient of E_γ[θ(x, z^{φ+γ})]: ``downstream(μ)
= −<μ, θ>`` holds θ(x, k) for every k (``theta=likelihood``: log p(x | z=k, h_k), the decoder's log-likelihood term
as in the seed; ``theta=elbo`` subtracts each component's Gaussian KL, the whole part of the ELBO that depends on z),
the loss of each component extended linearly, so its loss-perturbed argmax is argmax(φ + γ + |ε| θ). In the labelled
phase the loss-perturbed code is the label's one-hot (the estimator's ``target``: the seed's semi-supervised term
E_γ[ℓ(z, z^{φ+γ})], the authors' "towards the label" update) and |ε| = ``labelled_epsilon`` (0.05).

**Gumbel-softmax** (``estimator=gumbel_softmax``, the baseline with the same model): z̃ = softmax((φ + γ)/τ) is fed
to the decoder through :meth:`~latentstruct.models.vae.GMVAE.embed`, and the labelled phase adds the cross-entropy
above (``estimator=st_gumbel``: the straight-through variant, one-hot forward).

**Temperatures.** Before each step the task sets the estimator's temperature — Direct's ε (negative: "towards
best"), a Gumbel estimator's τ — as a scheduler sets an optimizer's learning rate: in the labelled phase |ε| =
``labelled_epsilon`` and τ = the configured τ; in the unsupervised phase the configured |ε| or τ annealed,
max(start · exp(−``anneal_rate`` · t), ``anneal_floor``), t the steps taken in that phase (the authors' GSM shares
direct's schedule). Other estimators (``marginals``, ``sfe``, ``spigot``...) have no temperature and also train.

**Evaluation** (every estimator, noise-free where it matters): ``acc`` = 100 × the fraction of images whose mode
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

import math
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from torch import nn

from latentstruct.data.base import iterate_batches
from latentstruct.estimators.base import Tempered
from latentstruct.estimators.direct import Direct
from latentstruct.models.vae import GMVAE, gaussian_kl, kl_uniform, negative_elbo
from latentstruct.ranges import AtLeast, NonNegative, Positive
from latentstruct.structures.categorical import Categorical
from latentstruct.tasks.base import Task

__all__ = ["SemiSupervisedVAE", "VAEOutput"]

THETAS = ("likelihood", "elbo")


@dataclass
class VAEOutput:
    loss: torch.Tensor  # scalar: the batch's training loss (see the module docstring)
    z: torch.Tensor  # [B, K] the code fed to the decoder (one-hot for direct, relaxed for gumbel_softmax)


class SemiSupervisedVAE(Task):
    """The seed-003 semi-supervised GM-VAE, trained through any estimator: direct optimisation and Gumbel-softmax
    are the seed's (module docstring).

    Args:
        gaussian_dim: dimension of each component's Gaussian code.
        theta: direct: component scores of the loss-perturbed argmax, the decoder's log-likelihood or the ELBO terms
            (log-likelihood minus the component's Gaussian KL).
        labelled_epsilon: direct: |ε| in the labelled phase.
        anneal_rate: the estimator's |ε| / τ in the unsupervised phase = max(start · exp(−rate · t), floor), t =
            unsupervised steps, start = its configured |ε| / τ.
        anneal_floor: lower bound of the annealed |ε| / τ.
        label_weight: weight of the labelled cross-entropy on the code (every estimator but direct, whose labelled
            step goes to the label itself).
        kl_discrete: train on KL(q(z|x) ‖ uniform), as the seed's objective does; false: as the authors' direct
            code did, only report it.

    Batches hold ``x`` [B, input_dim] in {0, 1} and, in the labelled phase, ``y`` [B].
    """

    PARTS = ("encoder", "scorer", "estimator", "decoder")

    @classmethod
    def build(
        cls,
        dims: dict[str, int],
        extras: dict,
        encoder,
        scorer,
        estimator,
        decoder,
        gaussian_dim: Annotated[int, AtLeast(1)] = 30,
        theta: Literal["likelihood", "elbo"] = "likelihood",
        labelled_epsilon: Annotated[float, Positive] = 0.05,
        anneal_rate: Annotated[float, NonNegative] = 1e-5,
        anneal_floor: Annotated[float, Positive] = 0.1,
        label_weight: Annotated[float, NonNegative] = 10.0,
        kl_discrete: bool = True,
    ) -> SemiSupervisedVAE:
        """The GM-VAE from the encoder, the discrete head (``scorer``) and the decoder, sized by the data
        (``input_dim`` pixels, ``num_classes`` = K components: ``dataset=semisupervised_mnist``)."""
        if "input_dim" not in dims or "num_classes" not in dims:
            raise ValueError("task=vae needs an image dataset with labels (dataset=semisupervised_mnist)")
        vae = GMVAE(encoder, scorer, decoder, dims["input_dim"], dims["num_classes"], gaussian_dim)
        return cls(vae, estimator, theta, labelled_epsilon, anneal_rate, anneal_floor, label_weight, kl_discrete)

    def __init__(
        self,
        vae: GMVAE,
        estimator: nn.Module,
        theta: str = "likelihood",
        labelled_epsilon: float = 0.05,
        anneal_rate: float = 1e-5,
        anneal_floor: float = 0.1,
        label_weight: float = 10.0,
        kl_discrete: bool = True,
    ):
        super().__init__()
        if theta not in THETAS:
            raise ValueError(f"theta must be likelihood or elbo, got {theta!r}")
        if not (labelled_epsilon > 0 and anneal_floor > 0 and anneal_rate >= 0):
            raise ValueError("need labelled_epsilon, anneal_floor > 0 and anneal_rate >= 0")
        if isinstance(estimator, Direct) and not estimator.epsilon < 0:
            raise ValueError(f"the VAE's direct step goes towards the best component: estimator.epsilon must be "
                             f"negative (seed 003: -1), got {estimator.epsilon}")
        self.vae, self.estimator, self.structure = vae, estimator, Categorical()
        self.theta, self.labelled_epsilon = theta, float(labelled_epsilon)
        self.anneal_rate, self.anneal_floor = float(anneal_rate), float(anneal_floor)
        self.label_weight, self.kl_discrete = float(label_weight), bool(kl_discrete)
        # the configured |ε| or τ starts the unsupervised phase's schedule (None: an estimator without temperature)
        self.anneal_start = (-estimator.epsilon if isinstance(estimator, Direct)
                             else estimator.tau if isinstance(estimator, Tempered) else None)
        self._phase_step = 0

    def begin_step(self, phase: int, step: int) -> None:
        self._phase_step = step

    def temperature(self, labelled: bool) -> float | None:
        """|ε| (direct) or τ (Gumbel estimators; None for the others) for the next step: fixed in the labelled
        phase, annealed after it (module docstring)."""
        if self.anneal_start is None:
            return None
        if labelled:
            return self.labelled_epsilon if isinstance(self.estimator, Direct) else self.anneal_start
        return max(self.anneal_start * math.exp(-self.anneal_rate * self._phase_step), self.anneal_floor)

    def forward(self, batch: dict[str, torch.Tensor]) -> VAEOutput:
        x, y = batch["x"], batch.get("y")
        vae = self.vae
        phi, mu, logvar = vae.encode(x)
        h = vae.sample_gaussians(mu, logvar)
        kl_gauss = gaussian_kl(mu, logvar)  # [B, K]

        def downstream(code):  # −<code, θ>: each component's loss, extended linearly (module docstring)
            with torch.no_grad():  # θ(x, k) for every k only steers the estimator: no gradient through it
                theta = vae.category_log_likelihood(x, h)
                if self.theta == "elbo":
                    theta = theta - kl_gauss
            return -(code * theta).sum(-1)

        direct = isinstance(self.estimator, Direct)
        self._set_temperature(labelled=y is not None)
        target = {"target": F.one_hot(y, phi.shape[-1]).to(phi.dtype)} if direct and y is not None else {}
        z = self.estimator(phi, self.structure, None, downstream, **target)
        rec = vae.log_likelihood(x, vae.decode(vae.embed(z, h)))
        loss = (-rec + (z * kl_gauss).sum(-1) + self.kl_discrete * kl_uniform(phi)).mean()
        if y is not None and not direct:
            loss = loss + self.label_weight * F.nll_loss(torch.log(z.clamp_min(1e-20)), y)
        return VAEOutput(loss, z)

    def _set_temperature(self, labelled: bool) -> None:
        """Set the estimator's temperature for this step, as a scheduler sets an optimizer's learning rate."""
        if isinstance(self.estimator, Direct):
            self.estimator.epsilon = -self.temperature(labelled)  # towards best
        elif isinstance(self.estimator, Tempered):
            self.estimator.tau = self.temperature(labelled)

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
