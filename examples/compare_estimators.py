"""Every estimator of a categorical latent on the same small problem, side by side, without Hydra.

The data is the synthetic-clusters task of the default experiment (seed 001 §7.1): x comes from one of K clusters, and
each cluster has its own linear classifier of the label. The model is a linear scorer of the K choices, an estimator,
and a bilinear decoder that applies the chosen cluster's classifier (the parts of ``configs/task/classification.yaml``,
built by hand). Each estimator trains the same initial model for the same full-batch Adam steps; the table shows the
test accuracy and how well the MAP latent recovers the true clusters (V-measure), both ×100.
A short run on a small problem: its ranking is an illustration, not seed 001's Table 2 (results/spigot/table2.md).

    python examples/compare_estimators.py   # about ten seconds on one CPU core
    python examples/compare_estimators.py --steps 50   # fewer Adam steps (the tests' size)
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from latentstruct.data.synthetic import synthetic_clusters
from latentstruct.estimators import (
    Direct,
    GumbelSoftmax,
    Marginals,
    Sfe,
    Sparsemap,
    Spigot,
    SpigotCe,
    SpigotEg,
    SteI,
    SteS,
    StGumbel,
)
from latentstruct.models.decoders import Bilinear
from latentstruct.models.scorers import Linear
from latentstruct.structures import Categorical
from latentstruct.tasks.classification import v_measure

K = 3
ESTIMATORS = {
    "ste_i": SteI(),
    "ste_s": SteS(),
    "spigot": Spigot(),
    "spigot_ce": SpigotCe(),
    "spigot_eg": SpigotEg(),
    "marginals": Marginals(),
    "sparsemap": Sparsemap(),
    "gumbel_softmax": GumbelSoftmax(),
    "st_gumbel": StGumbel(),
    "sfe": Sfe(baseline="moving_average"),
    "direct": Direct(),
}


def run(estimator, data, steps: int) -> tuple[float, float]:
    """Train from the same initial parameters; return the test accuracy and V-measure of the MAP latent."""
    torch.manual_seed(0)
    dims, structure = data.dims, Categorical()
    scorer = Linear(dims["input_dim"], K)
    decoder = Bilinear(dims["input_dim"], K, dims["num_classes"])
    optimizer = torch.optim.Adam([*scorer.parameters(), *decoder.parameters()], lr=5e-2)
    x, y = data.splits["train"]["x"], data.splits["train"]["y"]
    estimator.train()
    for _ in range(steps):

        def downstream(mu):  # the per-example loss at a candidate μ (the features x have no parameters upstream)
            return F.cross_entropy(decoder(x, mu), y, reduction="none")

        z = estimator(scorer(x), structure, None, downstream)
        loss = F.cross_entropy(decoder(x, z), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    test = data.splits["test"]
    with torch.no_grad():
        estimator.eval()  # relaxed estimators feed their relaxation, the others the MAP latent
        pred = decoder(test["x"], estimator(scorer(test["x"]), structure)).argmax(-1)
        acc = 100 * float((pred == test["y"]).float().mean())
        clusters = structure.map(scorer(test["x"])).argmax(-1)
    return acc, v_measure(test["z"], clusters)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="full-batch Adam steps per estimator")
    steps = parser.parse_args().steps
    torch.set_num_threads(1)
    data = synthetic_clusters(num_features=20, num_clusters=K, n_train=500, n_valid=10, n_test=1000)
    print(f"{'estimator':15s} {'test acc':>8s} {'v-measure':>9s}")
    for name, estimator in ESTIMATORS.items():
        acc, v = run(estimator, data, steps)
        print(f"{name:15s} {acc:8.1f} {v:9.1f}")
