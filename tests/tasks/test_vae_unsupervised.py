"""The unsupervised discrete VAE of seed 003 (latentstruct/tasks/vae.py, UnsupervisedVAE): the exact gradient
against the negative ELBO written out category by category, the direct gradient on the categorical latent (the
difference of two argmaxes) and on the binary vector (the coordinate-wise ε-perturbed argmax) against brute force
from the same noise, the bound, and every experiment and sweep running a few steps on tiny data."""

from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from latentstruct.config import validate
from latentstruct.estimators import Direct, Exact, GumbelSoftmax, Sfe, StGumbel
from latentstruct.models.vae import Decoder, DiscreteHead, DiscreteVAE, Encoder
from latentstruct.report.tables import filter_runs, load_spec
from latentstruct.structures import BinaryVector, Categorical, gumbel_like
from latentstruct.tasks.vae import UnsupervisedVAE, runner_up_log_q
from latentstruct.train import build_model, train
from tests.data.test_images import write_mnist
from tests.helpers import compose, methods

SMALL = ["task.encoder.hidden=[32]", "task.decoder.hidden=32"]


def _task(estimator, latent="categorical", size=5, **settings) -> UnsupervisedVAE:
    torch.manual_seed(0)
    vae = DiscreteVAE(functools.partial(Encoder, hidden=(32, 16)), functools.partial(DiscreteHead, hidden=8),
                      functools.partial(Decoder, hidden=32), input_dim=784, latent=latent, size=size)
    structure = Categorical() if latent == "categorical" else BinaryVector()
    return UnsupervisedVAE(vae, structure, estimator, **settings).double()


def _x(batch=6, seed=1):
    return (torch.rand(batch, 784, generator=torch.Generator().manual_seed(seed)) > 0.5).double()


def _log_lik(vae, x, code):
    """log p(x | code) of one image and one decoder input, written out."""
    p = torch.sigmoid(vae.decoder(code))
    return (x * torch.log(p) + (1 - x) * torch.log1p(-p)).sum()


def _scores_grad(task, x):
    """The training loss's gradient with respect to the scores φ (captured at the discrete head's output)."""
    captured = {}

    def hook(module, inputs, output):
        output.retain_grad()
        captured["phi"] = output

    handle = task.vae.discrete_head.register_forward_hook(hook)
    task.train()
    loss = task({"x": x}).loss
    loss.backward()
    handle.remove()
    return loss, captured["phi"].grad.view(x.shape[0], *task.vae.part_shape)


def test_exact_is_the_gradient_of_the_negative_elbo_written_out():
    task = _task(Exact())
    x = _x()
    loss, _ = _scores_grad(task, x)
    params = [p for p in task.parameters()]
    ours = [p.grad.clone() for p in params]
    task.zero_grad()
    k = task.vae.size
    total = 0.0
    for b in range(x.shape[0]):
        phi = task.vae.scores(x[b:b + 1])[0]
        q = torch.softmax(phi, -1)
        rec = sum(q[j] * _log_lik(task.vae, x[b], torch.eye(k, dtype=x.dtype)[j]) for j in range(k))
        total = total + (-rec + (q * torch.log(q)).sum() + torch.log(torch.tensor(float(k))))
    brute = total / x.shape[0]
    torch.testing.assert_close(loss, brute)
    brute.backward()
    for p, g in zip(params, ours, strict=True):
        torch.testing.assert_close(g, p.grad)


def _kl_grad(task, x):
    phi = task.vae.scores(x).detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(task.vae.kl_prior(phi).mean(), phi)
    return phi.detach(), grad


def test_direct_on_the_categorical_latent_is_the_difference_of_two_argmaxes():
    task = _task(Direct(epsilon=-1.0, max_retries=0), anneal_rate=0.0)
    x = _x()
    torch.manual_seed(3)
    _, grad = _scores_grad(task, x)
    phi, kl_grad = _kl_grad(task, x)
    torch.manual_seed(3)
    gamma = gumbel_like(phi) - 0.5772156649015329  # the estimator's first random draw
    k = task.vae.size
    theta = torch.stack([torch.stack([_log_lik(task.vae, x[b], torch.eye(k, dtype=x.dtype)[j]) for j in range(k)])
                         for b in range(x.shape[0])]).detach()
    z = torch.nn.functional.one_hot((phi + gamma).argmax(-1), k).double()
    z_eps = torch.nn.functional.one_hot((phi + gamma + 1.0 * theta).argmax(-1), k).double()
    torch.testing.assert_close(grad, (z_eps - z) / (-1.0 * x.shape[0]) + kl_grad)


