r"""Indirectly semi-supervised citation field extraction (seed 004 Table 4, the setting of Rooshenas et al. 2019): a
few labelled citations, unlabelled ones that only get a noisy rule reward, token accuracy.

:class:`CitationEnergy` is :class:`~latentstruct.tasks.energy_ner.SequenceLabelEnergy` on batches that mix labelled
and unlabelled citations (``labelled`` ``[B]``, the rule reward's token ``cues`` ``[B, n, P]``; an unlabelled row's
``y`` is all padding). Every likelihood term reads the labelled rows only; eq. 6's λ E(x, A(x)) reads all. An
unlabelled row's L_CD is ``task.unlabelled_loss`` (:data:`UNLABELLED_LOSSES`): ``best`` (the best-reward sample of A
as the positive), ``pairs`` (:func:`reward_pair_loss` over the pairs the reward orders) or ``none`` (no L_CD term:
citation_cd's default, chosen on validation, issue #33). R-SPEN (``method=spen``) learns from the reward alone.

Metrics: ``acc`` (token accuracy ×100) and ``author_share`` (% of tokens tagged author).

    python -m latentstruct.train +experiment=citation_cd +preset=citation_cpu

What the seed says of the unlabelled rows, each reading in full and R-SPEN: docs/tasks.md#energy_citation.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

import torch
import torch.nn.functional as F

from latentstruct.data.citation_rules import CUE_INDEX, CUE_RULES, FIELDS, reward, value
from latentstruct.models.energy import categorical_samples, cd_loss, hamming_loss, ssvm_loss
from latentstruct.models.masks import length_mask
from latentstruct.ranges import AtLeast, NonNegative, Part, Positive, Probability
from latentstruct.tasks.energy import HVP, EnergyOutput, InnerOptimizer, InverseSolver, Primary
from latentstruct.tasks.energy_ner import SequenceLabelEnergy, SequenceMethod

__all__ = ["UNLABELLED_LOSSES", "CitationEnergy", "reward_pair_loss"]

UnlabelledLoss = Literal["best", "pairs", "none"]
UNLABELLED_LOSSES: tuple[str, ...] = get_args(UnlabelledLoss)


def reward_pair_loss(energies: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """``[B]``: mean over the ordered pairs (i, j) of the K samples with R_i > R_j of softplus(R_i − R_j + E_i − E_j)
    (the one-negative L_CD of seed 004's Appendix D with the better sample as the positive and the reward gap as Δ);
    0 for a row whose K rewards all tie. ``energies``, ``rewards`` ``[K, B]``; the rewards carry no gradient."""
    if energies.shape != rewards.shape or energies.ndim != 2:
        raise ValueError(f"energies and rewards must both be [K, B]; got {tuple(energies.shape)}, "
                         f"{tuple(rewards.shape)}")
    gap = (rewards.unsqueeze(1) - rewards.unsqueeze(0)).detach().to(energies.dtype)  # [K, K, B]: R_i − R_j
    ordered = (gap > 0).to(energies.dtype)
    terms = F.softplus(gap + energies.unsqueeze(1) - energies.unsqueeze(0)) * ordered
    return terms.sum((0, 1)) / ordered.sum((0, 1)).clamp_min(1)


class CitationEnergy(SequenceLabelEnergy):
    """Semi-supervised citation field extraction (module docstring); the networks and settings of
    :class:`SequenceLabelEnergy`, plus ``ge_weight`` and ``ge_target``."""

    @classmethod
    def build(
        cls,
        dims: dict[str, int],
        extras: dict[str, Any],
        energy: Annotated[Any, Part()],
        infnet: Annotated[Any, Part()],
        cost_net: Annotated[Any, Part()],
        encoder: Annotated[Any, Part()],
        embedding: dict[str, Any],
        method: SequenceMethod = "implicit",
        primary: Primary = "cd",
        lam: Annotated[float, NonNegative] = 1.0,
        inner_steps: Annotated[int, NonNegative] = 1,
        inner_optimizer: InnerOptimizer = "adam",
        inner_lr: Annotated[float, Positive] = 1e-3,
        neumann_terms: Annotated[int, NonNegative] = 20,
        neumann_alpha: Annotated[float, Positive] = 5e-3,
        num_samples: Annotated[int, AtLeast(1)] = 10,
        straight_through: bool = True,
        spen_steps: Annotated[int, NonNegative] = 10,
        spen_lr: Annotated[float, Positive] = 0.1,
        phases: int = 0,
        ge_weight: Annotated[float, NonNegative] = 0.0,
        ge_target: Annotated[float, Probability] = 0.9,
        unlabelled_loss: UnlabelledLoss = "best",
        inverse_solver: InverseSolver = "minres",
        solver_tol: Annotated[float, NonNegative] = 0.2,
        solver_max_iter: Annotated[int, NonNegative] = 20,
        solver_damping: Annotated[float, NonNegative] = 0.0,
        hvp: HVP = "double_backward",
    ) -> CitationEnergy:
        """The networks of :meth:`SequenceLabelEnergy.build` (``dataset=cora``).

        Args:
            method: crf (the supervised floor: BiLSTM-CRF on the labelled citations), implicit (Algorithm 1 with
                primary cd or dvn), explicit, spen (R-SPEN: SSVM on labelled, reward-ranked samples on unlabelled),
                mbce (the BiLSTM; with ge_weight > 0: GE).
            ge_weight: mbce: weight of the generalized-expectation term on the unlabelled citations (GE).
            ge_target: GE's target share p̃ of a cue's tokens in the cue's fields (our choice).
            unlabelled_loss: cd, spen: what L_CD (R-SPEN's ranking term) does with an unlabelled citation (the seed
                gives no formula): best (its highest-reward sample of A is the positive, Δ = the reward gap), pairs
                (the one-negative L_CD on every pair of samples the reward orders, Δ = the reward gap; R-SPEN's
                ranking) or none (L_CD on the labelled citations only; the unlabelled ones enter through λ E(x, A(x))
                alone; citation_cd's choice on validation). Module docstring; issue #33 item 2.
        """
        if unlabelled_loss not in UNLABELLED_LOSSES:
            raise ValueError(f"unlabelled_loss must be one of {UNLABELLED_LOSSES}, got {unlabelled_loss!r}")
        if "num_cues" not in dims:
            raise ValueError("task=citation_energy needs the Cora data (dataset=cora)")
        if method in ("infnet",) or (method in ("implicit", "explicit") and primary == "ssvm"):
            raise ValueError(f"method={method} primary={primary} needs a gold output on every citation; the citation "
                             "task offers crf, mbce (+ GE), spen (R-SPEN) and implicit / explicit with cd or dvn")
        task = super().build(dims, extras, energy, infnet, cost_net, encoder, embedding, method=method,
                             primary=primary, lam=lam, inner_steps=inner_steps, inner_optimizer=inner_optimizer,
                             inner_lr=inner_lr, neumann_terms=neumann_terms, neumann_alpha=neumann_alpha,
                             num_samples=num_samples, straight_through=straight_through, infnet_ce=0.0,
                             spen_steps=spen_steps, spen_lr=spen_lr, phases=phases, normalize_cost=False,
                             inverse_solver=inverse_solver, solver_tol=solver_tol,
                             solver_max_iter=solver_max_iter, solver_damping=solver_damping, hvp=hvp)
        task.ge_weight, task.ge_target = float(ge_weight), float(ge_target)
        task.unlabelled_loss = unlabelled_loss
        return task

    # ------------------------------------------------------------------------------------------- helpers
    @staticmethod
    def _labelled(batch: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return batch["labelled"].to(dtype)

    def _token_mask(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return length_mask(batch["lengths"], batch["x"].shape[1], batch["x"].device).to(batch["cues"].dtype)

    def rewards(self, y: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """R of the argmax tags of ``y`` ``[*, B, n, T]`` → ``[*, B]`` (no gradient)."""
        with torch.no_grad():
            return reward(batch["cues"], y.argmax(-1), self._token_mask(batch))

    def reward_cd(self, batch: dict[str, torch.Tensor], samples: torch.Tensor, gold: torch.Tensor | None = None
                  ) -> torch.Tensor:
        """``[B]``: L_CD of every row over the ``samples`` ``[K, B, n, T]``: labelled rows against their gold with Δ =
        wrong tags, unlabelled rows as ``unlabelled_loss`` says (docs/tasks.md#energy_citation)."""
        lab = self._labelled(batch, samples.dtype)
        r = self.rewards(samples, batch)  # [K, B]
        if self.unlabelled_loss != "best":
            gold = self.gold(batch).to(samples.dtype) if gold is None else gold
            energies = self.energy(batch, torch.cat([gold.unsqueeze(0), samples]))
            wrong = hamming_loss(samples, gold, batch["lengths"])
            supervised = cd_loss(energies[0], energies[1:], wrong.detach(), reduction="none")
            if self.unlabelled_loss == "none":
                return lab * supervised
            return lab * supervised + (1 - lab) * reward_pair_loss(energies[1:], r)
        best = r.argmax(0)  # [B]
        target = samples.gather(0, best.view(1, -1, 1, 1).expand(1, *samples.shape[1:]))[0]
        gold = self.gold(batch).to(samples.dtype) if gold is None else gold
        positive = lab.view(-1, 1, 1) * gold + (1 - lab.view(-1, 1, 1)) * target
        energies = self.energy(batch, torch.cat([positive.unsqueeze(0), samples]))
        wrong = hamming_loss(samples, gold, batch["lengths"])
        delta = lab * wrong + (1 - lab) * (r.gather(0, best.unsqueeze(0)) - r)
        return cd_loss(energies[0], energies[1:], delta.detach(), reduction="none")

    def ge_loss(self, batch: dict[str, torch.Tensor], probs: torch.Tensor) -> torch.Tensor:
        """The GE term (scalar) of the unlabelled rows of the batch, from A's per-token probabilities ``[B, n, T]``."""
        unlab = 1 - self._labelled(batch, probs.dtype)
        mask = self._token_mask(batch).to(probs.dtype) * unlab.unsqueeze(-1)
        eps = 1e-6
        total = probs.new_zeros(())
        p = self.ge_target
        for _, cue, fields in CUE_RULES.values():
            fired = batch["cues"][..., CUE_INDEX[cue]].to(probs.dtype) * mask
            count = fired.sum()
            if count == 0:
                continue
            share = probs[..., [FIELDS.index(f) for f in fields]].sum(-1)
            m = ((share * fired).sum() / count).clamp(eps, 1 - eps)
            total = total + p * torch.log(torch.tensor(p) / m) + (1 - p) * torch.log(torch.tensor(1 - p) / (1 - m))
        return total

    # --------------------------------------------------------------------------------------------- hooks
    def gold(self, batch):
        """One-hot gold fields ``[B, n, T]``, rows at padding **and of unlabelled citations** 0."""
        return super().gold(batch) * self._labelled(batch, torch.get_default_dtype()).view(-1, 1, 1)

    def value_target(self, y_bar, batch):
        lab = self._labelled(batch, y_bar.dtype)
        accuracy = 1 - hamming_loss(y_bar, self.gold(batch).to(y_bar.dtype), batch["lengths"], normalize=True)
        with torch.no_grad():
            rule_value = value(batch["cues"], y_bar.argmax(-1), self._token_mask(batch)).to(y_bar.dtype)
        return (lab * accuracy.clamp(0, 1) + (1 - lab) * rule_value).clamp(0, 1)

    def primary_loss(self, batch, y_bar):
        if self.primary == "cd":
            return self.reward_cd(batch, self.negatives(y_bar, batch)).mean()
        return super().primary_loss(batch, y_bar)  # dvn, with value_target above

    @torch.no_grad()
    def evaluate(self, data: dict[str, torch.Tensor], batch_size: int | None = None) -> dict[str, float]:
        """The base class's token accuracy (``acc``, ``token_acc``) and ``infer_seconds``, and ``author_share``: the
        percentage of the real tokens predicted author (the field a reward-ranked drift fills; issue #33)."""
        pred, seconds = self.predict_tags(data, batch_size)
        mask = length_mask(data["lengths"], data["y"].shape[1], data["y"].device)
        n = max(int(mask.sum()), 1)
        token_acc = 100 * float(((pred == data["y"]) & mask).sum()) / n
        author = 100 * float(((pred == FIELDS.index("author")) & mask).sum()) / n
        return {"acc": token_acc, "token_acc": token_acc, "author_share": author, "infer_seconds": seconds}

    # ----------------------------------------------------------------------------------------------- train
    def forward(self, batch: dict[str, torch.Tensor]) -> EnergyOutput:
        batch = self.trim(batch)
        if self._pretraining and self.method != "mbce":
            return super().forward(batch)
        lab = self._labelled(batch, torch.get_default_dtype())
        if self.method == "crf":
            return EnergyOutput((self.crf_nll(batch) * lab).sum() / lab.sum().clamp_min(1))
        if self.method == "mbce":
            logits = self.infnet.logits(batch["x"], batch["lengths"], self._extra(batch))
            loss = F.cross_entropy(logits.transpose(1, 2), batch["y"], ignore_index=-100, reduction="sum")
            loss = loss / lab.sum().clamp_min(1)  # the summed token cross-entropy per labelled citation, as L_MLE
            if self.ge_weight:
                probs = torch.softmax(logits, -1) * self._mask(batch, logits.dtype)
                loss = loss + self.ge_weight * self.ge_loss(batch, probs)
            return EnergyOutput(loss)
        if self.method == "spen":
            y_bar = self.spen_inference(batch, augmented=True)
            gold = self.gold(batch).to(y_bar.dtype)
            energies = self.energy(batch, torch.stack([y_bar, gold]))
            hinge = ssvm_loss(energies[0], energies[1], self.cost(y_bar, batch), reduction="none")
            samples = categorical_samples(y_bar, self.num_samples)
            ranked = self.reward_cd(batch, samples, gold)
            return EnergyOutput((lab * hinge + (1 - lab) * ranked).mean())
        return super().forward(batch)
