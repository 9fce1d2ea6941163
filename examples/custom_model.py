"""A custom PyTorch model with a latent dependency tree, trained with SPIGOT and SPIGOT-CE, without Hydra.

The data is generated: sentences of n random word vectors behind a root symbol (position 0); a fixed random bilinear
"teacher" picks each sentence's projective tree, and each word's target is the vector of its head. The model's own
encoder and arc scorer give scores s[b, h, m] for every arc h → m, the estimator turns them into a tree z, and the
decoder predicts each word's target from its head's features Σ_h z[b, h, m] f[b, h]. The loss can only go down if the
scorer learns to find the heads, through the argmax (docs/library.md explains each step).

    python examples/custom_model.py        # about ten seconds on one CPU core
    python examples/custom_model.py --steps 20   # fewer steps (the tests' size)
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from latentstruct.estimators import Spigot, SpigotCe
from latentstruct.structures import ProjectiveDepTree

WORDS, DIM, BATCH = 6, 8, 32


def make_data(n_examples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Word vectors ``x [N, n+1, d]`` (position 0 = the root symbol, the same for every sentence), the teacher's trees
    ``[N, n+1, n+1]`` and the targets ``[N, n+1, d]`` (each word's head vector; the root's row is unused)."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(DIM, DIM, generator=torch.Generator().manual_seed(0))  # the same teacher for every split
    x = torch.randn(n_examples, WORDS + 1, DIM, generator=g)
    x[:, 0] = 1.0
    trees = ProjectiveDepTree().map(x @ teacher @ x.transpose(1, 2))
    return x, trees, torch.einsum("bhm,bhd->bmd", trees, x)


class TreeModel(nn.Module):
    """encoder → arc scores → [estimator ∘ structure] → z → decoder (each word reads its head's features)."""

    def __init__(self, estimator: nn.Module, hidden: int = 32):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(DIM, hidden), nn.Tanh())
        self.arc = nn.Bilinear(hidden, hidden, 1)  # s[b, h, m] = f_h^T U f_m + c
        self.decoder = nn.Linear(hidden, DIM)
        self.structure, self.estimator = ProjectiveDepTree(), estimator

    def scores(self, f: torch.Tensor) -> torch.Tensor:
        n = f.shape[1]
        heads, mods = f.unsqueeze(2).expand(-1, -1, n, -1), f.unsqueeze(1).expand(-1, n, -1, -1)
        return self.arc(heads.contiguous(), mods.contiguous()).squeeze(-1)

    def decode(self, f: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Each word's prediction from its head's features; z may be a tree or any point of the polytope (μ)."""
        return self.decoder(torch.einsum("bhm,bhd->bmd", z, f))

    def loss(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-example loss ``[B]``: the squared error over the words (the root's row is not a word)."""
        return F.mse_loss(pred[:, 1:], target[:, 1:], reduction="none").flatten(1).mean(-1)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        f = self.encoder(x)
        scores = self.scores(f)
        f_detached = f.detach()

        def downstream(mu):
            # The loss at a candidate μ, everything upstream of the scores detached: SPIGOT-CE's inner steps call it.
            return self.loss(self.decode(f_detached, mu), target)

        z = self.estimator(scores, self.structure, None, downstream)
        return self.loss(self.decode(f, z), target).mean()

    @torch.no_grad()
    def head_accuracy(self, x: torch.Tensor, trees: torch.Tensor) -> float:
        """The share of words whose MAP head is the teacher's, ×100."""
        z = self.structure.map(self.scores(self.encoder(x)))
        return 100 * float((z * trees).sum() / (x.shape[0] * WORDS))


def train(estimator: nn.Module, name: str, steps: int) -> None:
    """Adam on mini-batches of 32; prints the test loss and the MAP trees' head accuracy every 20 steps."""
    torch.manual_seed(0)
    x, trees, target = make_data(BATCH * 8, seed=1)
    x_test, trees_test, target_test = make_data(256, seed=2)
    model = TreeModel(estimator)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for step in range(steps + 1):
        if step % 20 == 0:
            model.eval()  # evaluation: the estimators return the MAP tree
            with torch.no_grad():
                test_loss = float(model(x_test, target_test))
            acc = model.head_accuracy(x_test, trees_test)
            losses.append(test_loss)
            print(f"{name:9s} step {step:3d}  test loss {test_loss:.3f}  heads right {acc:5.1f}%")
            model.train()
        batch = slice((step % 8) * BATCH, (step % 8 + 1) * BATCH)
        loss = model(x[batch], target[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"{name}: test loss {losses[0]:.3f} -> {losses[-1]:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="Adam steps per estimator (evaluated every 20)")
    steps = parser.parse_args().steps
    torch.set_num_threads(1)
    train(Spigot(eta=1.0), "spigot", steps)
    train(SpigotCe(eta=1.0), "spigot_ce", steps)