def test_direct_on_bits_is_the_coordinatewise_perturbed_argmax():
    """Each bit i: argmax_v |ε| θ(ẑ_1, .., z_i = v, .., ẑ_n) + φ_i(v) + γ_i(v), the others at their sampled values."""
    eps = 0.7
    task = _task(Direct(epsilon=-eps, max_retries=0), latent="binary_vector", size=4, anneal_rate=0.0)
    x = _x()
    torch.manual_seed(4)
    _, grad = _scores_grad(task, x)
    phi, kl_grad = _kl_grad(task, x)
    torch.manual_seed(4)
    gamma = gumbel_like(phi) - 0.5772156649015329
    z = torch.nn.functional.one_hot((phi + gamma).argmax(-1), 2).double()
    z_eps = torch.zeros_like(z)
    for b in range(x.shape[0]):
        for i in range(4):
            values = []
            for v in (0, 1):
                bits = z[b, :, 1].clone()
                bits[i] = v
                values.append(eps * _log_lik(task.vae, x[b], bits).detach() + phi[b, i, v] + gamma[b, i, v])
            z_eps[b, i, int(values[1] > values[0])] = 1
    assert (z_eps != z).any(), "the test should move some bit"
    torch.testing.assert_close(grad, (z_eps - z) / (-eps * x.shape[0]) + kl_grad)


@pytest.mark.parametrize("latent", ["categorical", "binary_vector"])
def test_the_bound_is_exact_when_enumerable_and_sampled_otherwise(latent):
    task = _task(GumbelSoftmax(), latent=latent, size=3)
    x = _x(batch=7)
    data = {"x": x, "y": torch.arange(7) % 3}
    exact = task.evaluate(data)
    phi = task.vae.scores(x).detach()
    vertices = task.structure.enumerate(3).double()
    total = 0.0
    for b in range(7):
        log_q = task.structure.log_prob(vertices, phi[b:b + 1].expand(len(vertices), *phi.shape[1:]))
        rec = sum(log_q[v].exp() * _log_lik(task.vae, x[b], task.vae.code(vertices[v])) for v in range(len(vertices)))
        total = total - rec + (log_q.exp() * log_q).sum()
    prior = -torch.log(torch.tensor(float(len(vertices))))  # log p(z), uniform over the codes
    expected = (total - 7 * prior) / 7
    torch.testing.assert_close(torch.tensor(exact["bound"], dtype=torch.float64), expected.detach())
    task.max_enumerate = 1  # too many codes: the bound is sampled, close to the exact one
    sampled = task.evaluate(data)
    assert sampled == task.evaluate(data), "the draws come from a fixed generator"
    assert abs(sampled["bound"] - exact["bound"]) < 0.1 * abs(exact["bound"])
    assert sampled["kl"] == pytest.approx(exact["kl"])


@pytest.mark.parametrize("estimator", [Sfe(baseline="moving_average"), StGumbel(), GumbelSoftmax()],
                         ids=["sfe", "st_gumbel", "gumbel_softmax"])
@pytest.mark.parametrize("latent", ["categorical", "binary_vector"])
def test_every_estimator_trains_the_encoder(estimator, latent):
    task = _task(estimator, latent=latent, size=4)
    _, grad = _scores_grad(task, _x())
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


@pytest.fixture
def data_dir(tmp_path):
    write_mnist(tmp_path / "data" / "mnist", n_train=120, n_test=30, seed=2)
    return tmp_path / "data"


@pytest.mark.parametrize("method", [m for m in methods("vae") if m.startswith("unsup_")])
def test_every_experiment_runs_a_few_steps(data_dir, tmp_path, method):
    cfg = compose(f"+experiment=vae_{method}", f"paths.data_dir={data_dir}", f"paths.output_dir={tmp_path / 'run'}",
                  "dataset.n_valid=40", "trainer.batch_size=20", "trainer.max_epochs=1", "trainer.eval_every=2",
                  "trainer.progress=false", "task.size=4" if "bits" in method else "task.size=10", *SMALL)
    validate(cfg)
    record = train(cfg)
    assert record["status"] == "completed" and record["steps"] == 4
    assert set(record["metrics"]) >= {"test/bound", "test/rec", "test/kl", "test/acc"}
    assert cfg.trainer.flush_denormal  # Gumbel-softmax's denormal weights would slow its CPU steps ~4x
    task = build_model(cfg, {"input_dim": 784, "num_classes": 10})
    assert task.anneal_start == (None if method in ("unsup_exact", "unsup_sfe") else 1.0)


