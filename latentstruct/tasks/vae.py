r"""Discrete VAEs on binarised MNIST / Fashion-MNIST (seed 003).

* :class:`SemiSupervisedVAE` — the GM-VAE (:class:`~latentstruct.models.vae.GMVAE`, K = 10 Gaussian components)
  built from ``task.encoder``, ``task.scorer`` (the logits φ of q(z|x)) and ``task.decoder``; z is a categorical code
  crossed by ``task.estimator``. Two phases (``trainer.phases``): the labelled split, then all of ``train`` without
  labels. Loss per batch: −log p(x | z, h) + Σ_k z_k KL(q(h|x,k) ‖ N(0, I)) + KL(q(z|x) ‖ uniform), plus
  ``label_weight`` · −log z_y in the labelled phase. The predicted class is argmax_k φ(x, k): ``acc`` (×100); also
  ``bound``, ``rec`` and ``kl`` (nats).
* :class:`UnsupervisedVAE` — the discrete VAE of seed 003's unsupervised table (a categorical code, or a GM-VAE),
  reporting the negative ELBO ``bound`` = ``rec`` + ``kl`` (nats), ``acc`` = the codes' purity against the labels
  (×100) and ``runner_up_log_q`` (:func:`runner_up_log_q`, the diagnostic of issue #33).

Estimators with a temperature (``temperature``) are annealed by the task; ``direct`` gets the loss per component as
its ``downstream`` (``task.theta``).

    python -m latentstruct.train +experiment=vae_direct

The loss in full, direct optimisation's θ, the annealing schedules and where our protocol differs:
docs/tasks.md#vae.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from latentstruct.data.base import iterate_batches
from latentstruct.estimators.base import Estimator
from latentstruct.estimators.exact import expected_loss
from latentstruct.models.vae import GMVAE, DiscreteVAE, gaussian_kl, kl_uniform, negative_elbo
from latentstruct.ranges import AtLeast, NonNegative, Part, Positive
from latentstruct.structures.binary_vector import BinaryVector
from latentstruct.structures.categorical import Categorical
from latentstruct.tasks.base import Task

__all__ = ["SemiSupervisedVAE", "UnsupervisedVAE", "VAEOutput", "runner_up_log_q"]

THETAS = ("likelihood", "elbo")


@dataclass
class VAEOutput:
    loss: torch.Tensor  # scalar: the batch's training loss (docs/tasks.md#vae)
    z: torch.Tensor  # [B, K] the code fed to the decoder (one-hot for direct, relaxed for gumbel_softmax)


def annealed(start: float, rate: float, floor: float, step: int) -> float:
    """max(start · exp(−rate · step), floor): the ε / τ schedule of seed 003's authors."""
    return max(start * math.exp(-rate * step), floor)


def anneal_start(estimator: nn.Module) -> float | None:
    """The configured temperature that starts the schedule (the estimator's ``temperature``: direct's |ε|, a
    relaxation's τ); None without one. Refuses a temperature that is not positive (direct with ε ≥ 0: the VAE's
    direct step goes towards the best code)."""
    start = estimator.temperature
    if start is not None and not start > 0:
        raise ValueError(f"the VAE anneals a positive temperature, got {start} (the VAE's direct step goes towards "
                         f"the best code: estimator.epsilon must be negative, seed 003: -1)")
    return start


def set_temperature(estimator: nn.Module, value: float | None) -> None:
    """Set the estimator's temperature for this step, as a scheduler sets an optimizer's learning rate."""
    if value is not None:
        estimator.temperature = value


