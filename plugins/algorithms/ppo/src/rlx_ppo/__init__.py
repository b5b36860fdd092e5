"""PPO for language models (Schulman et al. 2017; Ouyang et al. 2022).

A critic V (a value head on a copy of the starting model) estimates returns. Token
rewards R_t = −β·k_t + [t last]·clip(r_i); δ_t = R_t + γV_{t+1} − V_t;
A_t = Σ_l (γλ)^l δ_{t+l}; returns = A + V; A is whitened over the batch. The actor
takes the PPO-clip loss, the critic 0.5·max((V̂ − R)², (V − R)²) with V̂ the old value
moved at most ε_v.
"""

from dataclasses import dataclass

from rlx import AlgorithmSpec, hookimpl, ops
from rlx.config import ONLINE_DEFAULTS, OnlineConfig, opt


@dataclass
class PPOConfig(OnlineConfig):
    kl_coef: float = opt(0.01, "KL coefficient beta, in the reward by default")
    critic_lr: float = opt(1e-4, "critic learning rate")
    value_clip: float = opt(0.5, "value clip epsilon (0: plain squared error)")


def gae(rewards, mask, *, kl, beta, values, config, **_):
    r = ops.clip_rewards(rewards, config.reward_clip)
    advantages, returns = ops.gae(ops.token_rewards(r, mask, kl, beta), values, mask, config.gamma, config.lam)
    return ops.masked_whiten(advantages, mask), returns


PPO = AlgorithmSpec(
    name="ppo", description="PPO with a critic and GAE",
    loop="online", config=PPOConfig, data="prompts", estimator="gae", policy_loss="ppo_clip",
    value_loss="clipped_value", needs_reference=True, defaults=ONLINE_DEFAULTS)


@hookimpl
def register_algorithms(register):
    register("ppo", PPO)


@hookimpl
def register_advantage_estimators(register):
    register("gae", gae)
