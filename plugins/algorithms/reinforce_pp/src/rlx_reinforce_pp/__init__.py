"""REINFORCE++ (Hu 2025) and REINFORCE++-baseline.

REINFORCE++: R_t = −β·k_t + [t last]·clip(r_i); A_t = Σ_{t'≥t} γ^{t'−t} R_t'; then A is
whitened over every action token of the rollout batch. No critic; PPO-clip policy loss.
REINFORCE++-baseline subtracts the group mean, r_i − mean_G r, first (γ = 1), then
proceeds the same way; robust to reward scale, so suited to rule rewards.
REINFORCE++-baseline without std normalisation (OpenRLHF's ``--no_advantage_std_norm``)
only centres the returns, A ← A − μ, keeping the reward's own scale.
"""

from dataclasses import dataclass

from rlx import AlgorithmSpec, hookimpl, ops
from rlx.config import ONLINE_DEFAULTS, OnlineConfig, opt


@dataclass
class ReinforceConfig(OnlineConfig):
    kl_coef: float = opt(0.01, "KL coefficient beta, in the reward by default")


def reinforce(rewards, mask, *, kl, beta, values, config, **_):
    r = ops.clip_rewards(rewards, config.reward_clip)
    returns = ops.discounted_returns(ops.token_rewards(r, mask, kl, beta), gamma=config.gamma)
    return ops.masked_whiten(returns, mask), returns


def baseline_returns(rewards, mask, kl, beta, group_ids, config):
    r = ops.clip_rewards(ops.mean_baseline(rewards, group_ids), config.reward_clip)
    return ops.discounted_returns(ops.token_rewards(r, mask, kl, beta), gamma=1.0)


def reinforce_baseline(rewards, mask, *, kl, beta, values, group_ids, config, **_):
    returns = baseline_returns(rewards, mask, kl, beta, group_ids, config)
    return ops.masked_whiten(returns, mask), returns, ops.group_metrics(rewards, group_ids)


def reinforce_baseline_no_std(rewards, mask, *, kl, beta, values, group_ids, config, **_):
    returns = baseline_returns(rewards, mask, kl, beta, group_ids, config)
    return ops.masked_center(returns, mask), returns, ops.group_metrics(rewards, group_ids)


REINFORCE_PP = AlgorithmSpec(
    name="reinforce_pp", description="REINFORCE++: discounted returns with per-token KL, whitened over the batch",
    loop="online", config=ReinforceConfig, data="prompts", estimator="reinforce", policy_loss="ppo_clip",
    needs_reference=True, defaults=ONLINE_DEFAULTS)
REINFORCE_PP_BASELINE = AlgorithmSpec(
    name="reinforce_pp_baseline", description="REINFORCE++ with the group-mean baseline",
    loop="online", config=ReinforceConfig, data="prompts", estimator="reinforce_baseline",
    policy_loss="ppo_clip", needs_reference=True, defaults=ONLINE_DEFAULTS)
REINFORCE_PP_BASELINE_NO_STD = AlgorithmSpec(
    name="reinforce_pp_baseline_no_std",
    description="REINFORCE++-baseline with returns centred, not divided by their std",
    loop="online", config=ReinforceConfig, data="prompts", estimator="reinforce_baseline_no_std",
    policy_loss="ppo_clip", needs_reference=True, defaults=ONLINE_DEFAULTS)


@hookimpl
def register_algorithms(register):
    for spec in (REINFORCE_PP, REINFORCE_PP_BASELINE, REINFORCE_PP_BASELINE_NO_STD):
        register(spec.name, spec)


@hookimpl
def register_advantage_estimators(register):
    register("reinforce", reinforce)
    register("reinforce_baseline", reinforce_baseline)
    register("reinforce_baseline_no_std", reinforce_baseline_no_std)
