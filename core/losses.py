"""The PPO-clip policy loss and the clipped value loss, shared by every online algorithm.

They live in the core because PPO, GRPO, RLOO and REINFORCE++ all use them; a plugin
that wants another loss registers it under a new name.
"""

from rlx import ops
from rlx.hookspecs import hookimpl


def ppo_clip(logp, old_logp, advantages, mask, *, config):
    """ℓ_t = −min(ρA, clip(ρ, 1 − ε_low, 1 + ε_high)A), with the optional dual clip."""
    return ops.ppo_clip_loss(logp, old_logp, advantages, mask, eps_low=config.clip_low,
                             eps_high=config.clip_high, dual_clip=config.dual_clip or None)


def clipped_value(values, old_values, returns, mask, *, config):
    """0.5·max((V̂ − R)², (V − R)²) with V̂ the old value moved at most ε_v."""
    return ops.clipped_value_loss(values, old_values, returns, mask, clip=config.value_clip or None)


@hookimpl
def register_policy_losses(register):
    register("ppo_clip", ppo_clip)


@hookimpl
def register_value_losses(register):
    register("clipped_value", clipped_value)
