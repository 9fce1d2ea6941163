"""Energy networks, inference networks and primary losses of seed 004: shapes, the sign convention (low energy =
good), padding invariance and brute-force checks of eq. 7, the primary losses' formulas and gradient signs, the CD
sample estimator against its enumerated expectation, which parameters each loss reaches, and the implicit gradient
on the real MLC models against autograd through an unrolled inner optimisation."""

from __future__ import annotations

import contextlib
import copy
import itertools

import pytest
import torch
import torch.nn.functional as F

from latentstruct.models.energy import (
    BiLSTMFeatures,
    MLCEnergy,
    MLCInferenceNet,
    SequenceEnergy,
    SequenceInferenceNet,
    auxiliary_loss,
    bernoulli_samples,
    categorical_samples,
    cd_loss,
    dvn_loss,
    f1_loss,
    hamming_loss,
    multilabel_nll,
    sequence_nll,
    soft_f1_loss,
    ssvm_loss,
)
from latentstruct.models.implicit import exact_inverse_hvp, implicit_gradient

DT = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mlc(seed: int = 0, d: int = 5, labels: int = 4) -> tuple[MLCEnergy, torch.Tensor]:
    torch.manual_seed(seed)
    energy = MLCEnergy(d, labels, feature_hidden=(8, 6), global_hidden=3).double()
    return energy, torch.randn(7, d, generator=_gen(seed + 1), dtype=DT)


def _binary_configs(labels: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product([0.0, 1.0], repeat=labels)), dtype=DT)  # [2^L, L]


def _seq(seed: int = 0, h: int = 6, tags: int = 3) -> SequenceEnergy:
    torch.manual_seed(seed)
    energy = SequenceEnergy(h, tags).double()
    with torch.no_grad():
        g = _gen(seed + 1)
        energy.transition.copy_(torch.randn(tags, tags, generator=g, dtype=DT))
        energy.start.copy_(torch.randn(tags, generator=g, dtype=DT))
        energy.end.copy_(torch.randn(tags, generator=g, dtype=DT))
    return energy


