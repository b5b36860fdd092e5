"""GRPO (Shao et al. 2024, DeepSeekMath) and two variants, Dr.GRPO and GSPO.

GRPO: the advantage of sample i of a group of n is (r_i − mean_G r)/(std_G r + 1e-9)
(unbiased std), broadcast to every response token; no critic, no whitening; the
PPO-clip policy loss, token-mean over the optimizer step. KL, when on, is a loss term
(``algorithm.kl_loss``) or a reward penalty, as docs/algorithms/README.md describes.

Dr.GRPO (Liu et al. 2025): r_i − mean_G r without the std division, and the loss
normalised by a constant length (``seq_mean_token_sum_norm``) instead of each
response's own length.

GSPO (Zheng et al. 2025): GRPO advantages with the importance ratio taken per
sequence, exp(mean_t log π_θ/π_old), and the paper's clip range (3e-4, 4e-4).
"""

from dataclasses import dataclass

from rlx import AlgorithmSpec, hookimpl, ops
from rlx.config import ONLINE_DEFAULTS, ConfigError, LossAgg, OnlineConfig, opt


@dataclass
class GRPOConfig(OnlineConfig):
    def validate(self, config) -> None:
        super().validate(config)
        if self.n_samples < 2:
            raise ConfigError("group advantages need algorithm.n_samples >= 2 (a group of one has no baseline)")


@dataclass
class GSPOConfig(GRPOConfig):
    clip_low: float = opt(3e-4, "sequence-ratio clip epsilon below 1")
    clip_high: float = opt(4e-4, "sequence-ratio clip epsilon above 1")
    loss_agg: LossAgg = opt("seq_mean_token_mean", "GSPO averages per sequence first")


def group_norm(rewards, mask, *, kl, beta, values, group_ids, config, **_):
    """A_t = Σ_{t'≥t} R_t' with r_i group-normalised (γ = 1)."""
    r = ops.clip_rewards(ops.group_normalize(rewards, group_ids), config.reward_clip)
    advantages = ops.discounted_returns(ops.token_rewards(r, mask, kl, beta), gamma=1.0)
    return advantages, advantages, ops.group_metrics(rewards, group_ids)


def dr_grpo(rewards, mask, *, kl, beta, values, group_ids, config, **_):
    """As GRPO, but r_i − mean_G r: no division by the group's std."""
    r = ops.clip_rewards(ops.mean_baseline(rewards, group_ids), config.reward_clip)
    advantages = ops.discounted_returns(ops.token_rewards(r, mask, kl, beta), gamma=1.0)
    return advantages, advantages, ops.group_metrics(rewards, group_ids)


def gspo(logp, old_logp, advantages, mask, *, config):
    return ops.gspo_loss(logp, old_logp, advantages, mask, eps_low=config.clip_low, eps_high=config.clip_high)


GRPO = AlgorithmSpec(
    name="grpo", description="Group Relative Policy Optimization (group-normalised rewards, no critic)",
    loop="online", config=GRPOConfig, data="prompts", estimator="group_norm", policy_loss="ppo_clip",
    defaults=ONLINE_DEFAULTS)
DR_GRPO = AlgorithmSpec(
    name="dr_grpo", description="Dr.GRPO: GRPO without std normalisation, constant-length loss normaliser",
    loop="online", config=GRPOConfig, data="prompts", estimator="dr_grpo", policy_loss="ppo_clip",
    defaults={**ONLINE_DEFAULTS, "algorithm.loss_agg": "seq_mean_token_sum_norm"})
GSPO = AlgorithmSpec(
    name="gspo", description="GSPO: GRPO advantages with a sequence-level importance ratio",
    loop="online", config=GSPOConfig, data="prompts", estimator="group_norm", policy_loss="gspo",
    defaults=ONLINE_DEFAULTS)


@hookimpl
def register_algorithms(register):
    for spec in (GRPO, DR_GRPO, GSPO):
        register(spec.name, spec)


@hookimpl
def register_advantage_estimators(register):
    register("group_norm", group_norm)
    register("dr_grpo", dr_grpo)


@hookimpl
def register_policy_losses(register):
    register("gspo", gspo)
