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
    args = dict(kl=None, beta=0.0, values=None, group_ids=torch.zeros(2, dtype=torch.long), n_samples=2,
                config=config) | kw
    return fn(torch.tensor(rewards), MASK, **args)[:2]


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


def test_baseline_without_std_norm_only_centres():
    # returns [[.5, .5], [−.5, 0]]; mean over the 3 action tokens 1/6 -> A = returns − 1/6 everywhere
    advantages, returns = estimate("reinforce_baseline_no_std", [1.0, 0.0])
    assert torch.allclose(returns, torch.tensor([[0.5, 0.5], [-0.5, 0.0]]))
    assert torch.allclose(advantages, returns - 1 / 6, atol=1e-6)
    spec = HOST.algorithms.get("reinforce_pp_baseline_no_std")
    assert (spec.estimator, spec.policy_loss) == ("reinforce_baseline_no_std", "ppo_clip")


def test_reward_clip_zero_means_no_clipping():
    config = resolve(HOST.algorithms.get("reinforce_pp"), {"algorithm": {"reward_clip": 0}}).algorithm
    _, returns = estimate("reinforce", [25.0, -30.0], config=config)
    assert torch.allclose(returns, torch.tensor([[25.0, 25.0], [-30.0, 0.0]]))
    _, clipped = estimate("reinforce", [25.0, -30.0])  # the default clips to [-10, 10]
    assert torch.allclose(clipped, torch.tensor([[10.0, 10.0], [-10.0, 0.0]]))