def _relaxed_tags(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.softmax(torch.randn(*shape, generator=_gen(seed), dtype=DT), -1)


# ------------------------------------------------------------------------------------------------------- shapes


def test_shapes_and_sample_dimensions():
    energy, x = _mlc()
    y = torch.rand(7, 4, generator=_gen(2), dtype=DT)
    assert energy(x, y).shape == (7,)
    ys = torch.rand(3, 7, 4, generator=_gen(3), dtype=DT)
    batched = energy(x, ys)
    assert batched.shape == (3, 7)
    assert torch.allclose(batched[1], energy(x, ys[1]))
    assert energy.local_logits(x).shape == (7, 4)
    assert MLCInferenceNet(5, 4, hidden=(8, 6)).double()(x).shape == (7, 4)
    assert MLCInferenceNet(5, 4, hidden=()).double()(x).shape == (7, 4)

    feats = BiLSTMFeatures(vocab_size=11, emb_dim=4, hidden=5, extra_vocab_sizes=(6, 3), extra_dim=2)
    ids = torch.randint(1, 11, (2, 6), generator=_gen(4))
    extra = (torch.randint(1, 6, (2, 6), generator=_gen(5)), torch.randint(1, 3, (2, 6), generator=_gen(6)))
    lengths = torch.tensor([6, 3])
    b = feats(ids, lengths, extra)
    assert b.shape == (2, 6, 10) and feats.out_dim == 10
    assert torch.equal(b[1, 3:], torch.zeros(3, 10))
    seq_energy = SequenceEnergy(10, 4)
    y = _relaxed_tags((2, 6, 4), 7).float()
    assert seq_energy(b, y, lengths).shape == (2,)
    assert seq_energy(b, y.expand(5, -1, -1, -1), lengths).shape == (5, 2)

    net = SequenceInferenceNet(BiLSTMFeatures(11, 4, hidden=5, extra_vocab_sizes=(6, 3), extra_dim=2), 4)
    probs = net(ids, lengths, extra)
    assert probs.shape == (2, 6, 4)
    assert torch.allclose(probs[0].sum(-1), torch.ones(6)) and torch.allclose(probs[1, :3].sum(-1), torch.ones(3))
    assert torch.equal(probs[1, 3:], torch.zeros(3, 4))
    with pytest.raises(ValueError, match="extra"):
        feats(ids, lengths)


# --------------------------------------------------------------------------------------------- sign convention


def test_low_energy_is_good_mlc():
    """With the global term off, argmin_y E over {0,1}^L is the logistic classifier's thresholding of local_logits,
    so pretrained logits keep their meaning inside E."""
    energy, x = _mlc(seed=3)
    with torch.no_grad():
        energy.label_weight.weight.zero_()
    configs = _binary_configs(4)
    e = energy(x, configs.unsqueeze(1).expand(-1, 7, -1))  # [16, 7]
    best = configs[e.argmin(0)]
    assert torch.equal(best, (energy.local_logits(x) > 0).to(DT))


def test_low_energy_is_good_sequence():
    """With zero transitions (the initialisation), argmin_y E over tag sequences is the per-token argmax of U b."""
    torch.manual_seed(0)
    energy = SequenceEnergy(5, 3).double()
    features = torch.randn(1, 4, 5, generator=_gen(1), dtype=DT)
    seqs = torch.tensor(list(itertools.product(range(3), repeat=4)))
    ys = F.one_hot(seqs, 3).to(DT).unsqueeze(1)  # [81, 1, 4, 3]
    e = energy(features, ys, torch.tensor([4]))
    assert torch.equal(seqs[e[:, 0].argmin()], energy.unary_scores(features)[0].argmax(-1))


# ------------------------------------------------------------------------------------------ eq. 7, brute force


def test_sequence_energy_matches_brute_force_sum():
    energy = _seq()
    features = torch.randn(3, 5, 6, generator=_gen(10), dtype=DT)
    y = _relaxed_tags((3, 5, 3), 11)
    lengths = torch.tensor([5, 2, 1])
    got = energy(features, y, lengths)
    u = energy.unary_scores(features).detach()
    w, s, e = energy.transition.detach(), energy.start.detach(), energy.end.detach()
    for b in range(3):
        n = int(lengths[b])
        score = sum(float(y[b, t] @ u[b, t]) for t in range(n))
        score += float(s @ y[b, 0]) + float(y[b, n - 1] @ e)
        score += sum(float(y[b, t - 1] @ w @ y[b, t]) for t in range(1, n))
        assert abs(got[b].item() + score) < 1e-10  # E = −(score)
    # W[i, j] is "tag i followed by tag j": a one-hot 0 → 2 sequence picks transition[0, 2], not [2, 0]
    y02 = F.one_hot(torch.tensor([[0, 2]]), 3).to(DT)
    feats0 = torch.zeros(1, 2, 6, dtype=DT)
    want = -(s[0] + w[0, 2] + e[2])
    assert torch.allclose(energy(feats0, y02, torch.tensor([2])), want.view(1))


def test_sequence_energy_ignores_padding():
    energy = _seq(seed=2)
    features = torch.randn(2, 4, 6, generator=_gen(20), dtype=DT)
    y = _relaxed_tags((2, 4, 3), 21)
    lengths = torch.tensor([4, 2])
    base = energy(features, y, lengths)
    # junk in the padded positions, and extra padded positions appended
    y_junk, f_junk = y.clone(), features.clone()
    y_junk[1, 2:] = 5.0 * torch.rand(2, 3, generator=_gen(22), dtype=DT)
    f_junk[1, 2:] = 100.0
    longer_y = torch.cat([y_junk, _relaxed_tags((2, 3, 3), 23)], 1)
    longer_f = torch.cat([f_junk, torch.randn(2, 3, 6, generator=_gen(24), dtype=DT)], 1)
    assert torch.allclose(energy(f_junk, y_junk, lengths), base, atol=1e-12)
    assert torch.allclose(energy(longer_f, longer_y, lengths), base, atol=1e-12)
    with pytest.raises(ValueError, match="lengths"):
        energy(features, y, torch.tensor([5, 2]))


def test_unary_terms_are_linear_in_y():
    energy, x = _mlc(seed=5)
    with torch.no_grad():
        energy.label_weight.weight.zero_()
    y1, y2 = torch.rand(2, 7, 4, generator=_gen(30), dtype=DT)
    assert torch.allclose(energy(x, 0.3 * y1 + 1.7 * y2), 0.3 * energy(x, y1) + 1.7 * energy(x, y2))
    assert torch.allclose(energy(x, y1), -(y1 * energy.local_logits(x)).sum(-1))

    seq = SequenceEnergy(6, 3).double()  # transitions start at zero: E is the unary term alone
    features = torch.randn(2, 4, 6, generator=_gen(31), dtype=DT)
    lengths = torch.tensor([4, 3])
    a, b = _relaxed_tags((2, 2, 4, 3), 32)
    assert torch.allclose(
        seq(features, 2.0 * a - 0.5 * b, lengths), 2.0 * seq(features, a, lengths) - 0.5 * seq(features, b, lengths)
    )


# ------------------------------------------------------------------------------------------------- task losses


def test_task_losses():
    y = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]], dtype=DT)
    y_bar = torch.tensor([[0.9, 0.2, 0.7, 0.1], [0.1, 0.0, 0.2, 0.3], [0.1, 0.2, 0.3, 0.4]], dtype=DT)
    # rounded: {0, 2} vs {0, 1} → F1 = 2·1/(2+2); empty vs empty → F1 = 1; empty vs {0} → F1 = 0
    assert torch.allclose(f1_loss(y_bar, y), torch.tensor([0.5, 0.0, 1.0], dtype=DT))
    hard = (y_bar >= 0.5).to(DT)
    assert torch.allclose(soft_f1_loss(hard, y), f1_loss(y_bar, y))
    assert torch.allclose(soft_f1_loss(y_bar, y)[0], torch.tensor(1 - 2 * 1.1 / (1.9 + 2), dtype=DT))
    assert torch.equal(soft_f1_loss(y, y), torch.zeros(3, dtype=DT))

    gold = F.one_hot(torch.tensor([[0, 1, 2, 0], [1, 1, 0, 0]]), 3).to(DT)
    pred = F.one_hot(torch.tensor([[0, 2, 2, 1], [1, 0, 2, 2]]), 3).to(DT)
    lengths = torch.tensor([4, 2])
    assert torch.equal(hamming_loss(pred, gold, lengths), torch.tensor([2.0, 1.0], dtype=DT))
    assert torch.equal(hamming_loss(pred, gold, lengths, normalize=True), torch.tensor([0.5, 0.5], dtype=DT))
    soft = _relaxed_tags((2, 4, 3), 40)  # expected number of wrong tags under per-token categoricals
    assert torch.allclose(hamming_loss(soft, gold, lengths)[1], 2 - soft[1, 0, 1] - soft[1, 1, 1])


