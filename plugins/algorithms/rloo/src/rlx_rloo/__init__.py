"""RLOO, REINFORCE leave-one-out (Ahmadian et al. 2024).

Each sample's baseline is the mean reward of the other n − 1 samples of its prompt:
r_i − (Σ_G r_j − r_i)/(n − 1); the clipped reward, with the KL penalty per token when
on, is summed into returns (γ = 1). No critic, no whitening; PPO-clip policy loss.
"""

from dataclasses import dataclass

from rlx import AlgorithmSpec, hookimpl, ops
from rlx.config import ONLINE_DEFAULTS, OnlineConfig, ConfigError


@dataclass
class RLOOConfig(OnlineConfig):
    def validate(self, config) -> None:
        super().validate(config)
        if self.n_samples < 2:
            raise ConfigError("rloo needs algorithm.n_samples >= 2 (the baseline leaves one out)")


def rloo(rewards, mask, *, kl, beta, values, group_ids, config, **_):
    r = ops.clip_rewards(ops.rloo_baseline(rewards, group_ids), config.reward_clip)
    advantages = ops.discounted_returns(ops.token_rewards(r, mask, kl, beta), gamma=1.0)
    return advantages, advantages, ops.group_metrics(rewards, group_ids)


RLOO = AlgorithmSpec(
    name="rloo", description="REINFORCE leave-one-out: each sample's baseline is its group's other samples",
    loop="online", config=RLOOConfig, data="prompts", estimator="rloo", policy_loss="ppo_clip",
    defaults=ONLINE_DEFAULTS)


@hookimpl
def register_algorithms(register):
    register("rloo", RLOO)


@hookimpl
def register_advantage_estimators(register):
    register("rloo", rloo)