def test_the_sweeps_compose():
    sweep = compose("+sweep=direct_vae_unsupervised", hydra=True)
    assert sweep.hydra.sweeper.params["+experiment"].count("vae_unsup_") == 5
    assert sweep.hydra.sweeper.params["task.size"] == "10,50"
    bits = compose("+sweep=direct_vae_unsupervised_bits", hydra=True)
    assert bits.hydra.sweep.dir == sweep.hydra.sweep.dir
    gmvae = compose("+sweep=direct_vae_unsupervised_gmvae", hydra=True)
    assert gmvae.hydra.sweep.dir == sweep.hydra.sweep.dir
    assert {gmvae.hydra.sweeper.params[g] for g in ("encoder", "scorer", "decoder")} == {"gmvae"}


@pytest.mark.parametrize("method", ["exact", "gsm"])
def test_the_default_networks_are_the_literatures_and_the_gmvaes_stay_selectable(method):
    """784-300-K encoder and K-300-784 decoder with ReLU by default, the seed's anneal rate per step (1e-5); the
    GM-VAE's networks with encoder=gmvae scorer=gmvae decoder=gmvae (issue 33: with them the model collapses)."""
    task = build_model(compose(f"+experiment=vae_unsup_{method}"), {"input_dim": 784})
    linears = [(m.in_features, m.out_features) for m in task.vae.modules() if isinstance(m, torch.nn.Linear)]
    assert linears == [(784, 300), (300, 10), (10, 300), (300, 784)]
    assert not any(isinstance(m, torch.nn.LeakyReLU) and m.negative_slope for m in task.vae.modules())
    assert task.anneal_rate == 1e-5
    old = build_model(compose(f"+experiment=vae_unsup_{method}", "encoder=gmvae", "scorer=gmvae", "decoder=gmvae"),
                      {"input_dim": 784})
    linears = [(m.in_features, m.out_features) for m in old.vae.modules() if isinstance(m, torch.nn.Linear)]
    assert linears == [(784, 400), (400, 200), (200, 100), (100, 10), (10, 400), (400, 784)]


@pytest.mark.parametrize("latent", ["categorical", "binary_vector"])
def test_the_runner_up_log_q_is_the_second_most_probable_code_by_enumeration(latent):
    task = _task(GumbelSoftmax(), latent=latent, size=4)
    x = _x(batch=5)
    phi = 3 * task.vae.scores(x).detach()
    vertices = task.structure.enumerate(4).double()
    expected = []
    for b in range(5):
        log_q = task.structure.log_prob(vertices, phi[b:b + 1].expand(len(vertices), *phi.shape[1:]))
        expected.append(log_q.sort(descending=True).values[1])
    torch.testing.assert_close(runner_up_log_q(phi), torch.stack(expected))
    metrics = task.evaluate({"x": x, "y": torch.arange(5) % 3})
    assert metrics["runner_up_log_q"] == pytest.approx(float(runner_up_log_q(task.vae.scores(x)).mean()))


def test_every_run_of_the_sweeps_is_one_cell_of_the_table():
    """Each (experiment, size) the two sweeps launch falls in exactly one row and one setting of the spec."""
    repo = Path(__file__).resolve().parents[2]
    spec = load_spec(repo / "experiments" / "direct" / "vae_unsupervised.yaml")
    launched = [(e, s) for e in ("direct", "gsm", "st_gumbel", "exact", "sfe") for s in (10, 50)]
    launched += [("bits_direct", 20), ("bits_gsm", 20)]
    launched = [(method, size, []) for method, size in launched]
    launched += [(e, 10, ["encoder=gmvae", "scorer=gmvae", "decoder=gmvae"])
                 for e in ("direct", "gsm", "st_gumbel", "exact", "sfe")]
    for method, size, networks in launched:
        cfg = compose(f"+experiment=vae_unsup_{method}", f"task.size={size}", *networks, hydra=True)
        choices = cfg.hydra.runtime.choices
        run = {"choices.structure": choices.structure, "choices.estimator": choices.estimator, "task.size": size,
               "choices.encoder": choices.encoder}
        frame = pd.DataFrame([run])
        rows = [r["name"] for r in spec["rows"] if len(filter_runs(frame, r["match"]))]
        settings = [s["name"] for s in spec["settings"] if len(filter_runs(frame, s["match"]))]
        assert len(rows) == 1 and len(settings) == 1, (method, size, rows, settings)
    names = [s["sweep"] for s in spec["reproduce"]["sweeps"]]
    sweeps = [yaml.safe_load((repo / "configs" / "sweep" / f"{name}.yaml").read_text()) for name in names]
    swept = {e for sweep in sweeps for e in sweep["hydra"]["sweeper"]["params"]["+experiment"].split(",")}
    assert len(sweeps) == 3
    assert swept == {f"vae_{m}" for m in methods("vae") if m.startswith("unsup_")}  # every experiment, once