class SemiSupervisedVAE(Task):
    """The seed-003 semi-supervised GM-VAE, trained through any estimator: direct optimisation and Gumbel-softmax
    are the seed's (docs/tasks.md#vae).

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

    @classmethod
    def build(
        cls,
        dims: dict[str, int],
        extras: dict,
        encoder: Annotated[Any, Part()],
        scorer: Annotated[Any, Part()],
        estimator: Annotated[Any, Part(Estimator)],
        decoder: Annotated[Any, Part()],
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
        self.vae, self.estimator, self.structure = vae, estimator, Categorical()
        self.theta, self.labelled_epsilon = theta, float(labelled_epsilon)
        self.anneal_rate, self.anneal_floor = float(anneal_rate), float(anneal_floor)
        self.label_weight, self.kl_discrete = float(label_weight), bool(kl_discrete)
        # the configured |ε| or τ starts the unsupervised phase's schedule (None: an estimator without temperature)
        self.anneal_start = anneal_start(estimator)
        self._phase_step = 0

    def begin_step(self, phase: int, step: int) -> None:
        self._phase_step = step

    def temperature(self, labelled: bool) -> float | None:
        """The estimator's temperature (None without one) for the next step: fixed in the labelled
        phase, annealed after it (docs/tasks.md#vae)."""
        if self.anneal_start is None:
            return None
        if labelled:
            return self.labelled_epsilon if self.estimator.takes_target else self.anneal_start
        return annealed(self.anneal_start, self.anneal_rate, self.anneal_floor, self._phase_step)

    def forward(self, batch: dict[str, torch.Tensor]) -> VAEOutput:
        x, y = batch["x"], batch.get("y")
        vae = self.vae
        phi, mu, logvar = vae.encode(x)
        h = vae.sample_gaussians(mu, logvar)
        kl_gauss = gaussian_kl(mu, logvar)  # [B, K]

        def downstream(code):  # −<code, θ>: each component's loss, extended linearly (docs/tasks.md#vae)
            with torch.no_grad():  # θ(x, k) for every k only steers the estimator: no gradient through it
                theta = vae.category_log_likelihood(x, h)
                if self.theta == "elbo":
                    theta = theta - kl_gauss
            return -(code * theta).sum(-1)

        to_target = self.estimator.takes_target  # the labelled step goes to the label itself
        set_temperature(self.estimator, self.temperature(labelled=y is not None))
        target = {"target": F.one_hot(y, phi.shape[-1]).to(phi.dtype)} if to_target and y is not None else {}
        z = self.estimator(phi, self.structure, None, downstream, **target)
        rec = vae.log_likelihood(x, vae.decode(vae.embed(z, h)))
        loss = (-rec + (z * kl_gauss).sum(-1) + self.kl_discrete * kl_uniform(phi)).mean()
        if y is not None and not to_target:
            loss = loss + self.label_weight * F.nll_loss(torch.log(z.clamp_min(1e-20)), y)
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


class UnsupervisedVAE(Task):
    r"""The unsupervised discrete VAE of seed 003's "Evaluating discrete VAEs" slides: binarised MNIST images x, a
    purely discrete code z ~ q(z|x) (a :class:`~latentstruct.models.vae.DiscreteVAE`), and the negative ELBO

        loss = mean_b [ E_{q(z|x_b)} −log p(x_b | z) + KL(q(z|x_b) ‖ p(z)) ]

    trained through any estimator of the ``estimator`` group on the ``structure`` group's latent: ``categorical`` (K
    = ``size`` categories) or ``binary_vector`` (z ∈ {0, 1}^n, n = ``size``, the unstructured encoder φ(x, z) = Σ_i
    φ_i(x, z_i)). The KL to the uniform prior is exact (its gradient through softmax(φ)); what the estimator decides
    is how the expected reconstruction term reaches φ:

    * **direct** (σ = 1, ε < 0 annealed; an estimator that ``wants_loss_vector``): ẑ = argmax(φ + γ), γ Gumbel on
      the parts (a sample of q), and the loss-perturbed ẑ_ε = argmax(φ + γ + |ε| θ) with θ the log-likelihood of
      the candidate codes, handed to the estimator as a linear ``downstream(μ) = <μ, c>`` (c = −θ). On the
      categorical latent c_k = −log p(x | k) for every k (the slides' difference of two argmaxes, exact). On the
      binary vector c_{i,v} = −log p(x | ẑ with z_i = v), the others held at their sampled values: the slides'
      coordinate-wise approximation z_i^{εθ+φ+γ} ≈ argmax_{z_i} εθ(ẑ_1, …, z_i, …, ẑ_n) + φ_i(x, z_i) + γ_i(z_i),
      n + 1 decoder passes per image. The decoder trains on ẑ.
    * **exact** (an estimator that ``enumerates``): the unbiased gradient by enumerating every code: the loss
      is E_q exactly, Σ_v q(v|x) (−log p(x | v)) (:func:`~latentstruct.estimators.exact.expected_loss`), so both the
      encoder and the decoder get the exact gradient of the ELBO.
    * **sfe** (score function, e.g. ``baseline=moving_average``): z ~ q, the encoder gets (L − b) ∇ log q(z|x),
      L = −log p(x | z); the decoder trains on z.
    * **gumbel_softmax** (z̃ = softmax((φ + γ)/τ), τ annealed; on the binary vector the binary Concrete) and
      **st_gumbel** (one-hot forward, the relaxation's backward): the decoder reads the relaxed weights.

    The estimator's temperature (direct's |ε|, a relaxation's τ) starts at its configured value and is
    annealed every step, max(start · exp(−``anneal_rate`` · t), ``anneal_floor``), t the steps taken, as in
    :class:`SemiSupervisedVAE`.

    **Evaluation** (noise-free where it matters): ``bound`` = the mean negative ELBO in nats — exact in z when the
    code has at most ``max_enumerate`` values (every K; 2^n bits up to that), else with ``bound_samples`` draws of
    q(z|x) per image from a generator seeded 0 —, ``rec`` = its E_q −log p(x|z) and ``kl``; ``acc`` = the cluster
    purity of the mode argmax q(z|x) (100 × the fraction of images whose code's most frequent label is theirs; the
    labels are read only here): a clustering accuracy for K ≥ 10 categories, near 100 by construction when the codes
    outnumber the images (many bits); ``runner_up_log_q`` = the mean log q(z₂|x) of the runner-up code
    (:func:`runner_up_log_q`), how far the encoder is from giving any code but its mode a gradient (issue 33: about
    −50 with the GM-VAE's networks, a collapse the exact and relaxed gradients do not leave).

    Args:
        size: K categories (``structure=categorical``) or n bits (``structure=binary_vector``).
        anneal_rate: the estimator's |ε| / τ = max(start · exp(−rate · t), floor), t = steps taken.
        anneal_floor: lower bound of the annealed |ε| / τ.
        max_enumerate: evaluate the bound exactly (every code enumerated) when the code has at most this many values.
        bound_samples: draws of q(z|x) per image for the bound when the codes are too many to enumerate.

    Batches hold ``x`` [B, input_dim] in {0, 1}; evaluation splits also ``y`` (for ``acc`` only).
    """

    @classmethod
    def build(
        cls,
        dims: dict[str, int],
        extras: dict,
        encoder: Annotated[Any, Part()],
        scorer: Annotated[Any, Part()],
        structure: Annotated[Any, Part(Categorical, BinaryVector)],
        estimator: Annotated[Any, Part(Estimator)],
        decoder: Annotated[Any, Part()],
        size: Annotated[int, AtLeast(1)] = 10,
        anneal_rate: Annotated[float, NonNegative] = 1e-5,
        anneal_floor: Annotated[float, Positive] = 0.1,
        max_enumerate: Annotated[int, AtLeast(1)] = 1024,
        bound_samples: Annotated[int, AtLeast(1)] = 10,
    ) -> UnsupervisedVAE:
        """The discrete VAE from the encoder, the discrete head (``scorer``) and the decoder, sized by the data
        (``input_dim`` pixels: ``dataset=semisupervised_mnist`` with ``n_labelled=0``) and ``size``."""
        if "input_dim" not in dims:
            raise ValueError("task=vae_unsupervised needs an image dataset (dataset=semisupervised_mnist)")
        latent = {Categorical: "categorical", BinaryVector: "binary_vector"}.get(type(structure))
        if latent is None:
            raise ValueError(f"task=vae_unsupervised takes structure=categorical or binary_vector, got "
                             f"{type(structure).__name__}")
        vae = DiscreteVAE(encoder, scorer, decoder, dims["input_dim"], latent, size)
        return cls(vae, structure, estimator, anneal_rate, anneal_floor, max_enumerate, bound_samples)

    def __init__(self, vae: DiscreteVAE, structure, estimator: nn.Module, anneal_rate: float = 1e-5,
                 anneal_floor: float = 0.1, max_enumerate: int = 1024, bound_samples: int = 10):
        super().__init__()
        if not (anneal_floor > 0 and anneal_rate >= 0 and max_enumerate >= 1 and bound_samples >= 1):
            raise ValueError("need anneal_floor > 0, anneal_rate >= 0, max_enumerate >= 1 and bound_samples >= 1")
        self.vae, self.structure, self.estimator = vae, structure, estimator
        self.anneal_rate, self.anneal_floor = float(anneal_rate), float(anneal_floor)
        self.max_enumerate, self.bound_samples = int(max_enumerate), int(bound_samples)
        self.anneal_start = anneal_start(estimator)
        self._step = 0

    def begin_step(self, phase: int, step: int) -> None:
        self._step = step

    def temperature(self) -> float | None:
        """The estimator's temperature (None without one) for the next step."""
        if self.anneal_start is None:
            return None
        return annealed(self.anneal_start, self.anneal_rate, self.anneal_floor, self._step)

    def num_codes(self) -> int:
        """How many values the code has: K, or 2^n."""
        return self.vae.size if self.vae.latent == "categorical" else 2**self.vae.size

    def vertices(self, like: torch.Tensor) -> torch.Tensor:
        """Every code ``[V, *part_shape]`` (V = :meth:`num_codes`), in the dtype and device of ``like``."""
        return self.structure.enumerate(self.vae.size).to(like)

    def forward(self, batch: dict[str, torch.Tensor]) -> VAEOutput:
        x, vae = batch["x"], self.vae
        phi = vae.scores(x)
        kl = vae.kl_prior(phi)
        if self.estimator.enumerates:  # E_q −log p(x|z) by enumeration: exact for encoder and decoder
            vertices = self.vertices(phi)
            rec = -expected_loss(phi, vertices, -vae.vertex_log_likelihood(x, vertices))
            return VAEOutput((-rec + kl).mean(), torch.softmax(phi.detach(), -1))
        set_temperature(self.estimator, self.temperature())
        if self.estimator.wants_loss_vector:
            downstream = self._direct_downstream(x)
        else:
            def downstream(code):  # the example's reconstruction loss at a code (sfe's reward)
                return -vae.log_likelihood(x, code)
        z = self.estimator(phi, self.structure, None, downstream)
        rec = vae.log_likelihood(x, z)
        return VAEOutput((-rec + kl).mean(), z)

    def _direct_downstream(self, x: torch.Tensor):
        """``downstream(μ) = L(ẑ) + <μ − ẑ, c>`` at the sampled code ẑ = μ (class docstring): linear in μ, so the
        direct estimator's loss-perturbed argmax is argmax(φ + γ − |ε| c); c and L(ẑ) carry no gradient."""
        vae = self.vae

        def downstream(mu):
            with torch.no_grad():
                z_hat = mu.detach()
                if vae.latent == "categorical":  # every category is one change of ẑ away
                    c = -vae.vertex_log_likelihood(x, self.vertices(mu))  # [B, K]
                    base = (c * z_hat).sum(-1)
                else:  # flip one bit at a time, the others held at their sampled values
                    c, base = self._bit_flip_losses(x, z_hat)
            return base + ((mu - z_hat) * c).flatten(1).sum(-1)

        return downstream

    def _bit_flip_losses(self, x: torch.Tensor, z_hat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """c ``[B, n, 2]`` with c[b, i, v] = −log p(x_b | ẑ_b with z_i = v), and L(ẑ) ``[B]``: n + 1 decoder passes
        per image (ẑ itself and its n one-bit flips)."""
        vae, b = self.vae, z_hat[..., 1]  # [B, n] bits
        batch, n = b.shape
        eye = torch.eye(n, dtype=b.dtype, device=b.device)
        flipped = b.unsqueeze(1) + eye * (1 - 2 * b.unsqueeze(1))  # [B, n (flipped bit), n]
        logits = vae.decoder(torch.cat([b.unsqueeze(1), flipped], 1))  # [B, n + 1, D]
        losses = F.binary_cross_entropy_with_logits(logits, x.unsqueeze(1).expand_as(logits), reduction="none").sum(-1)
        base, flips = losses[:, 0], losses[:, 1:]
        c = z_hat * base.view(batch, 1, 1) + (1 - z_hat) * flips.unsqueeze(-1)
        return c, base

    @torch.no_grad()
    def evaluate(self, data: dict[str, torch.Tensor], batch_size: int | None = None) -> dict[str, float]:
        """``bound`` (mean negative ELBO, nats), ``rec``, ``kl`` and ``acc`` (cluster purity ×100) over the split
        (class docstring); the draws, where the bound needs them, come from a generator seeded 0."""
        was_training = self.training
        self.eval()
        vae = self.vae
        generator = torch.Generator(device=data["x"].device).manual_seed(0)
        exact = self.num_codes() <= self.max_enumerate
        rec = kl = runner_up = 0.0
        codes = []
        for batch in iterate_batches(data, batch_size or 1000):
            x = batch["x"]
            phi = vae.scores(x)
            kl += float(vae.kl_prior(phi).sum())
            runner_up += float(runner_up_log_q(phi).sum())
            if exact:
                vertices = self.vertices(phi)
                rec += float(expected_loss(phi, vertices, -vae.vertex_log_likelihood(x, vertices)).sum())
            else:
                draws = self.structure.exact_sample(phi, generator=generator, num_samples=self.bound_samples)
                lik = torch.stack([vae.log_likelihood(x, z) for z in draws])  # [S, B]
                rec += float(-lik.mean(0).sum())
            codes.append(self._code_index(self.structure.map(phi)))
        self.train(was_training)
        n = len(data["x"])
        return {"acc": 100 * _purity(torch.cat(codes), data["y"]) if "y" in data else math.nan,
                "bound": (rec + kl) / n, "rec": rec / n, "kl": kl / n, "runner_up_log_q": runner_up / n}

    def _code_index(self, z: torch.Tensor) -> torch.Tensor:
        """An integer per code ``[B]``: the category, or the bits read in base 2."""
        if self.vae.latent == "categorical":
            return z.argmax(-1)
        powers = 2 ** torch.arange(self.vae.size, device=z.device, dtype=torch.float64)
        return (z[..., 1].double() * powers).sum(-1).long()


def runner_up_log_q(scores: torch.Tensor) -> torch.Tensor:
    """log q(z₂|x) ``[B]`` of the runner-up code z₂ (the second most probable) of q(z|x) from its scores: a
    categorical ``[B, K]`` (the second largest log-softmax), or independent bits ``[B, n, 2]`` (the mode with its
    least certain bit flipped: Σ_i max_v log q_i(v) plus the largest log q_i(second) − log q_i(first)). The
    exact gradient reaches a code only through q (∂E_q/∂φ_k = q_k (…)), and a relaxed sample of it has weight ~q
    too, so a runner-up log-probability far below zero is a collapse those gradients cannot leave."""
    log_q = torch.log_softmax(scores.detach(), -1)
    top = log_q.topk(2, dim=-1).values  # [..., 2]: the first and second log q per categorical variable
    if scores.dim() == 2:
        return top[:, 1]
    return top[..., 0].sum(-1) + (top[..., 1] - top[..., 0]).max(-1).values


def _purity(codes: torch.Tensor, labels: torch.Tensor) -> float:
    """The fraction of examples whose label is the most frequent label of their code."""
    pairs = torch.stack([codes.to(labels.device), labels], -1)
    unique, counts = torch.unique(pairs, dim=0, return_counts=True)
    best = {}
    for (code, _), count in zip(unique.tolist(), counts.tolist(), strict=True):
        best[code] = max(best.get(code, 0), count)
    return sum(best.values()) / len(labels)
