"""SimPO against numbers worked out by hand."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlx.algorithm import PreferenceScores
from rlx_simpo import SIMPO, SimPOConfig, simpo


def scores(chosen, chosen_tokens, rejected, rejected_tokens):
    t = lambda x: torch.tensor([x], dtype=torch.float64)  # noqa: E731
    return PreferenceScores(chosen=t(chosen), rejected=t(rejected), chosen_tokens=t(chosen_tokens),
                            rejected_tokens=t(rejected_tokens))


def test_defaults_are_the_papers_and_reference_free():
    assert (SimPOConfig().beta, SimPOConfig().gamma) == (2.0, 0.5)
    assert SIMPO.needs_reference is False


def test_simpo_by_hand():
    # β/|y_c|·log π_c − β/|y_r|·log π_r − γ = 2·(−4/2) − 2·(−9/3) − 0.5 = 1.5
    loss, metrics = simpo(scores(-4.0, 2, -9.0, 3), config=SimpleNamespace(beta=2.0, gamma=0.5))
    assert loss.item() == pytest.approx(math.log1p(math.exp(-1.5)), abs=1e-9)
    assert loss.item() == pytest.approx(0.2014133, abs=1e-6)
    assert metrics["reward/chosen"].item() == pytest.approx(-4.0)
    assert metrics["reward/rejected"].item() == pytest.approx(-6.0)
    assert metrics["reward/margin"].item() == pytest.approx(2.0)
    assert metrics["accuracy"].item() == 1.0


def test_length_normalisation():
    cfg = SimpleNamespace(beta=2.0, gamma=0.5)
    # the same summed log-probs over twice the chosen length: 2·(−4/4) + 6 − 0.5 = 3.5
    loss, _ = simpo(scores(-4.0, 4, -9.0, 3), config=cfg)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-3.5)), abs=1e-9)
    # a longer rejected response with the same mean log-prob changes nothing
    a, _ = simpo(scores(-4.0, 2, -9.0, 3), config=cfg)
    b, _ = simpo(scores(-4.0, 2, -30.0, 10), config=cfg)
    assert a.item() == pytest.approx(b.item())
    # rejected preferred on sums (−9 > −10) but not per token (−3 < −2.5 is false): normalised wins
    _, metrics = simpo(scores(-10.0, 4, -9.0, 3), config=cfg)
    assert metrics["accuracy"].item() == 1.0


def test_gamma_is_a_margin():
    loss, _ = simpo(scores(-2.0, 2, -2.0, 2), config=SimpleNamespace(beta=2.0, gamma=1.0))
    assert loss.item() == pytest.approx(math.log1p(math.exp(1.0)), abs=1e-9)  # −log σ(−1)


# --- label smoothing and CPO-SimPO ------------------------------------------------------------------------------

from rlx_simpo import CPO_SIMPO, CPOSimPOConfig, cpo_simpo  # noqa: E402


def test_label_smoothing_defaults_to_the_papers_loss():
    assert SimPOConfig().label_smoothing == 0.0
    plain, _ = simpo(scores(-4.0, 2, -9.0, 3), config=SimpleNamespace(beta=2.0, gamma=0.5))
    zero, _ = simpo(scores(-4.0, 2, -9.0, 3), config=SimpleNamespace(beta=2.0, gamma=0.5, label_smoothing=0.0))
    assert zero.item() == plain.item()


def test_label_smoothing_by_hand():
    # m = 1.5 as in test_simpo_by_hand; ε = 0.1: 0.9·log(1 + e^−1.5) + 0.1·log(1 + e^1.5)
    loss, _ = simpo(scores(-4.0, 2, -9.0, 3), config=SimpleNamespace(beta=2.0, gamma=0.5, label_smoothing=0.1))
    assert loss.item() == pytest.approx(0.9 * math.log1p(math.exp(-1.5)) + 0.1 * math.log1p(math.exp(1.5)), abs=1e-9)
    assert loss.item() == pytest.approx(0.9 * 0.2014133 + 0.1 * 1.7014133, abs=1e-6)


def test_cpo_simpo_by_hand():
    assert (CPOSimPOConfig().beta, CPOSimPOConfig().gamma, CPOSimPOConfig().cpo_alpha) == (2.0, 0.5, 1.0)
    assert CPO_SIMPO.needs_reference is False
    cfg = SimpleNamespace(beta=2.0, gamma=0.5, label_smoothing=0.0, cpo_alpha=0.5)
    # SimPO part log(1 + e^−1.5) = 0.2014133; chosen NLL per token = 4/2 = 2; α = 0.5
    loss, metrics = cpo_simpo(scores(-4.0, 2, -9.0, 3), config=cfg)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-1.5)) + 0.5 * 2.0, abs=1e-9)
    assert metrics["nll"].item() == pytest.approx(2.0)
    assert metrics["reward/margin"].item() == pytest.approx(2.0)
    # a given chosen NLL is used as it is
    s = scores(-4.0, 2, -9.0, 3)
    s.chosen_nll = torch.tensor([3.0], dtype=torch.float64)
    assert cpo_simpo(s, config=cfg)[0].item() == pytest.approx(math.log1p(math.exp(-1.5)) + 1.5, abs=1e-9)
    # the NLL term pulls the chosen log-prob up by α per token on top of SimPO's push: d/dchosen = −β/2·σ(−1.5) − α/2
    s = scores(-4.0, 2, -9.0, 3)
    s.chosen.requires_grad_(True)
    cpo_simpo(s, config=cfg)[0].sum().backward()
    assert s.chosen.grad.item() == pytest.approx(-(2.0 / 2) / (1 + math.exp(1.5)) - 0.5 / 2, abs=1e-9)
