"""The shared maths of the online loop against hand-worked values: groups taken from
group ids, sequence counts that skip empty rows, reward clipping, off-policy corrections."""

import math

import pytest
import torch

from rlx import ops
from rlx.algorithm import call_with_accepted


def close(x, expected, atol=1e-6):
    assert torch.allclose(torch.as_tensor(x, dtype=torch.float64),
                          torch.as_tensor(expected, dtype=torch.float64), atol=atol), (x, expected)


# --- groups by id --------------------------------------------------------------------------


def test_group_ids_in_any_order_give_the_contiguous_answer():
    rewards = torch.tensor([1.0, 2.0, 0.0, 4.0])  # prompt a: 1, 0; prompt b: 2, 4
    ids = torch.tensor([5, 9, 5, 9])
    close(ops.rloo_baseline(rewards, ids), [1.0, -2.0, -1.0, 2.0])
    close(ops.mean_baseline(rewards, ids), [0.5, -1.0, -0.5, 1.0])
    h = 1 / math.sqrt(2)
    close(ops.group_normalize(rewards, ids), [h, -h, -h, h])


def test_groups_of_different_sizes():
    # a: [3, 0, 6] (rloo baselines 3, 4.5, 1.5), b: [1, 1] (equal: std 0)
    rewards = torch.tensor([3.0, 1.0, 0.0, 6.0, 1.0])
    ids = torch.tensor([0, 1, 0, 0, 1])
    close(ops.rloo_baseline(rewards, ids), [0.0, 0.0, -4.5, 4.5, 0.0])
    metrics = ops.group_metrics(rewards, ids)
    assert metrics["reward/zero_std_groups"] == 1.0
    assert metrics["reward/group_std"] == pytest.approx((3.0 + 0.0) / 2)  # std of [3, 0, 6] is 3


def test_a_group_of_one_is_refused_with_its_size():
    with pytest.raises(ValueError, match="at least 2 samples per group; a group has 1"):
        ops.group_normalize(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]))


# --- sequence counts -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_a_row_without_action_tokens_does_not_count(mode):
    per_token = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    alone = ops.aggregate(per_token[:1], mask[:1], mode, max_len=2)
    close(ops.aggregate(per_token, mask, mode, max_len=2), alone.item())
    assert ops.sequence_count(mask).item() == 1


def test_reward_clip_zero_or_none_is_off():
    rewards = torch.tensor([-30.0, 2.0, 25.0])
    close(ops.clip_rewards(rewards, 0), [-30.0, 2.0, 25.0])
    close(ops.clip_rewards(rewards, None), [-30.0, 2.0, 25.0])
    close(ops.clip_rewards(rewards, 10.0), [-10.0, 2.0, 10.0])


# --- off-policy corrections ----------------------------------------------------------------
# w = exp(old − rollout) = 0.25, 1, 2, 8 on four tokens; the fourth row token is padding.

OLD = torch.log(torch.tensor([[0.25, 1.0], [2.0, 8.0]]))
ROLLOUT = torch.zeros(2, 2)
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
LOSS = torch.tensor([[1.0, 1.0], [1.0, 1.0]])


def test_tis_clamps_the_weight():
    loss, metrics = ops.tis(LOSS, OLD, ROLLOUT, MASK, low=0.5, high=5.0)
    close(loss, [[0.5, 1.0], [2.0, 5.0]])
    close(metrics["correction/clipped_frac"], 1 / 3)  # 0.25 of the 3 action tokens (8 is padding)
    close(metrics["correction/rollout_kl"], -(math.log(0.25) + 0 + math.log(2.0)) / 3)


def test_icepop_masks_outside_the_band_without_nan():
    old = OLD.clone()
    old[0, 0] = float("inf")  # an infinite weight is masked, not NaN
    per_token = LOSS.clone().requires_grad_()
    loss, metrics = ops.icepop(per_token, old, ROLLOUT, MASK, low=0.5, high=5.0)
    close(loss.detach(), [[0.0, 1.0], [2.0, 0.0]])
    (loss * MASK).sum().backward()
    assert torch.isfinite(per_token.grad).all()
    close(per_token.grad, [[0.0, 1.0], [2.0, 0.0]])
    close(metrics["correction/masked_frac"], 1 / 3)


def test_seq_mask_tis_masks_whole_sequences_by_their_geometric_mean_weight():
    # row 0: exp(mean(log .25, log 1)) = 0.5 -> kept (band [0.5, 5]); row 1: only token 0 counts, 2 -> kept
    loss, metrics = ops.seq_mask_tis(LOSS, OLD, ROLLOUT, MASK, low=0.5, high=5.0)
    close(loss, [[0.25, 1.0], [2.0, 8.0]])  # the unclamped w multiplies kept tokens
    close(metrics["correction/masked_seq_frac"], 0.0)
    loss, metrics = ops.seq_mask_tis(LOSS, OLD, ROLLOUT, MASK, low=0.6, high=5.0)
    close(loss, [[0.0, 0.0], [2.0, 8.0]])
    close(metrics["correction/masked_seq_frac"], 0.5)


def test_parts_get_only_the_arguments_they_take():
    def old_style(logp, *, config):
        return ("old", config)

    def new_style(logp, *, config, rollout_logp):
        return ("new", rollout_logp)

    def open_style(logp, **kwargs):
        return sorted(kwargs)

    assert call_with_accepted(old_style, 1, config="c", rollout_logp="r") == ("old", "c")
    assert call_with_accepted(new_style, 1, config="c", rollout_logp="r") == ("new", "r")
    assert call_with_accepted(open_style, 1, config="c", rollout_logp="r") == ["config", "rollout_logp"]
