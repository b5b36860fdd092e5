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
