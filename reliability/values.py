"""Out-of-range settings (issue #20): each one is refused when the command line is checked, before Hydra composes
the run and before any data is read, in one line naming the key, the value and the range.

:data:`CASES` lists them (an experiment or None for the default run, the override, what it breaks); :func:`check`
runs one through :func:`latentstruct.config.check_command_line`, the check of ``python -m latentstruct.train``, and
classifies what it does: ``clear`` (a :class:`~latentstruct.config.ConfigError` of one line naming the key),
``unclear`` (anything else raised) or ``accepted`` (nothing raised: the run would start). :func:`run` checks them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from latentstruct.config import ConfigError, check_command_line

__all__ = ["CASES", "Case", "Outcome", "check", "run"]

#: (experiment or None for the default run, override, what it breaks)
Case = tuple[str | None, str, str]

CASES: list[Case] = [
    # the default run: synthetic clusters, SPIGOT, Adam
    (None, "optim.lr=-1e-3", "a negative learning rate"),
    (None, "optim.lr=0", "a zero learning rate"),
    (None, "optim.weight_decay=-0.01", "a negative weight decay"),
    (None, "task.estimator.eta=0", "SPIGOT's step size η = 0"),
    (None, "task.estimator.eta=-1", "a negative η"),
    (None, "task.estimator.steps=0", "k = 0 inner pull-back steps"),
    (None, "dataset.noise=-0.1", "a negative noise σ of the data"),
    (None, "dataset.num_clusters=0", "a latent of size 0"),
    (None, "dataset.n_train=0", "no training examples"),
    (None, "trainer.batch_size=0", "batches of 0 examples"),
    (None, "trainer.max_steps=0", "0 optimizer steps"),
    (None, "trainer.max_epochs=0", "0 epochs"),
    (None, "trainer.eval_every=0", "evaluating every 0 steps"),
    (None, "trainer.log_every=0", "logging every 0 steps"),
    (None, "trainer.checkpoint_every=-5", "a negative checkpoint interval"),
    (None, "trainer.checkpoint_seconds=-60", "a negative checkpoint period"),
    (None, "trainer.log_seconds=-1", "a negative logging interval"),
    (None, "trainer.threads=0", "0 CPU threads"),
    (None, "embedding.dim=0", "word vectors of size 0"),
    # relaxations and their temperatures
    ("synthetic_gumbel_softmax", "task.estimator.tau=0", "Gumbel-softmax at τ = 0"),
    ("synthetic_st_gumbel", "task.estimator.tau=-1", "straight-through Gumbel at a negative τ"),
    ("sst_perturb_and_map", "task.estimator.tau=0", "perturb-and-MAP at τ = 0"),
    ("listops_gumbel_tree", "task.estimator.tau=-0.5", "the Gumbel tree parser at a negative τ"),
    ("knn_neuralsort", "task.estimator.tau=0", "NeuralSort at τ = 0"),
    ("knn_neuralsort_stochastic", "task.estimator.samples=0", "stochastic NeuralSort with 0 samples"),
    # SparseMAP, SPIGOT
    ("sst_sparsemap", "task.structure.sparsemap_max_iter=0", "SparseMAP stopped after 0 iterations"),
    ("snli_spigot_eg", "task.estimator.eta=-0.1", "SPIGOT-EG with a negative η"),
    # direct loss minimisation
    ("knn_direct_sigma1", "task.estimator.sigma=-1", "direct loss with a negative noise scale σ"),
    ("knn_direct_sigma1", "task.estimator.epsilon=0", "direct loss with ε = 0 (its gradient divides by ε)"),
    ("knn_direct_sigma1", "task.k=0", "k = 0 neighbours"),
    ("sorting_direct_sigma0", "task.estimator.grow=1", "an ε that grows by a factor 1"),
    ("sorting_direct_learned", "task.estimator.samples=0", "0 noise draws per example"),
    ("sorting_gumbel_sinkhorn", "task.sinkhorn_iters=0", "0 Sinkhorn rounds"),
    ("vae_direct", "task.anneal_floor=0", "an annealed |ε| that may reach 0"),
    ("vae_direct", "dataset.n_labelled=-100", "a negative number of labelled images"),
    # probabilities and sizes of the models
    ("sst_spigot", "task.encoder.dropout=1.5", "a dropout probability 1.5"),
    ("snli_spigot", "task.decoder.dropout=-0.1", "a dropout probability -0.1"),
    ("sst_spigot", "task.encoder.hidden=0", "a BiLSTM of size 0"),
    ("sst_spigot", "dataset.subset=-5", "a negative training subset"),
    ("listops_chart_sparsemap", "task.span_hidden=0", "a span layer of size 0"),
    ("listops_ppo", "task.estimator.clip=1", "PPO's clipping ε = 1"),
    ("listops_reinforce", "task.estimator.decay=1", "a moving-average baseline that never moves (decay 1)"),
    # energy models
    ("mlc_cd", "task.lam=-1", "a negative λ"),
    ("mlc_cd", "task.inner_lr=0", "a zero inner learning rate"),
    ("mlc_cd", "task.num_samples=0", "contrastive divergence with 0 negatives"),
    ("mlc_cd", "task.energy.global_hidden=0", "a global energy of size 0"),
    ("mlc_cd", "task.energy.feature_hidden=[150,0]", "a feature layer of size 0 (a list item)"),
    ("mlc_spen", "task.spen_lr=-0.1", "SPEN inference with a negative step"),
    ("ner_cd", "task.encoder.dropout=1.5", "the NER features' dropout 1.5"),
    ("mlc_cd", "dataset.sizes=[100,-1,50]", "a negative split size"),
]


@dataclass(frozen=True)
class Outcome:
    """What :func:`check` saw: ``clear`` (refused in one line naming the key), ``unclear`` (refused otherwise) or
    ``accepted`` (not refused); ``message``: the error's text (empty when accepted)."""

    case: Case
    verdict: Literal["clear", "unclear", "accepted"]
    message: str


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def check(case: Case) -> Outcome:
    """Check ``case``'s command line (``+experiment=<name>`` and its override) as ``python -m latentstruct.train``
    does before Hydra runs."""
    experiment, override, _ = case
    args = [f"+experiment={experiment}", override] if experiment else [override]
    try:
        check_command_line(args)
    except ConfigError as err:
        message = str(err)
        clear = "\n" not in message.strip() and _key(override) in message
        return Outcome(case, "clear" if clear else "unclear", message)
    except Exception as err:  # noqa: BLE001  (what the suite reports as unclear)
        return Outcome(case, "unclear", f"{type(err).__name__}: {err}")
    return Outcome(case, "accepted", "")


def run() -> list[Outcome]:
    """:func:`check` of every case of :data:`CASES`."""
    return [check(case) for case in CASES]
