"""GRPO, Dr.GRPO and GSPO parts against numbers worked out by hand."""

import pytest
import torch

from rlx.config import ConfigError, resolve
from rlx.plugins import build_host

HOST = build_host()
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0]])  # one prompt, n = 4
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0])


def estimate(name, algo, rewards=REWARDS, mask=MASK, group_ids=torch.zeros(4, dtype=torch.long)):
    config = resolve(HOST.algorithms.get(algo), {}).algorithm
    fn = HOST.get("register_advantage_estimators", name)
    return fn(rewards, mask, kl=None, beta=0.0, values=None, group_ids=group_ids, n_samples=4, config=config)


def test_group_norm():
    # mean 0.25; unbiased std sqrt((0.75² + 3·0.25²)/3) = 0.5 -> (1.5, -0.5, -0.5, -0.5) on every action token
    advantages, returns, metrics = estimate("group_norm", "grpo")
    expected = torch.tensor([[1.5, 1.5], [-0.5, 0.0], [-0.5, -0.5], [-0.5, 0.0]])
    assert torch.allclose(advantages, expected, atol=1e-6)
    assert torch.equal(advantages, returns)
    assert metrics == {"reward/group_std": pytest.approx(0.5), "reward/zero_std_groups": 0.0}


def test_groups_come_from_group_ids_not_positions():
    # two prompts interleaved (ids 7, 3, 7, 3): group 7 has rewards (1, 0), group 3 has (0, 0)
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    advantages, _, metrics = estimate("group_norm", "grpo", rewards, torch.ones(4, 1), torch.tensor([7, 3, 7, 3]))
    # group 7: mean 0.5, std sqrt(0.5) -> ±0.7071; group 3: all equal -> 0
    assert torch.allclose(advantages.squeeze(-1), torch.tensor([0.5 ** 0.5, 0.0, -(0.5 ** 0.5), 0.0]), atol=1e-6)
    assert metrics["reward/zero_std_groups"] == 1.0


def test_dr_grpo_has_no_std_division():
    advantages, _, _ = estimate("dr_grpo", "dr_grpo")
    assert torch.allclose(advantages, torch.tensor([[0.75, 0.75], [-0.25, 0.0], [-0.25, -0.25], [-0.25, 0.0]]))
    assert resolve(HOST.algorithms.get("dr_grpo"), {}).algorithm.loss_agg == "seq_mean_token_sum_norm"


def test_gspo_loss_at_ratio_one_is_minus_the_advantage():
    config = resolve(HOST.algorithms.get("gspo"), {}).algorithm
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = HOST.get("register_policy_losses", "gspo")(logp, logp.detach(), torch.tensor([[2.0, 2.0]]),
                                                          torch.ones(1, 2), config=config)
    assert torch.allclose(loss, torch.tensor([[-2.0, -2.0]]))
    assert (config.clip_low, config.clip_high) == (3e-4, 4e-4)


def test_groups_of_one_are_refused():
    with pytest.raises(ConfigError, match="n_samples >= 2"):
        resolve(HOST.algorithms.get("grpo"), {"algorithm": {"n_samples": 1}, "training": {"batch_size": 16,
                                                                                          "micro_batch_size": 16}})
