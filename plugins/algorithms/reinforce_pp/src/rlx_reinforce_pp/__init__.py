"""REINFORCE++ (Hu 2025) and REINFORCE++-baseline.

REINFORCE++: R_t = −β·k_t + [t last]·clip(r_i); A_t = Σ_{t'≥t} γ^{t'−t} R_t'; then A is
whitened over every action token of the rollout batch. No critic; PPO-clip policy loss.
REINFORCE++-baseline subtracts the group mean, r_i − mean_G r, first (γ = 1), then
proceeds the same way; robust to reward scale, so suited to rule rewards.
"""

from dataclasses import dataclass

from rlx import AlgorithmSpec, hookimpl, ops
from rlx.config import ONLINE_DEFAULTS, OnlineConfig, opt


@dataclass
class ReinforceConfig(OnlineConfig):
    kl_coef: float = opt(0.01, "KL coefficient beta, in the reward by default")


def reinforce(rewards, mask, *, kl, beta, values, n_samples, config):
    r = ops.clip_rewards(rewards, config.reward_clip)
    returns = ops.discounted_returns(ops.token_rewards(r, mask, kl, beta), gamma=config.gamma)
    return ops.masked_whiten(returns, mask), returns


def reinforce_baseline(rewards, mask, *, kl, beta, values, n_samples, config):
    r = ops.clip_rewards(ops.mean_baseline(rewards, n_samples), config.reward_clip)
    returns = ops.discounted_returns(ops.token_rewards(r, mask, kl, beta), gamma=1.0)
    return ops.masked_whiten(returns, mask), returns


REINFORCE_PP = AlgorithmSpec(
    name="reinforce_pp", description="REINFORCE++: discounted returns with per-token KL, whitened over the batch",
    loop="online", config=ReinforceConfig, data="prompts", estimator="reinforce", policy_loss="ppo_clip",
    needs_reference=True, defaults=ONLINE_DEFAULTS)
REINFORCE_PP_BASELINE = AlgorithmSpec(
    name="reinforce_pp_baseline", description="REINFORCE++ with the group-mean baseline",
    loop="online", config=ReinforceConfig, data="prompts", estimator="reinforce_baseline",
    policy_loss="ppo_clip", needs_reference=True, defaults=ONLINE_DEFAULTS)


@hookimpl
def register_algorithms(register):
    register("reinforce_pp", REINFORCE_PP)
    register("reinforce_pp_baseline", REINFORCE_PP_BASELINE)


@hookimpl
def register_advantage_estimators(register):
    register("reinforce", reinforce)
    register("reinforce_baseline", reinforce_baseline)
