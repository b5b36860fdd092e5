"""DPO, cDPO and IPO against numbers worked out by hand."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlx.algorithm import PreferenceScores
from rlx_dpo import DPOConfig, dpo, ipo


def scores(chosen=-1.0, rejected=-3.0, ref_chosen=-2.0, ref_rejected=-2.0, nll=0.5):
    t = lambda x: torch.tensor([x], dtype=torch.float64)  # noqa: E731
    return PreferenceScores(chosen=t(chosen), rejected=t(rejected), ref_chosen=t(ref_chosen),
                            ref_rejected=t(ref_rejected), chosen_tokens=t(2.0), rejected_tokens=t(2.0),
                            chosen_nll=t(nll))


def config(**kw):
    return SimpleNamespace(**{"beta": 0.5, "label_smoothing": 0.0, "nll_coef": 0.0, **kw})


def test_defaults():
    c = DPOConfig()
    assert (c.beta, c.label_smoothing, c.nll_coef, c.precompute_reference) == (0.1, 0.0, 0.0, False)


def test_dpo_by_hand():
    # z = (−1 − −3) − (−2 − −2) = 2; βz = 1; L = −log σ(1) = log(1 + e^−1)
    loss, metrics = dpo(scores(), config=config())
    assert loss.item() == pytest.approx(math.log1p(math.exp(-1)), abs=1e-9)
    assert loss.item() == pytest.approx(0.3132617, abs=1e-6)
    assert metrics["reward/chosen"].item() == pytest.approx(0.5)    # 0.5·(−1 + 2)
    assert metrics["reward/rejected"].item() == pytest.approx(-0.5)  # 0.5·(−3 + 2)
    assert metrics["reward/margin"].item() == pytest.approx(1.0)
    assert metrics["accuracy"].item() == 1.0


def test_cdpo_label_smoothing_by_hand():
    # 0.8·(−log σ(1)) + 0.2·(−log σ(−1)) = 0.8·0.3132617 + 0.2·1.3132617
    loss, _ = dpo(scores(), config=config(label_smoothing=0.2))
    assert loss.item() == pytest.approx(0.8 * 0.3132617 + 0.2 * 1.3132617, abs=1e-6)
    assert loss.item() == pytest.approx(0.5132617, abs=1e-6)
    # ε = 0.5 makes the loss symmetric: the same for z and −z
    flipped, _ = dpo(scores(chosen=-3.0, rejected=-1.0), config=config(label_smoothing=0.5))
    half, _ = dpo(scores(), config=config(label_smoothing=0.5))
    assert flipped.item() == pytest.approx(half.item())


def test_ipo_by_hand():
    loss, metrics = ipo(scores(), config=config())                 # (2 − 1/(2·0.5))² = 1
    assert loss.item() == pytest.approx(1.0)
    loss, _ = ipo(scores(), config=config(beta=0.1))               # (2 − 5)² = 9
    assert loss.item() == pytest.approx(9.0)
    assert metrics["accuracy"].item() == 1.0


def test_nll_term_on_chosen():
    plain, _ = dpo(scores(), config=config())
    with_nll, _ = dpo(scores(nll=0.5), config=config(nll_coef=2.0))
    assert with_nll.item() == pytest.approx(plain.item() + 1.0)
    ipo_nll, _ = ipo(scores(nll=0.5), config=config(nll_coef=2.0))
    assert ipo_nll.item() == pytest.approx(2.0)


def test_gradient_raises_chosen_and_lowers_rejected():
    s = scores()
    s.chosen.requires_grad_(True)
    s.rejected.requires_grad_(True)
    loss, _ = dpo(s, config=config())
    loss.sum().backward()
    # dL/dchosen = −β(1 − σ(βz)) = −0.5·σ(−1)
    assert s.chosen.grad.item() == pytest.approx(-0.5 / (1 + math.e), abs=1e-9)
    assert s.rejected.grad.item() == pytest.approx(0.5 / (1 + math.e), abs=1e-9)


def test_ties_count_as_wrong_in_accuracy():
    _, metrics = dpo(scores(chosen=-2.0, rejected=-2.0), config=config())
    assert metrics["accuracy"].item() == 0.0


def test_gradient_at_z_zero_is_half_beta():
    # policy == reference (the first step) makes z exactly 0: dL/dchosen = −β σ(0) = −β/2
    s = scores(chosen=-2.0, rejected=-2.0)
    s.chosen.requires_grad_(True)
    loss, _ = dpo(s, config=config())
    loss.sum().backward()
    assert s.chosen.grad.item() == pytest.approx(-0.25, abs=1e-12)
