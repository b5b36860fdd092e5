"""ORPO against numbers worked out by hand."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlx.algorithm import PreferenceScores
from rlx_orpo import ORPO, ORPOConfig, log_odds, orpo


def scores(chosen_p, chosen_tokens, rejected_p, rejected_tokens):
    """Pairs whose every token has probability p: summed log-prob = tokens · log p."""
    t = lambda x: torch.tensor([x], dtype=torch.float64)  # noqa: E731
    return PreferenceScores(chosen=t(chosen_tokens * math.log(chosen_p)), rejected=t(rejected_tokens * math.log(rejected_p)),
                            chosen_tokens=t(chosen_tokens), rejected_tokens=t(rejected_tokens))


def test_defaults():
    assert ORPOConfig().lam == 0.1
    assert ORPO.needs_reference is False


def test_odds_by_hand():
    # p = 0.5: odds 1, log odds 0; p = 0.2: odds 0.25; p = 0.8: odds 4
    values = log_odds(torch.tensor([math.log(0.5), math.log(0.2), math.log(0.8)], dtype=torch.float64))
    assert values.tolist() == pytest.approx([0.0, math.log(0.25), math.log(4.0)], abs=1e-9)


def test_log_odds_is_finite_at_the_ends():
    values = log_odds(torch.tensor([0.0, -1e-9, -50.0]))
    assert torch.isfinite(values).all()
    assert values[2].item() == pytest.approx(-50.0, abs=1e-4)  # p → 0: log odds → log p


def test_orpo_by_hand():
    # chosen p = 0.5 over 2 tokens, rejected p = 0.2 over 3: log odds ratio = 0 − log 0.25 = log 4
    # L = −log 0.5 − 0.1·log σ(log 4) = log 2 + 0.1·log(1.25)
    loss, metrics = orpo(scores(0.5, 2, 0.2, 3), config=SimpleNamespace(lam=0.1))
    assert loss.item() == pytest.approx(math.log(2) + 0.1 * math.log(1.25), abs=1e-9)
    assert loss.item() == pytest.approx(0.7154616, abs=1e-6)
    assert metrics["log_odds_ratio"].item() == pytest.approx(math.log(4.0))
    assert metrics["nll"].item() == pytest.approx(math.log(2))
    assert metrics["accuracy"].item() == 1.0


def test_lambda_zero_is_sft_on_chosen():
    loss, _ = orpo(scores(0.5, 2, 0.2, 3), config=SimpleNamespace(lam=0.0))
    assert loss.item() == pytest.approx(math.log(2))


def test_nll_is_per_token():
    a, _ = orpo(scores(0.5, 2, 0.2, 3), config=SimpleNamespace(lam=0.1))
    b, _ = orpo(scores(0.5, 7, 0.2, 5), config=SimpleNamespace(lam=0.1))
    assert a.item() == pytest.approx(b.item())
