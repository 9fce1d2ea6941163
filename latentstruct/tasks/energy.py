r"""Energy-based structured prediction trained as a bi-level problem with implicit gradients (seed 004), and its
baselines.

:class:`BilevelEnergyTask` writes the training procedures once over a few hooks (the energy of (x, ȳ), the inference
network's relaxed output and its MLE loss, the task cost Δ, negative samples, SPEN's start and projection);
:class:`MultiLabelEnergy` fills them in for multi-label classification (x ``[B, D]``, y ``[B, L]`` in {0, 1}). Its
parts: ``task.energy`` (E_φ; **lower is better**), ``task.infnet`` (A_θ) and, for InfNet, ``task.cost_net`` (F). The
method is ``task.method`` (:data:`METHODS`: ``mbce``, ``implicit`` and ``explicit`` with ``task.primary`` ∈
:data:`PRIMARY_LOSSES`, ``infnet``, ``spen``); φ is stepped by ``optim``, θ inside ``forward`` by the task's own
inference optimizer (``task.inner_optimizer``, ``task.inner_lr``), whose state is in every checkpoint. The implicit
gradient's solver (``task.inverse_solver``: ``minres``, ``cg`` or ``neumann``, the seed's series) and Hessian-vector
products (``task.hvp``) are :mod:`latentstruct.models.implicit`'s.

Metrics (``evaluate_splits``): ``acc`` = ``f1``, the example-F1 (×100) at the threshold chosen on ``valid``.

    python -m latentstruct.train +experiment=mlc_cd dataset=bibtex

Every method's loss and gradient, the pretraining phases and the evaluation: docs/tasks.md#energy; the networks:
docs/models.md#energy; the solvers: docs/implicit_gradient.md.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from latentstruct.data.base import iterate_batches
from latentstruct.data.mlc import DEFAULT_THRESHOLDS, best_threshold, f1_at_threshold
from latentstruct.models.energy import (
    auxiliary_loss,
    bernoulli_samples,
    cd_loss,
    dvn_loss,
    multilabel_nll,
    soft_f1_loss,
    ssvm_loss,
)
from latentstruct.models.implicit import (
    HVPS,
    SOLVERS,
    cg_inverse_hvp,
    grad_or_zeros,
    implicit_gradient,
    minres_inverse_hvp,
    neumann_inverse_hvp,
)
from latentstruct.ranges import AtLeast, NonNegative, Part, Positive
from latentstruct.tasks.base import Task

__all__ = ["METHODS", "PRIMARY_LOSSES", "BilevelEnergyTask", "EnergyOutput", "MultiLabelEnergy"]

Method = Literal["mbce", "implicit", "explicit", "infnet", "spen"]
Primary = Literal["ssvm", "cd", "dvn"]
InnerOptimizer = Literal["sgd", "adam"]
InverseSolver = Literal["neumann", "cg", "minres"]  # latentstruct.models.implicit.SOLVERS
HVP = Literal["double_backward", "forward_over_reverse"]  # latentstruct.models.implicit.HVPS
METHODS: tuple[str, ...] = get_args(Method)
PRIMARY_LOSSES: tuple[str, ...] = get_args(Primary)
INNER_OPTIMIZERS: tuple[str, ...] = get_args(InnerOptimizer)


@dataclass
class EnergyOutput:
    loss: torch.Tensor  # scalar for train.py: its value and its φ-gradient are those of docs/tasks.md#energy
    primary: torch.Tensor | None = None  # detached: L_prim (implicit, explicit), the eq. 5 objective (infnet)
    aux: torch.Tensor | None = None  # detached: L_aux after the inner steps (implicit, explicit)


def _with_gradient(value: torch.Tensor, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """A scalar equal to ``value`` whose gradient w.r.t. ``params`` is ``grads`` (and nothing else)."""
    dot = sum((p * g.detach()).sum() for p, g in zip(params, grads, strict=True))
    return value.detach() + (dot - dot.detach())  # the bracket is exactly 0: the value is value's, bit for bit


class _AuxLoss(nn.Module):
    """A task's L_aux on a batch as a module's forward (``torch.func.functional_call`` substitutes parameters of a
    module's forward only); built per step, never stored on the task."""

    def __init__(self, task: BilevelEnergyTask) -> None:
        super().__init__()
        self.task = task

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.task.aux_loss(batch)


class BilevelEnergyTask(Task):
    """The training procedures (docs/tasks.md#energy) over abstract hooks; subclasses supply the networks (from
    their parts, in :meth:`~latentstruct.tasks.Task.build`) and the hooks (:class:`MultiLabelEnergy`). The networks
    are ``energy_net`` E_φ (None for ``mbce``), ``infnet`` A_θ (None for ``spen``) and ``cost_net`` F (``infnet``
    only); ``pretrain``: phase 0 of ``trainer.phases`` pretrains (docs/tasks.md#energy). The settings, shared by the
    subclasses' ``build``:

    Args:
        method: mbce (the inference network A alone), implicit (seed 004 Algorithm 1), explicit (the same loop, φ
            with ∂L_prim/∂φ only), infnet (Tu & Gimpel 2018, eq. 5), spen (Belanger & McCallum 2016, SSVM).
        primary: implicit / explicit: the primary loss L_prim, ssvm, cd or dvn.
        lam: λ of eq. 6 (L_aux = L_MLE + λ E(x, A(x))) and of eq. 5 (infnet); our choice.
        inner_steps: T_inner: inner steps on θ per batch (Algorithm 1); our choice.
        inner_optimizer: the inference networks' optimizer (inner steps, pretraining, InfNet ascent): sgd
            (Algorithm 1's plain steps) or adam.
        inner_lr: its learning rate; our choice.
        neumann_terms: implicit, inverse_solver=neumann: terms of the von Neumann series for H⁻¹ (Appendix A; not
            given); our choice: on bibtex 20 terms reach ~2/3 of the series' limit.
        neumann_alpha: implicit: its step α (Lorraine et al. 2020; not given); our choice: α λ_max ≈ 0.6 for H's
            largest eigenvalue measured on bibtex (~125), λ_max ≤ 215 on CoNLL (configs/task/ner_energy.yaml); the
            series diverges when α λ_max > 2.
        num_samples: cd: K negatives drawn from A(x) (not given by the seed); our choice.
        straight_through: cd: straight-through gradient of the samples to θ (without it ∂L_CD/∂θ = 0 and implicit =
            explicit; the seed does not say).
        infnet_ce: infnet: weight of the inference networks' MLE loss in their ascent (InfNet+'s +CE).
        spen_steps: spen: projected gradient steps of (loss-augmented) inference; our choice.
        spen_lr: spen: their step size; our choice.
        inverse_solver: implicit: how H⁻¹ ∂L_prim/∂θ is computed: neumann (the seed's series: neumann_terms,
            neumann_alpha), minres (MINRES on (H + solver_damping I) w = ∂L_prim/∂θ: H need not be positive
            definite) or cg (conjugate gradient on the same system; stops at a non-positive curvature);
            latentstruct.models.implicit. Our choice, minres: H is indefinite on the energy tasks, and MINRES
            reaches the residual of the series' 20 terms in fewer products (results/bench/implicit.md; later in
            training too, results/bench/implicit_trained.md).
        solver_tol: minres, cg: stop when the residual is at most solver_tol × ‖∂L_prim/∂θ‖; our choice: 0.2,
            about the residual the seed's series reaches with 20 terms and α = 5e-3 early in training
            (results/bench/implicit.md); later the series reaches only 0.17-0.43 on NER and 0.2 costs up to 18
            products (results/bench/implicit_trained.md; docs/implicit_gradient.md).
        solver_max_iter: minres, cg: at most this many Hessian-vector products.
        solver_damping: minres, cg: μ ≥ 0 added to H's diagonal (0: the seed's system).
        hvp: implicit: how the solver's Hessian-vector products (and the mixed product) are made: double_backward
            (one create_graph backward of L_aux per step, then one backward through its graph per product) or
            forward_over_reverse (per product, L_aux re-evaluated with θ as forward-mode dual numbers and
            differentiated once; no dropout allowed: the re-evaluation must equal the first); the same gradient up
            to round-off. Our choice, double_backward: faster on CPU on every configuration measured
            (results/bench/implicit.md).
        phases: the number of ``trainer.phases``, which the task's option copies here (``${len:${trainer.phases}}``):
            none, or two (phase 0 pretrains, then the method).
    """

    #: the parts (task.energy, task.infnet, task.cost_net) that hold the networks (energy_net, infnet, cost_net)
    NETWORK_PARTS = ("energy", "infnet", "cost_net")
    #: the methods a task accepts; a subclass may add its own (and handle them in :meth:`forward`)
    METHODS: tuple[str, ...] = METHODS
    #: which of (energy_net, infnet, cost_net) each method needs
    NETWORKS: dict[str, tuple[bool, bool, bool]] = {
        "mbce": (False, True, False), "implicit": (True, True, False), "explicit": (True, True, False),
        "infnet": (True, True, True), "spen": (True, False, False)}

    def __init__(
        self,
        energy_net: nn.Module | None,
        infnet: nn.Module | None,
        cost_net: nn.Module | None,
        *,
        method: str,
        primary: str,
        lam: float,
        inner_steps: int,
        inner_optimizer: str,
        inner_lr: float,
        neumann_terms: int,
        neumann_alpha: float,
        num_samples: int,
        straight_through: bool,
        infnet_ce: float,
        spen_steps: int,
        spen_lr: float,
        pretrain: bool = False,
        inverse_solver: str = "minres",
        solver_tol: float = 0.2,
        solver_max_iter: int = 20,
        solver_damping: float = 0.0,
        hvp: str = "double_backward",
    ):
        super().__init__()
        if method not in self.METHODS:
            raise ValueError(f"method must be one of {self.METHODS}, got {method!r}")
        if primary not in PRIMARY_LOSSES:
            raise ValueError(f"primary must be one of {PRIMARY_LOSSES}, got {primary!r}")
        if inner_optimizer not in INNER_OPTIMIZERS:
            raise ValueError(f"inner_optimizer must be one of {INNER_OPTIMIZERS}, got {inner_optimizer!r}")
        if inverse_solver not in SOLVERS:
            raise ValueError(f"inverse_solver must be one of {SOLVERS}, got {inverse_solver!r}")
        if solver_tol < 0 or solver_max_iter < 0 or solver_damping < 0:
            raise ValueError("need solver_tol, solver_max_iter, solver_damping >= 0")
        if hvp not in HVPS:
            raise ValueError(f"hvp must be one of {HVPS}, got {hvp!r}")
        if inner_steps < 0 or neumann_terms < 0 or num_samples < 1 or spen_steps < 0:
            raise ValueError("need inner_steps, neumann_terms, spen_steps >= 0 and num_samples >= 1")
        if not (inner_lr > 0 and neumann_alpha > 0 and spen_lr > 0 and lam >= 0 and infnet_ce >= 0):
            raise ValueError("need inner_lr, neumann_alpha, spen_lr > 0 and lam, infnet_ce >= 0")
        needs = self.NETWORKS[method]
        for part, module, needed in zip(self.NETWORK_PARTS, (energy_net, infnet, cost_net), needs, strict=True):
            if (module is not None) != needed:
                what = f"needs the network {part} (a {part}=<option>)" if needed else f"builds no {part} ({part}=null)"
                raise ValueError(f"method={method} {what}")
        self.energy_net, self.infnet, self.cost_net = energy_net, infnet, cost_net
        self.method, self.primary = method, primary
        self.lam, self.inner_steps = float(lam), int(inner_steps)
        self.neumann_terms, self.neumann_alpha = int(neumann_terms), float(neumann_alpha)
        self.num_samples, self.straight_through = int(num_samples), bool(straight_through)
        self.infnet_ce = float(infnet_ce)
        self.spen_steps, self.spen_lr = int(spen_steps), float(spen_lr)
        self.inverse_solver = inverse_solver
        self.solver_tol, self.solver_max_iter = float(solver_tol), int(solver_max_iter)
        self.solver_damping = float(solver_damping)
        self.hvp = hvp
        self._clock: dict[str, float] = {}  # seconds in the implicit term, this process (timings)
        self._products = 0  # the solver's Hessian-vector products, this process (counts)
        self.pretrain = bool(pretrain)
        self._pretraining = False
        theta = self.inference_parameters()
        self._inner_opt: torch.optim.Optimizer | None = None
        if theta and method != "mbce":  # mbce's A is train.py's `default` group
            opt = torch.optim.SGD if inner_optimizer == "sgd" else torch.optim.Adam
            self._inner_opt = opt(theta, lr=inner_lr)

    # ---------------------------------------------------------------------------------------------- hooks
    def energy(self, batch: dict[str, torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        """E_φ(x, y) ``[*, B]`` for relaxed outputs y ``[*, B, ...]`` (leading sample dimensions share x)."""
        raise NotImplementedError

    def inference(self, net: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(net's relaxed output ȳ ``[B, ...]``, its MLE loss L_MLE(y, ȳ) ``[B]``) from one forward pass."""
        raise NotImplementedError

    def cost(self, y_bar: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The task cost Δ(ȳ, y) ``[*, B]``, differentiable in ȳ, ≥ 0, Δ(y, y) = 0 (in [0, 1] unless
        :meth:`value_target` is overridden)."""
        raise NotImplementedError

    def negatives(self, probs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``num_samples`` negatives drawn from the relaxed output ``probs`` ``[K, B, ...]`` (straight-through
        gradient when ``straight_through``)."""
        raise NotImplementedError

    def gold(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The gold output y ``[B, ...]`` in the relaxed output's encoding."""
        raise NotImplementedError

    def value_target(self, y_bar: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """DVN's regression target, a task score in [0, 1] ``[*, B]``: 1 − Δ(ȳ, y) by default (a task whose Δ is not
        in [0, 1], e.g. an unnormalised Hamming loss, returns its own normalised score)."""
        return (1 - self.cost(y_bar, batch)).clamp(0, 1)  # clamp: rounding must not leave [0, 1]

    def energy_pretrain_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[B]``: the independent (local) MLE loss that pretrains the energy's feature network."""
        raise NotImplementedError

    def spen_start(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """SPEN's starting point ȳ₀ ``[B, ...]`` (detached)."""
        raise NotImplementedError

    def project(self, y: torch.Tensor) -> torch.Tensor:
        """Projection onto the relaxed output set (SPEN's projected gradient)."""
        raise NotImplementedError

    def with_energy_features(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``batch`` carrying what every :meth:`energy` of one training step may share, computed once with φ's graph
        (φ does not move within a step): nothing here; a task whose energy reads x through a feature network of its
        own adds the features. Used where φ's graph is differentiated once a step (``infnet``, ``explicit``); the
        implicit gradient differentiates L_prim's and L_aux's energies separately, each on its own features."""
        return batch

    # ------------------------------------------------------------------------------------------ interface
    def energy_parameters(self) -> list[nn.Parameter]:
        """φ."""
        return [] if self.energy_net is None else list(self.energy_net.parameters())

    def inference_parameters(self) -> list[nn.Parameter]:
        """θ: A's, then F's (``infnet``)."""
        return [p for m in (self.infnet, self.cost_net) if m is not None for p in m.parameters()]

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """φ only (A for ``mbce``): θ is stepped by the task's own optimizer."""
        return {"default": self.inference_parameters() if self.method == "mbce" else self.energy_parameters()}

    @staticmethod
    def pretrains(phases: int) -> bool:
        """Whether phase 0 pretrains, from the number of ``trainer.phases``: none, or two (pretraining, then the
        method)."""
        if phases > 2:
            raise ValueError(f"the energy tasks take no trainer.phases, or two (pretraining, then the method); got "
                             f"{phases}")
        return phases == 2

    def begin_step(self, phase: int, step: int) -> None:
        self._pretraining = self.pretrain and phase == 0

    def get_extra_state(self) -> dict[str, Any]:
        """The inference optimizer's state (θ's Adam moments), so that a resumed run continues exactly."""
        return {} if self._inner_opt is None else {"inner_optimizer": copy.deepcopy(self._inner_opt.state_dict())}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        if self._inner_opt is not None:
            self._inner_opt.load_state_dict(state["inner_optimizer"])

    # ----------------------------------------------------------------------------------------- training
    def _step_theta(self, loss: torch.Tensor) -> None:
        """One step of the inference optimizer on θ with ∇_θ loss (no gradient is left on φ or θ)."""
        theta = self.inference_parameters()
        grads = torch.autograd.grad(loss, theta, allow_unused=True)
        for p, g in zip(theta, grads, strict=True):
            p.grad = g
        self._inner_opt.step()
        for p in theta:
            p.grad = None

    @property
    def _krylov(self) -> bool:
        """Whether ``inverse_solver`` is a Krylov solver (a system solved to a tolerance, not the series)."""
        return self.inverse_solver in ("cg", "minres")

    def inverse_hvp(self, history: list[float] | None = None):
        """The ``(∇_θ L_aux, θ, v) -> H⁻¹ v`` solver of ``inverse_solver`` with the task's settings (``history``: the
        solver's relative residuals, for the benchmark)."""
        if self._krylov:
            solver = cg_inverse_hvp if self.inverse_solver == "cg" else minres_inverse_hvp
            return functools.partial(solver, tol=self.solver_tol, max_iter=self.solver_max_iter,
                                     damping=self.solver_damping, history=history)
        return functools.partial(neumann_inverse_hvp, terms=self.neumann_terms, alpha=self.neumann_alpha,
                                 history=history)

    def timings(self) -> dict[str, float]:
        """``implicit``: the seconds spent so far on the implicit term (``implicit`` method only: after L_prim's
        backward, ∇_θ L_aux, the solver and the mixed product; :func:`implicit_gradient`'s ``clock``)."""
        return {"implicit": self._clock.get("implicit", 0.0)} if self.method == "implicit" else {}

    def counts(self) -> dict[str, int]:
        """``hvp``: the solver's Hessian-vector products so far (``implicit`` method only; the series makes
        ``neumann_terms`` a step, MINRES and CG as many as their stopping rule takes; the setup and the mixed product
        are not counted)."""
        return {"hvp": self._products} if self.method == "implicit" else {}

    def double_backward_context(self, batch: dict[str, torch.Tensor]):
        """The context a forward pass needs when it is differentiated twice (the implicit gradient's H v): none here;
        a task whose networks lack a second derivative on some backend says what to switch off."""
        return contextlib.nullcontext()

    def aux_function(self, batch: dict[str, torch.Tensor]):
        """L_aux on ``batch`` (:meth:`aux_loss`) as a function of θ's values, ``values -> L_aux`` (θ in
        :meth:`inference_parameters` order, substituted by ``torch.func.functional_call``; φ the module's own): the
        forward-over-reverse products' function. Refused with an active dropout (a re-evaluation would draw another
        mask: its products would not be those of the step's L_aux)."""
        dropping = [m for m in self.modules() if isinstance(m, nn.Dropout) and m.p > 0 and m.training]
        if dropping:
            raise ValueError("hvp=forward_over_reverse re-evaluates L_aux for every product, and the networks draw "
                             f"dropout masks ({dropping[0]}): use hvp=double_backward or no dropout")
        call = _AuxLoss(self)
        index = {id(p): name for name, p in call.named_parameters()}
        names = [index[id(p)] for p in self.inference_parameters()]

        def aux_fn(values):
            return torch.func.functional_call(call, dict(zip(names, values, strict=True)), (batch,))

        return aux_fn

    def aux_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Eq. 6 at the current (θ, φ), batch mean."""
        y_bar, nll = self.inference(self.infnet, batch)
        return auxiliary_loss(nll, self.energy(batch, y_bar), self.lam)

    def primary_loss(self, batch: dict[str, torch.Tensor], y_bar: torch.Tensor) -> torch.Tensor:
        """L_prim (``primary``) with ȳ as given (attached or not: the caller decides), batch mean."""
        gold = self.gold(batch).to(y_bar.dtype)
        if self.primary == "cd":
            neg = self.negatives(y_bar, batch)
            energies = self.energy(batch, torch.cat([gold.unsqueeze(0), neg]))  # one feature pass
            return cd_loss(energies[0], energies[1:], self.cost(neg, batch))
        energies = self.energy(batch, torch.stack([y_bar, gold]))
        if self.primary == "ssvm":
            return ssvm_loss(energies[0], energies[1], self.cost(y_bar, batch))
        return dvn_loss(energies[0], self.value_target(y_bar, batch))

    def inference_objective(
        self, batch: dict[str, torch.Tensor], outputs: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """The eq. 5 objective (``infnet``), batch mean, at ``outputs`` = (F(x), A(x)) (default: computed here)."""
        if outputs is None:
            outputs = (self.inference(self.cost_net, batch)[0], self.inference(self.infnet, batch)[0])
        f_out, a_out = outputs
        gold = self.gold(batch).to(a_out.dtype)
        e_f, e_a, e_gold = self.energy(batch, torch.stack([f_out, a_out, gold]))
        return (F.relu(self.cost(f_out, batch) - e_f + e_gold) + self.lam * F.relu(-e_a + e_gold)).mean()

    def infnet_ascent_step(self, batch: dict[str, torch.Tensor]) -> None:
        """One step of the inference optimizer raising the eq. 5 objective (+ ``infnet_ce`` × MLE, lowered), from one
        forward pass of F and of A."""
        (f_out, f_nll), (a_out, a_nll) = self.inference(self.cost_net, batch), self.inference(self.infnet, batch)
        loss = -self.inference_objective(batch, (f_out, a_out))
        if self.infnet_ce:
            loss = loss + self.infnet_ce * (f_nll + a_nll).mean()
        self._step_theta(loss)

    def spen_inference(self, batch: dict[str, torch.Tensor], augmented: bool = False) -> torch.Tensor:
        """``spen_steps`` projected gradient steps on E(x, ȳ) (− Δ(ȳ, y) when ``augmented``) from
        :meth:`spen_start`; returns ȳ detached. Leaves no gradient on the parameters."""
        y = self.spen_start(batch)
        with torch.enable_grad():
            for _ in range(self.spen_steps):
                y = y.detach().requires_grad_(True)
                objective = self.energy(batch, y)
                if augmented:
                    objective = objective - self.cost(y, batch)
                (grad,) = torch.autograd.grad(objective.sum(), y)  # examples are independent: per-example ∇
                y = self.project(y - self.spen_lr * grad)
        return y.detach()

    def _pretrain_step(self, batch: dict[str, torch.Tensor]) -> EnergyOutput:
        if self._inner_opt is not None:
            nll = sum(self.inference(net, batch)[1].mean() for net in (self.infnet, self.cost_net) if net is not None)
            self._step_theta(nll)
        return EnergyOutput(self.energy_pretrain_loss(batch).mean())

    def _bilevel_step(self, batch: dict[str, torch.Tensor]) -> EnergyOutput:
        if self.method == "explicit":  # one pass of E's features for the step (with_energy_features)
            batch = self.with_energy_features(batch)
        for _ in range(self.inner_steps):
            self._step_theta(self.aux_loss(batch))
        theta, phi = self.inference_parameters(), self.energy_parameters()
        y_bar, nll = self.inference(self.infnet, batch)
        prim = self.primary_loss(batch, y_bar)
        aux = auxiliary_loss(nll, self.energy(batch, y_bar), self.lam)
        if self.method == "implicit":
            aux_fn = self.aux_function(batch) if self.hvp == "forward_over_reverse" else None
            residuals: list[float] = []  # one per product (the Krylov solvers compute them anyway)
            grads = implicit_gradient(prim, aux, theta, phi, terms=self.neumann_terms, alpha=self.neumann_alpha,
                                      inverse_hvp=self.inverse_hvp(residuals if self._krylov else None),
                                      aux_fn=aux_fn, clock=self._clock)
            self._products += len(residuals) if self._krylov else self.neumann_terms
        else:
            grads = [g.detach() for g in grad_or_zeros(prim, phi)]
        return EnergyOutput(_with_gradient(prim, phi, grads), prim.detach(), aux.detach())

    def forward(self, batch: dict[str, torch.Tensor]) -> EnergyOutput:
        if self.method == "mbce":
            return EnergyOutput(self.inference(self.infnet, batch)[1].mean())
        if self._pretraining:
            return self._pretrain_step(batch)
        if self.method in ("implicit", "explicit"):
            return self._bilevel_step(batch)
        if self.method == "infnet":  # Tu & Gimpel's alternation: θ ascends, then φ descends at θ's new outputs
            batch = self.with_energy_features(batch)
            self.infnet_ascent_step(batch)
            with torch.no_grad():
                outputs = (self.inference(self.cost_net, batch)[0], self.inference(self.infnet, batch)[0])
            objective = self.inference_objective(batch, outputs)
            return EnergyOutput(objective, objective.detach())
        # spen
        y_bar = self.spen_inference(batch, augmented=True)
        gold = self.gold(batch).to(y_bar.dtype)
        energies = self.energy(batch, torch.stack([y_bar, gold]))
        return EnergyOutput(ssvm_loss(energies[0], energies[1], self.cost(y_bar, batch)))

    # ---------------------------------------------------------------------------------------- prediction
    def predict(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The relaxed prediction ``[B, ...]``: SPEN's inference, else A(x)."""
        if self.method == "spen":
            return self.spen_inference(batch)
        return self.inference(self.infnet, batch)[0]

    @torch.no_grad()
    def predict_split(self, data: dict[str, torch.Tensor], batch_size: int | None = None) -> tuple[torch.Tensor, float]:
        """(:meth:`predict` over a whole split, the wall seconds it took), in eval mode."""
        was_training = self.training
        self.eval()
        start = time.perf_counter()
        preds = torch.cat([self.predict(batch) for batch in iterate_batches(data, batch_size or 1000)])
        seconds = time.perf_counter() - start
        self.train(was_training)
        return preds, seconds


class MultiLabelEnergy(BilevelEnergyTask):
    """Multi-label classification (seed 004 Table 1): E = :class:`MLCEnergy` (``energy=mlc_energy``), A and F =
    :class:`MLCInferenceNet` (``infnet`` / ``cost_net=mlc_inference_net``); Δ = soft F1 loss; negatives = Bernoulli
    draws of A(x). Batches hold ``x`` ``[B, input_dim]`` and ``y`` ``[B, num_labels]`` in {0, 1}
    (:func:`~latentstruct.data.mlc.mlc_dataset`); ``thresholds``: the candidates of the threshold chosen on valid.
    The networks and the settings: :class:`BilevelEnergyTask`."""

    def __init__(
        self,
        energy_net: nn.Module | None,
        infnet: nn.Module | None,
        cost_net: nn.Module | None = None,
        thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
        **settings: Any,
    ):
        super().__init__(energy_net, infnet, cost_net, **settings)
        self.thresholds = tuple(float(t) for t in thresholds)

    @classmethod
    def build(
        cls,
        dims: dict[str, int],
        extras: dict[str, Any],
        energy: Annotated[Any, Part()],
        infnet: Annotated[Any, Part()],
        cost_net: Annotated[Any, Part()],
        method: Method = "implicit",
        primary: Primary = "cd",
        lam: Annotated[float, NonNegative] = 1.0,
        inner_steps: Annotated[int, NonNegative] = 1,
        inner_optimizer: InnerOptimizer = "adam",
        inner_lr: Annotated[float, Positive] = 1e-3,
        neumann_terms: Annotated[int, NonNegative] = 20,
        neumann_alpha: Annotated[float, Positive] = 5e-3,
        num_samples: Annotated[int, AtLeast(1)] = 10,
        straight_through: bool = True,
        infnet_ce: Annotated[float, NonNegative] = 0.0,
        spen_steps: Annotated[int, NonNegative] = 10,
        spen_lr: Annotated[float, Positive] = 0.1,
        phases: int = 0,
        inverse_solver: InverseSolver = "minres",
        solver_tol: Annotated[float, NonNegative] = 0.2,
        solver_max_iter: Annotated[int, NonNegative] = 20,
        solver_damping: Annotated[float, NonNegative] = 0.0,
        hvp: HVP = "double_backward",
    ) -> MultiLabelEnergy:
        """E, A, F in this order (the order of their initial draws), sized by the data (``input_dim``,
        ``num_labels``: ``dataset=bibtex|delicious|eurlex|bookmarks``)."""
        if "input_dim" not in dims or "num_labels" not in dims:
            raise ValueError("task=mlc_energy needs a multi-label dataset (dataset=bibtex, delicious, ...)")
        sizes = {"input_dim": dims["input_dim"], "num_labels": dims["num_labels"]}
        nets = [None if part is None else part(**sizes) for part in (energy, infnet, cost_net)]
        return cls(
            *nets, method=method, primary=primary, lam=lam, inner_steps=inner_steps, inner_optimizer=inner_optimizer,
            inner_lr=inner_lr, neumann_terms=neumann_terms, neumann_alpha=neumann_alpha, num_samples=num_samples,
            straight_through=straight_through, infnet_ce=infnet_ce, spen_steps=spen_steps, spen_lr=spen_lr,
            pretrain=cls.pretrains(phases), inverse_solver=inverse_solver, solver_tol=solver_tol,
            solver_max_iter=solver_max_iter, solver_damping=solver_damping, hvp=hvp,
        )

    # hooks
    def energy(self, batch, y):
        return self.energy_net(batch["x"], y)

    def inference(self, net, batch):
        logits = net.logits(batch["x"])
        return torch.sigmoid(logits), multilabel_nll(logits, batch["y"])

    def cost(self, y_bar, batch):
        return soft_f1_loss(y_bar, batch["y"].to(y_bar.dtype))

    def negatives(self, probs, batch):
        return bernoulli_samples(probs, self.num_samples, straight_through=self.straight_through)

    def gold(self, batch):
        return batch["y"]

    def energy_pretrain_loss(self, batch):
        return multilabel_nll(self.energy_net.local_logits(batch["x"]), batch["y"])

    def spen_start(self, batch):
        return torch.sigmoid(self.energy_net.local_logits(batch["x"])).detach()

    def project(self, y):
        return y.clamp(0, 1)

    # evaluation
    def evaluate_splits(
        self, splits: dict[str, dict[str, torch.Tensor]], batch_size: int | None = None
    ) -> dict[str, dict[str, float]]:
        """Per split: ``f1`` (example-F1 × 100 at the threshold chosen on ``valid``), ``acc`` (the same), ``f1_05``
        (at 0.5), ``threshold``, ``loss`` (MBCE of the predictions), ``infer_seconds``. Without a ``valid`` split
        the threshold is 0.5 (it is never chosen on another split)."""
        preds = {name: self.predict_split(data, batch_size) for name, data in splits.items()}
        threshold = 0.5
        if "valid" in splits:
            threshold, _ = best_threshold(preds["valid"][0], splits["valid"]["y"], self.thresholds)
        out = {}
        for name, (probs, seconds) in preds.items():
            gold = splits[name]["y"]
            eps = 1e-6  # SPEN's outputs can be exactly 0 or 1
            mbce = F.binary_cross_entropy(probs.clamp(eps, 1 - eps), gold.to(probs.dtype), reduction="none").sum(-1)
            f1 = 100 * f1_at_threshold(probs, gold, threshold)
            out[name] = {
                "acc": f1,
                "f1": f1,
                "f1_05": 100 * f1_at_threshold(probs, gold, 0.5),
                "threshold": threshold,
                "loss": float(mbce.mean()),
                "infer_seconds": seconds,
            }
        return out

    def evaluate(self, data: dict[str, torch.Tensor], batch_size: int | None = None) -> dict[str, float]:
        """The metrics of one split with the threshold chosen on that split itself (use :meth:`evaluate_splits`
        for the protocol: threshold chosen on valid)."""
        return self.evaluate_splits({"valid": data}, batch_size)["valid"]