# ---------------------------------------------------------------------------------------------- primary losses


def test_ssvm_hinge_zero_when_margin_holds_and_gradient_signs():
    e_bar = torch.tensor([3.0, 1.0], dtype=DT, requires_grad=True)
    e_gold = torch.tensor([1.0, 1.0], dtype=DT, requires_grad=True)
    delta = torch.tensor([0.5, 0.5], dtype=DT)
    loss = ssvm_loss(e_bar, e_gold, delta, reduction="none")
    assert torch.equal(loss.detach(), torch.tensor([0.0, 0.5], dtype=DT))  # example 0: E(ȳ) − E(y) = 2 ≥ Δ
    ssvm_loss(e_bar, e_gold, delta).backward()
    # descent lowers the gold energy and raises the competitor's, only where the margin is violated
    assert torch.equal(e_gold.grad, torch.tensor([0.0, 0.5], dtype=DT))
    assert torch.equal(e_bar.grad, torch.tensor([0.0, -0.5], dtype=DT))


def test_cd_loss_formula_softplus_case_and_gradient_signs():
    e_gold = torch.tensor([0.2, -1.0], dtype=DT, requires_grad=True)
    e_neg = torch.tensor([[0.5, 2.0], [1.5, -0.5], [0.0, 0.3]], dtype=DT, requires_grad=True)
    delta = torch.tensor([[0.3, 1.0], [0.0, 0.5], [1.0, 0.2]], dtype=DT)
    got = cd_loss(e_gold, e_neg, delta, reduction="none")
    ratio = torch.exp(-e_gold) / (torch.exp(-e_gold) + torch.exp(-e_neg + delta).sum(0))
    assert torch.allclose(got, -torch.log(ratio))
    # K = 1 is Appendix D's soft margin loss
    one = cd_loss(e_gold, e_neg[:1], delta[:1], reduction="none")
    assert torch.allclose(one, F.softplus(delta[0] + e_gold - e_neg[0]))
    cd_loss(e_gold, e_neg, delta).backward()
    assert (e_gold.grad > 0).all() and (e_neg.grad < 0).all()


