"""The PPO-clip policy loss, the clipped value loss and the off-policy corrections,
shared by every online algorithm.

They live in the core because PPO, GRPO, RLOO and REINFORCE++ all use them; a plugin
that wants another loss or correction registers it under a new name.
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


def tis(per_token, old_logp, rollout_logp, mask, *, config):
    """Truncated importance sampling: clamp(w, lo, hi)·ℓ."""
    return ops.tis(per_token, old_logp, rollout_logp, mask, config.correction_low, config.correction_high)


def icepop(per_token, old_logp, rollout_logp, mask, *, config):
    """ICEPOP: w·ℓ where lo ≤ w ≤ hi, 0 elsewhere."""
    return ops.icepop(per_token, old_logp, rollout_logp, mask, config.correction_low, config.correction_high)


def seq_mask_tis(per_token, old_logp, rollout_logp, mask, *, config):
    """Sequence-masked TIS: w·ℓ for sequences whose geometric-mean weight lies in [lo, hi]."""
    return ops.seq_mask_tis(per_token, old_logp, rollout_logp, mask, config.correction_low,
                            config.correction_high)


@hookimpl
def register_off_policy_corrections(register):
    register("tis", tis)
    register("icepop", icepop)
    register("seq_mask_tis", seq_mask_tis)


@hookimpl
def register_policy_losses(register):
    register("ppo_clip", ppo_clip)


@hookimpl
def register_value_losses(register):
    register("clipped_value", clipped_value)
