"""The PPO parts against numbers worked out by hand."""

import torch

from rlx.config import resolve
from rlx.plugins import build_host

HOST = build_host()
CONFIG = resolve(HOST.algorithms.get("ppo"), {}).algorithm


def test_gae_with_values():
    # R = [0, 1]; δ_1 = 1 − 0.8 = 0.2, δ_0 = 0.8 − 0.5 = 0.3; A = [0.5, 0.2], returns = A + V = [1, 1]
    mask = torch.ones(1, 2)
    advantages, returns = HOST.get("register_advantage_estimators", "gae")(
        torch.tensor([1.0]), mask, kl=None, beta=0.0, values=torch.tensor([[0.5, 0.8]]), group_ids=torch.zeros(1, dtype=torch.long),
        n_samples=1, config=CONFIG)
    assert torch.allclose(returns, torch.tensor([[1.0, 1.0]]))
    assert torch.allclose(advantages, torch.tensor([[1.0, -1.0]]), atol=1e-5)  # [0.5, 0.2] whitened


def test_clipped_value_loss():
    # V_old 0, V 1, R 2, ε 0.5: V̂ = 0.5; max((0.5 − 2)², (1 − 2)²) = 2.25; loss 0.5 · 2.25
    loss, _ = HOST.get("register_value_losses", "clipped_value")(
        torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.tensor([[2.0]]), torch.ones(1, 1), config=CONFIG)
    assert torch.allclose(loss, torch.tensor([[1.125]]))


def test_ppo_uses_a_critic_and_kl_in_the_reward():
    spec = HOST.algorithms.get("ppo")
    assert (spec.estimator, spec.value_loss, spec.policy_loss) == ("gae", "clipped_value", "ppo_clip")
    assert CONFIG.kl_coef > 0 and not CONFIG.kl_loss