def test_dvn_loss_regresses_the_value_onto_the_task_score():
    target = torch.tensor([0.2, 0.9, 1.0], dtype=DT)
    e = torch.tensor([0.5, -0.3, 2.0], dtype=DT, requires_grad=True)
    got = dvn_loss(e, target, reduction="none")
    v = torch.sigmoid(-e)
    assert torch.allclose(got, -(target * v.log() + (1 - target) * (1 - v).log()))
    # stationary exactly where the value sigmoid(−E) equals the target score
    e_star = (-torch.logit(target[:2])).requires_grad_()
    dvn_loss(e_star, target[:2]).backward()
    assert torch.allclose(e_star.grad, torch.zeros(2, dtype=DT), atol=1e-12)
    with pytest.raises(ValueError, match="target"):
        dvn_loss(e, torch.tensor([0.2, 1.5, 0.0], dtype=DT))


def test_nll_terms_and_auxiliary_loss():
    logits = torch.randn(3, 4, generator=_gen(50), dtype=DT)
    y = (torch.rand(3, 4, generator=_gen(51), dtype=DT) < 0.5).to(DT)
    a = torch.sigmoid(logits)
    assert torch.allclose(multilabel_nll(logits, y), (-(y * a.log()) - (1 - y) * (1 - a).log()).sum(-1))
    seq_logits = torch.randn(2, 3, 4, generator=_gen(52), dtype=DT)
    tags = torch.tensor([[1, 2, 3], [0, 1, 0]])
    lengths = torch.tensor([3, 2])
    got = sequence_nll(seq_logits, F.one_hot(tags, 4).to(DT), lengths)
    lp = torch.log_softmax(seq_logits, -1)
    assert torch.allclose(got[1], -(lp[1, 0, 0] + lp[1, 1, 1]))  # the padded token does not count
    nll, e = torch.tensor([1.0, 2.0], dtype=DT), torch.tensor([-1.0, 3.0], dtype=DT)
    assert torch.allclose(auxiliary_loss(nll, e, lam=0.5), torch.tensor(2.0, dtype=DT))  # mean of 1 − 0.5 and 2 + 1.5


# ------------------------------------------------------------------------------------------- negative sampling


def test_samplers_match_their_distributions():
    probs = torch.tensor([[0.1, 0.5, 0.9]], dtype=DT)
    s = bernoulli_samples(probs, 40_000, generator=_gen(60))
    assert s.shape == (40_000, 1, 3) and set(s.unique().tolist()) <= {0.0, 1.0}
    assert torch.allclose(s.mean(0), probs, atol=0.01)

    cat = torch.tensor([[[0.2, 0.0, 0.8], [0.5, 0.3, 0.2], [0.0, 0.0, 0.0]]], dtype=DT)  # last row: padding
    c = categorical_samples(cat, 40_000, generator=_gen(61))
    assert c.shape == (40_000, 1, 3, 3) and torch.equal(c.sum(-1), torch.ones(40_000, 1, 3, dtype=DT))
    assert torch.allclose(c.mean(0)[0, :2], cat[0, :2], atol=0.01)
    assert c[:, 0, 0, 1].sum() == 0  # a zero-probability tag is never drawn

    p = probs.clone().requires_grad_()
    st = bernoulli_samples(p, 5, generator=_gen(62), straight_through=True)
    assert set(st.detach().unique().tolist()) <= {0.0, 1.0}
    st.sum().backward()
    assert torch.equal(p.grad, torch.full_like(probs, 5.0))
    assert not bernoulli_samples(p, 5, generator=_gen(62)).requires_grad


