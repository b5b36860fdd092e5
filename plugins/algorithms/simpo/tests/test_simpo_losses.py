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
