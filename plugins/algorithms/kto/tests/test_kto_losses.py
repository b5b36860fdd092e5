"""KTO against numbers worked out by hand."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlx.algorithm import UnpairedScores
from rlx_kto import KTOConfig, kto


def sig(x):
    return 1 / (1 + math.exp(-x))


def scores(logratio=(1.0, -1.0), desirable=(True, False), z=0.5):
    return UnpairedScores(logratio=torch.tensor(logratio, dtype=torch.float64),
                          kl_ref_point=torch.tensor(z, dtype=torch.float64),
                          desirable=torch.tensor(desirable), desirable_share=sum(desirable) / len(desirable))


def config(**kw):
    return SimpleNamespace(**{"beta": 1.0, "desirable_weight": 1.0, "undesirable_weight": 1.0, **kw})


def test_defaults():
    c = KTOConfig()
    assert (c.beta, c.desirable_weight, c.undesirable_weight) == (0.1, 1.0, 1.0)


def test_kto_by_hand():
    loss, metrics = kto(scores(), config=config())
    # desirable: 1 − σ(β(1 − 0.5)); undesirable: 1 − σ(β(0.5 − (−1)))
    assert loss.tolist() == pytest.approx([1 - sig(0.5), 1 - sig(1.5)], abs=1e-9)
    assert loss.tolist() == pytest.approx([0.3775407, 0.1824255], abs=1e-6)
    assert metrics["kl_ref_point"].tolist() == [0.5, 0.5]


def test_desirable_and_undesirable_weights():
    loss, _ = kto(scores(), config=config(desirable_weight=2.0, undesirable_weight=3.0))
    assert loss.tolist() == pytest.approx([2 * (1 - sig(0.5)), 3 * (1 - sig(1.5))], abs=1e-9)


def test_beta_scales_the_logratio():
    loss, _ = kto(scores(), config=config(beta=0.1))
    assert loss.tolist() == pytest.approx([1 - sig(0.05), 1 - sig(0.15)], abs=1e-9)


def test_negative_kl_ref_point_is_clamped_to_zero():
    loss, metrics = kto(scores(z=-2.0), config=config())
    # z0 = max(0, −2) = 0: 1 − σ(1) for both rows
    assert loss.tolist() == pytest.approx([1 - sig(1.0), 1 - sig(1.0)], abs=1e-9)
    assert metrics["kl_ref_point"].tolist() == [0.0, 0.0]
    assert metrics["kl_estimate"].tolist() == [-2.0, -2.0]


def test_kl_ref_point_is_detached():
    z = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    s = scores()
    s.kl_ref_point = z
    s.logratio.requires_grad_(True)
    loss, _ = kto(s, config=config())
    loss.sum().backward()
    assert z.grad is None
    # dL_d/dlogratio = −β σ'(0.5); dL_u/dlogratio = +β σ'(1.5)
    assert s.logratio.grad.tolist() == pytest.approx([-sig(0.5) * (1 - sig(0.5)), sig(1.5) * (1 - sig(1.5))])


def test_class_means_and_accuracy():
    # three rows, two desirable: the metric sums over the step (÷ 3) are the class means
    s = scores(logratio=(2.0, -1.0, 0.25), desirable=(True, True, False), z=0.5)
    _, metrics = kto(s, config=config(beta=0.1))
    assert metrics["reward/desirable"].sum().item() / 3 == pytest.approx((0.2 - 0.1) / 2)
    assert metrics["reward/undesirable"].sum().item() / 3 == pytest.approx(0.025)
    # relative to the unclamped reference point 0.5: 2.0 above (right), −1.0 below (wrong), 0.25 below (right)
    assert metrics["accuracy"].tolist() == [1.0, 0.0, 1.0]
    tie = scores(logratio=(0.0, 0.0), z=0.0)
    assert kto(tie, config=config())[1]["accuracy"].tolist() == [0.5, 0.5]


# --- kto_vanilla (the first KTO) and apo_zero_unpaired --------------------------------------------------------

from rlx_kto import KTO_VANILLA, VanillaKTOConfig, apo_zero_unpaired, kto_vanilla  # noqa: E402


def step(logratio, desirable):
    """Scores of a whole step taken as one micro-batch."""
    s = scores(logratio, desirable)
    s.kl_ref_point = None
    s.step_logratio, s.step_desirable = s.logratio.clone(), s.desirable.clone()
    return s


def test_vanilla_defaults_and_statistics():
    assert VanillaKTOConfig().beta == 0.1 and not hasattr(VanillaKTOConfig(), "desirable_weight")
    assert KTO_VANILLA.data == "unpaired" and KTO_VANILLA.needs_reference
    assert (kto.step_statistics, kto_vanilla.step_statistics, apo_zero_unpaired.step_statistics) == (
        "kl_ref_point", "logratios", "none")


def test_kto_vanilla_by_hand():
    # desirable logratios 2, 1 (mean 1.5 = z_D); undesirable −1, 0.5 (mean −0.25, z_U = max(0, −0.25) = 0)
    s = step((2.0, 1.0, -1.0, 0.5), (True, True, False, False))
    loss, metrics = kto_vanilla(s, config=config(beta=1.0))
    # desirable: 1 − σ(r − z_U); undesirable: 1 − σ(z_D − r)
    assert loss.tolist() == pytest.approx([1 - sig(2.0), 1 - sig(1.0), 1 - sig(2.5), 1 - sig(1.0)], abs=1e-12)
    assert metrics["ref_point/desirable"].tolist() == [0.0] * 4       # z_U: what desirable rows are measured against
    assert metrics["ref_point/undesirable"].tolist() == [1.5] * 4     # z_D
    # desirable above 0: right, right; undesirable below 1.5: right, right
    assert metrics["accuracy"].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert metrics["reward/desirable"].sum().item() / 4 == pytest.approx(1.5)


def test_kto_vanilla_gradient_flows_through_the_class_means():
    # the same step as above; by hand, with σ' = σ(1 − σ), and L = mean of the four rows:
    # dL/dr_d1 = (1/4)(−σ'(2) − σ'(2.5)/2 − σ'(1)/2): its own term, and z_D = mean(r_d1, r_d2) in both undesirable rows
    # dL/dr_u2 = (1/4)( σ'(1) + 0): z_U < 0 is clamped, so the undesirable mean passes no gradient
    ds = lambda x: sig(x) * (1 - sig(x))  # noqa: E731
    expected = [(-ds(2.0) - ds(2.5) / 2 - ds(1.0) / 2) / 4, (-ds(1.0) - ds(2.5) / 2 - ds(1.0) / 2) / 4,
                ds(2.5) / 4, ds(1.0) / 4]
    values = torch.tensor([2.0, 1.0, -1.0, 0.5], dtype=torch.float64)
    desirable = torch.tensor([True, True, False, False])
    for split in ([slice(0, 4)], [slice(0, 1), slice(1, 3), slice(3, 4)]):  # one micro-batch, or three
        r = values.clone().requires_grad_(True)
        total = 0
        for part in split:
            s = UnpairedScores(logratio=r[part], kl_ref_point=None, desirable=desirable[part], desirable_share=0.5,
                               step_logratio=values, step_desirable=desirable)
            total = total + kto_vanilla(s, config=config(beta=1.0))[0].sum() / 4
        total.backward()
        assert r.grad.tolist() == pytest.approx(expected, abs=1e-12)
        assert total.item() == pytest.approx((4 - sig(2.0) - sig(1.0) - sig(2.5) - sig(1.0)) / 4, abs=1e-12)


def test_kto_vanilla_matches_the_original_autograd_when_the_means_are_positive():
    # the original form, written out: reference points as live (non-detached) clamped class means
    values = torch.tensor([0.5, 2.0, 1.5, -0.5, 3.0], dtype=torch.float64)
    desirable = torch.tensor([True, False, True, False, True])
    r = values.clone().requires_grad_(True)
    z_d, z_u = r[desirable].mean().clamp(min=0), r[~desirable].mean().clamp(min=0)
    original = torch.where(desirable, 1 - torch.sigmoid(0.3 * (r - z_u)), 1 - torch.sigmoid(0.3 * (z_d - r))).mean()
    original.backward()
    mine = values.clone().requires_grad_(True)
    s = UnpairedScores(logratio=mine, kl_ref_point=None, desirable=desirable, step_logratio=values,
                       step_desirable=desirable)
    loss = kto_vanilla(s, config=config(beta=0.3))[0].mean()
    loss.backward()
    assert loss.item() == pytest.approx(original.item(), abs=1e-12)
    assert mine.grad.tolist() == pytest.approx(r.grad.tolist(), abs=1e-12)


def test_kto_vanilla_first_step_and_a_missing_class():
    # policy == reference: every logratio 0, both reference points 0, every loss 1 − σ(0), every row a tie
    loss, metrics = kto_vanilla(step((0.0, 0.0), (True, False)), config=config())
    assert loss.tolist() == [0.5, 0.5] and metrics["accuracy"].tolist() == [0.5, 0.5]
    # no undesirable row in the step: the desirable rows are measured against 0
    loss, _ = kto_vanilla(step((1.0, 3.0), (True, True)), config=config())
    assert loss.tolist() == pytest.approx([1 - sig(1.0), 1 - sig(3.0)], abs=1e-12)


def test_apo_zero_unpaired_by_hand():
    # desirable: w_d(1 − σ(β r)); undesirable: w_u σ(β r); no reference point
    s = scores(logratio=(1.0, -1.0, 2.0), desirable=(True, False, False), z=5.0)  # z is ignored
    loss, metrics = apo_zero_unpaired(s, config=config(beta=0.5))
    assert loss.tolist() == pytest.approx([1 - sig(0.5), sig(-0.5), sig(1.0)], abs=1e-12)
    assert loss.tolist() == pytest.approx([0.3775407, 0.3775407, 0.7310586], abs=1e-6)
    assert metrics["accuracy"].tolist() == [1.0, 1.0, 0.0]  # relative to 0
    weighted, _ = apo_zero_unpaired(s, config=config(beta=0.5, desirable_weight=2.0, undesirable_weight=3.0))
    assert weighted.tolist() == pytest.approx([2 * (1 - sig(0.5)), 3 * sig(-0.5), 3 * sig(1.0)], abs=1e-12)
    s.logratio.requires_grad_(True)
    apo_zero_unpaired(s, config=config(beta=0.5))[0].sum().backward()
    # d/dr: −β σ'(βr) on desirable rows, +β σ'(βr) on undesirable ones
    assert s.logratio.grad.tolist() == pytest.approx(
        [-0.5 * sig(0.5) * (1 - sig(0.5)), 0.5 * sig(-0.5) * (1 - sig(-0.5)), 0.5 * sig(1.0) * (1 - sig(1.0))])