def test_cd_sample_estimator_matches_its_enumerated_expectation():
    """E over ȳ_k ~ Bernoulli(A(x)) i.i.d. of the sampled L_CD, by Monte Carlo, against the exact sum over {0,1}^L
    (K = 1 and K = 2, L = 3), both with the F1 task loss."""
    torch.manual_seed(7)
    energy = MLCEnergy(2, 3, feature_hidden=(4,), global_hidden=3).double()
    x = torch.tensor([[0.3, -1.2]], dtype=DT)
    y = torch.tensor([[1.0, 0.0, 1.0]], dtype=DT)
    probs = torch.tensor([[0.7, 0.4, 0.2]], dtype=DT)
    configs = _binary_configs(3)
    with torch.no_grad():
        e_cfg = energy(x.expand(8, -1), configs)  # [8]
        d_cfg = f1_loss(configs, y.expand(8, -1))
        q = (configs * probs + (1 - configs) * (1 - probs)).prod(-1)
        e_gold = energy(x, y)
        n = 200_000
        for k in (1, 2):
            exact = 0.0
            for combo in itertools.product(range(8), repeat=k):
                idx = torch.tensor(combo)
                loss = cd_loss(e_gold, e_cfg[idx].view(k, 1), d_cfg[idx].view(k, 1))
                exact += q[idx].prod() * loss
            samples = bernoulli_samples(probs.expand(n, -1), k, generator=_gen(70 + k))  # [k, n, 3]
            e_neg = energy(x.expand(n, -1), samples)
            d_neg = f1_loss(samples, y.expand(n, -1))
            per = cd_loss(e_gold.expand(n), e_neg, d_neg, reduction="none")
            stderr = per.std() / n**0.5
            assert abs(per.mean() - exact) < 4 * stderr + 1e-12, (k, per.mean().item(), exact.item())
            assert stderr < 0.01 * exact


# ---------------------------------------------------------------------------------------- where gradients go


def _grads_set(module: torch.nn.Module) -> bool:
    return any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in module.parameters())


def test_primary_losses_reach_phi_only_when_y_bar_is_detached():
    energy, x = _mlc(seed=8)
    net = MLCInferenceNet(5, 4, hidden=(6,)).double()
    y = (torch.rand(7, 4, generator=_gen(80), dtype=DT) < 0.5).to(DT)
    y_bar = net(x)

    def primaries(yb: torch.Tensor) -> list[torch.Tensor]:
        e_bar, e_gold = energy(x, yb), energy(x, y)
        neg = bernoulli_samples(yb, 3, generator=_gen(81))
        big = torch.full((7,), 10.0, dtype=DT)  # a large margin keeps every hinge active
        return [
            ssvm_loss(e_bar, e_gold, big + soft_f1_loss(yb, y)),
            cd_loss(e_gold, energy(x, neg), f1_loss(neg, y)),
            dvn_loss(e_bar, 1 - soft_f1_loss(yb, y)),
        ]

    for loss in primaries(y_bar.detach()):
        energy.zero_grad(), net.zero_grad()
        loss.backward(retain_graph=True)
        assert _grads_set(energy) and not _grads_set(net)
    for loss in primaries(y_bar)[::2]:  # SSVM and DVN see ȳ itself; CD only hard samples
        energy.zero_grad(), net.zero_grad()
        loss.backward(retain_graph=True)
        assert _grads_set(energy) and _grads_set(net)
    # the auxiliary loss (eq. 6) reaches both: θ by both terms, φ through E_φ(x, A_θ(x))
    energy.zero_grad(), net.zero_grad()
    auxiliary_loss(multilabel_nll(net.logits(x), y), energy(x, net(x)), lam=0.5).backward()
    assert _grads_set(energy) and _grads_set(net)


# -------------------------------------------------------------- end to end: eq. 4 on the MLC models, vs unrolling


