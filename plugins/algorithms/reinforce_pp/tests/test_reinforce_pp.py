"""REINFORCE++ estimators against numbers worked out by hand."""

import math

import torch

from rlx.config import resolve
from rlx.plugins import build_host

HOST = build_host()
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
W = 1 / math.sqrt(2)  # whitened [1, 1, 0]: mean 2/3, σ² = 2/9 -> (±1/3)/(√2/3)


def estimate(name, rewards, **kw):
    config = resolve(HOST.algorithms.get("reinforce_pp"), {}).algorithm
    fn = HOST.get("register_advantage_estimators", name)
    args = dict(kl=None, beta=0.0, values=None, n_samples=2, config=config) | kw
    return fn(torch.tensor(rewards), MASK, **args)


def test_reinforce_whitens_returns():
    advantages, returns = estimate("reinforce", [1.0, 0.0])
    assert torch.allclose(returns, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    assert torch.allclose(advantages * MASK, torch.tensor([[W, W], [-2 * W, 0.0]]), atol=1e-5)


def test_kl_enters_the_reward_per_token():
    kl = torch.tensor([[0.5, 1.0], [2.0, 0.0]])
    _, returns = estimate("reinforce", [1.0, 0.0], kl=kl, beta=0.1)
    # R = [[-0.05, -0.1 + 1], [-0.2, 0]]; returns sum from t onwards
    assert torch.allclose(returns, torch.tensor([[0.85, 0.9], [-0.2, 0.0]]))


def test_baseline_subtracts_the_group_mean():
    # r − mean = (0.5, −0.5) -> returns [[.5, .5], [−.5, 0]]; whitened over [.5, .5, −.5] like [1, 1, 0]
    advantages, returns = estimate("reinforce_baseline", [1.0, 0.0])
    assert torch.allclose(returns, torch.tensor([[0.5, 0.5], [-0.5, 0.0]]))
    assert torch.allclose(advantages * MASK, torch.tensor([[W, W], [-2 * W, 0.0]]), atol=1e-5)