def test_implicit_gradient_on_mlc_models_matches_unrolled_inner_training():
    """θ: a linear inference network trained on eq. 6 (+ weight decay, so that the inner problem has a strict
    minimum) by gradient descent to convergence; φ: the SPEN energy, judged by the SSVM loss on ȳ = A_θ(x) (with
    a margin large enough to keep every hinge active, so that L_prim is smooth). The implicit gradient (exact H⁻¹)
    equals autograd through the unrolled inner optimisation."""
    torch.manual_seed(9)
    energy = MLCEnergy(3, 3, feature_hidden=(4,), global_hidden=2).double()
    x = torch.randn(6, 3, generator=_gen(90), dtype=DT)
    y = (torch.rand(6, 3, generator=_gen(91), dtype=DT) < 0.5).to(DT)
    phi = list(energy.parameters())
    lam, decay = 0.3, 0.5

    def aux(w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        logits = x @ w.T + b
        reg = 0.5 * decay * ((w * w).sum() + (b * b).sum())
        return auxiliary_loss(multilabel_nll(logits, y), energy(x, torch.sigmoid(logits)), lam) + reg

    def prim(w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y_bar = torch.sigmoid(x @ w.T + b)
        margin = torch.full((6,), 3.0, dtype=DT) + soft_f1_loss(y_bar, y)
        return ssvm_loss(energy(x, y_bar), energy(x, y), margin)

    w = torch.zeros(3, 3, dtype=DT, requires_grad=True)
    b = torch.zeros(3, dtype=DT, requires_grad=True)
    for _ in range(400):
        gw, gb = torch.autograd.grad(aux(w, b), [w, b], create_graph=True)
        w, b = w - 0.3 * gw, b - 0.3 * gb
    unrolled = torch.autograd.grad(prim(w, b), phi)

    w_star, b_star = w.detach().requires_grad_(), b.detach().requires_grad_()
    stationarity = torch.autograd.grad(aux(w_star, b_star), [w_star, b_star])
    assert max(g.abs().max() for g in stationarity) < 1e-12
    implicit = implicit_gradient(
        prim(w_star, b_star), aux(w_star, b_star), [w_star, b_star], phi, inverse_hvp=exact_inverse_hvp
    )
    explicit = torch.autograd.grad(prim(w_star, b_star), phi)
    flat = lambda ts: torch.cat([t.reshape(-1) for t in ts])  # noqa: E731
    assert torch.allclose(flat(implicit), flat(unrolled), atol=1e-9, rtol=1e-7)
    assert (flat(explicit) - flat(unrolled)).norm() > 0.02 * flat(unrolled).norm()


@pytest.mark.cuda
def test_the_implicit_gradient_through_the_sequence_networks_lstms_runs_on_cuda_as_on_the_cpu():
    """Seed 004's implicit gradient differentiates ∇_θ L_aux again through the inference network's LSTM (Hessian-vector
    products). On CUDA, with cuDNN off as the NER task runs that step (cuDNN's LSTM backward has no derivative), it
    gives the CPU's gradient (float64)."""
    torch.manual_seed(4)
    vocab, tags, lengths = 12, 4, torch.tensor([5, 3, 2])
    features = BiLSTMFeatures(vocab, emb_dim=6, hidden=3, freeze=False).double()
    energy = SequenceEnergy(features.out_dim, tags).double()
    infnet = SequenceInferenceNet(BiLSTMFeatures(vocab, emb_dim=6, hidden=3, freeze=False), tags).double()
    ids = torch.randint(1, vocab, (3, 5), generator=_gen(40))
    gold = F.one_hot(torch.randint(0, tags, (3, 5), generator=_gen(41)), tags).to(DT)

    def implicit(device: str) -> list[torch.Tensor]:
        f, e, a = (copy.deepcopy(m).to(device) for m in (features, energy, infnet))
        x, n, y = ids.to(device), lengths.to(device), gold.to(device)
        off = torch.backends.cudnn.flags(enabled=False) if device == "cuda" else contextlib.nullcontext()
        with off:
            feats = f(x, n)
            logits = a.logits(x, n)
            y_bar = torch.softmax(logits, -1)
            aux = auxiliary_loss(sequence_nll(logits, y, n), e(feats, y_bar, n), 0.5)
            prim = ssvm_loss(e(feats, y_bar, n), e(feats, y, n), torch.full((3,), 5.0, dtype=DT, device=device))
            return implicit_gradient(prim, aux, list(a.parameters()), [*f.parameters(), *e.parameters()], terms=5)

    on_cpu, on_gpu = implicit("cpu"), implicit("cuda")
    assert any(g.abs().sum() > 0 for g in on_cpu)
    for cpu, gpu in zip(on_cpu, on_gpu, strict=True):
        assert gpu.is_cuda
        torch.testing.assert_close(gpu.cpu(), cpu)
