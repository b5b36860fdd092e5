"""rlx.ops against numbers worked out by hand from docs/algorithms/README.md."""

import math
import subprocess
import sys

import pytest
import torch

from rlx import ops

# The worked example: 2 prompts x 2 samples, prompt-major, T = 4 action positions.
#   row 0: 3 tokens then padding        mask [1, 1, 1, 0]
#   row 1: a tool token (mask 0) at t=1  mask [1, 0, 1, 1]
#   row 2: 2 tokens then padding        mask [1, 1, 0, 0]
#   row 3: full length                  mask [1, 1, 1, 1]
REWARDS = [1.0, 0.0, 2.0, 4.0]
MASK = [[1, 1, 1, 0], [1, 0, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]]


def t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def test_import_does_not_load_torch():
    code = "import rlx.ops, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- masked statistics ------------------------------------------------------------------
# x = [[1,2,3,4],[5,6,7,8]], mask [[1,1,0,0],[1,0,1,1]] selects 1,2 | 5,7,8.
X = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]
XM = [[1, 1, 0, 0], [1, 0, 1, 1]]


def test_masked_sum_mean_var():
    x, m = t(X), t(XM)
    close(ops.masked_sum(x, m), 23.0)
    close(ops.masked_sum(x, m, dim=-1), [3.0, 20.0])
    close(ops.masked_mean(x, m), 23 / 5)
    close(ops.masked_mean(x, m, dim=-1), [1.5, 20 / 3])
    # population variance of 1,2,5,7,8 (mean 4.6): (12.96+6.76+0.16+5.76+11.56)/5
    close(ops.masked_var(x, m), 37.2 / 5)
    # row 0: 1,2 -> 0.25; row 1: 5,7,8 (mean 20/3) -> (25/9 + 1/9 + 16/9)/3 = 14/9
    close(ops.masked_var(x, m, dim=-1), [0.25, 14 / 9])


def test_masked_mean_of_empty_row_is_zero():
    close(ops.masked_mean(t(X), t([[0, 0, 0, 0], [1, 0, 0, 0]]), dim=-1), [0.0, 5.0])


def test_masked_whiten():
    # masked 1,2,3: mean 2, population var 2/3, so scale sqrt(3/2); the masked 100 is shifted too
    out = ops.masked_whiten(t([[1.0, 2.0, 3.0, 100.0]]), t([[1, 1, 1, 0]]))
    s = math.sqrt(1.5)
    close(out, [[-s, 0.0, s, 98 * s]])


def test_masked_whiten_constant_and_low_precision():
    # σ² = 0 is floored at 1e-8: the result is 0, not NaN
    close(ops.masked_whiten(t([5.0, 5.0, 5.0]), t([1, 1, 1])), [0.0, 0.0, 0.0])
    out = ops.masked_whiten(t([1.0, 2.0, 3.0], torch.bfloat16), t([1, 1, 1]))
    assert out.dtype == torch.float32
    close(out, [-math.sqrt(1.5), 0.0, math.sqrt(1.5)], atol=1e-6)


# --- reward pipeline ----------------------------------------------------------------------


def test_group_baselines():
    r = t(REWARDS)  # groups [1, 0] and [2, 4]
    close(ops.rloo_baseline(r, 2), [1 - 0, 0 - 1, 2 - 4, 4 - 2])
    close(ops.mean_baseline(r, 2), [0.5, -0.5, -1.0, 1.0])
    # unbiased std: [1, 0] -> sqrt(0.5), [2, 4] -> sqrt(2); both give ±1/sqrt(2)
    h = 1 / math.sqrt(2)
    close(ops.group_normalize(r, 2), [h, -h, -h, h])
    # n = 3: [3, 0, 6] -> baselines (0+6)/2, (3+6)/2, (3+0)/2
    close(ops.rloo_baseline(t([3.0, 0.0, 6.0]), 3), [0.0, -4.5, 4.5])


def test_group_norm_of_equal_rewards_is_zero():
    close(ops.group_normalize(t([1.0, 1.0, 0.0, 0.0]), 2), [0.0, 0.0, 0.0, 0.0])


def test_group_baselines_reject_bad_groups():
    with pytest.raises(ValueError):
        ops.mean_baseline(t([1.0, 2.0, 3.0]), 2)
    with pytest.raises(ValueError):
        ops.rloo_baseline(t([1.0, 2.0]), 1)


def test_overlong_penalty():
    # L_max = 10, L_b = 4: the budget without penalty is 6; e = min(len - 6, 4)
    # lengths 5, 6, 8, 12 -> e = -1, 0, 2, 4 -> penalties 0, 0, 2/4, 4/4 (factor 1)
    out = ops.overlong_penalty(t(REWARDS), torch.tensor([5, 6, 8, 12]), max_len=10, buffer=4, factor=1.0)
    close(out, [1.0, 0.0, 1.5, 3.0])


def test_clip_rewards():
    close(ops.clip_rewards(t([-12.0, 3.0, 11.0])), [-10.0, 3.0, 10.0])
    close(ops.clip_rewards(t([-12.0, 3.0, 11.0]), limit=5.0), [-5.0, 3.0, 5.0])


# --- KL estimators -----------------------------------------------------------------------
# Δ = logp - ref = 0.5, -1, 20, -20


def test_kl_estimators():
    logp, ref = t([0.5, -1.0, 20.0, -20.0]), t([0.0, 0.0, 0.0, 0.0])
    close(ops.kl_k1(logp, ref), [0.5, -1.0, 10.0, -10.0])
    close(ops.kl_k2(logp, ref), [0.125, 0.5, 10.0, 10.0])
    # exp(-Δ) - 1 + Δ: e^-0.5 - 0.5, e - 2, ~19 -> 10, e^20 -> 10
    close(ops.kl_k3(logp, ref), [math.exp(-0.5) - 0.5, math.e - 2, 10.0, 10.0])
    assert ops.kl_estimator("k3") is ops.kl_k3
    with pytest.raises(ValueError, match="k1"):
        ops.kl_estimator("k4")


def test_kl_is_computed_in_float32():
    out = ops.kl_k3(t([0.5], torch.bfloat16), t([0.0], torch.bfloat16))
    assert out.dtype == torch.float32


# --- token rewards, returns, GAE -------------------------------------------------------
# With β = 0.1 and k_t = 1 everywhere, each action token pays -0.1 and the last one also
# gets r_i; masked-0 positions get nothing:
R = [
    [-0.1, -0.1, 0.9, 0.0],  # last action token t=2, r=1
    [-0.1, 0.0, -0.1, -0.1],  # tool token at t=1, last t=3, r=0
    [-0.1, 1.9, 0.0, 0.0],  # last t=1, r=2
    [-0.1, -0.1, -0.1, 3.9],  # last t=3, r=4
]


def test_token_rewards():
    kl = torch.ones(4, 4, dtype=torch.float64)
    close(ops.token_rewards(t(REWARDS), t(MASK), kl, beta=0.1), R)
    # KL as a loss: only the sequence reward at the last action token
    expected = [[0, 0, 1, 0], [0, 0, 0, 0], [0, 2, 0, 0], [0, 0, 0, 4]]
    close(ops.token_rewards(t(REWARDS), t(MASK)), expected)


def test_discounted_returns():
    # γ = 1: suffix sums of R
    expected = [[0.7, 0.8, 0.9, 0.0], [-0.3, -0.2, -0.2, -0.1], [1.8, 1.9, 0.0, 0.0], [3.6, 3.7, 3.8, 3.9]]
    close(ops.discounted_returns(t(R), 1.0), expected)
    # γ = 0.5, rows 0-1; the tool token at row 1, t=1 is a step: -0.075 = 0 + 0.5 * -0.15
    expected = [[0.075, 0.35, 0.9, 0.0], [-0.1375, -0.075, -0.15, -0.1]]
    close(ops.discounted_returns(t(R[:2]), 0.5), expected)


def test_gae():
    # rows 0-1, γ = λ = 0.5 (γλ = 0.25); values under mask 0 (pad 9, tool token 7) count as 0
    values = t([[1.0, 2.0, 3.0, 9.0], [0.5, 7.0, 1.0, 2.0]])
    adv, ret = ops.gae(t(R[:2]), values, t(MASK[:2]), gamma=0.5, lam=0.5)
    # row 0: δ = [-0.1+1-1, -0.1+1.5-2, 0.9+0-3, 0] = [-0.1, -0.6, -2.1, 0]
    #        A3 = 0, A2 = -2.1, A1 = -0.6 - 0.525, A0 = -0.1 + 0.25 * -1.125
    # row 1: V = [0.5, 0, 1, 2], δ = [-0.1+0-0.5, 0+0.5-0, -0.1+1-1, -0.1+0-2] = [-0.6, 0.5, -0.1, -2.1]
    #        A3 = -2.1, A2 = -0.1 - 0.525, A1 = 0.5 - 0.15625, A0 = -0.6 + 0.0859375
    close(adv, [[-0.38125, -1.125, -2.1, 0.0], [-0.5140625, 0.34375, -0.625, -2.1]])
    close(ret, [[0.61875, 0.875, 0.9, 0.0], [-0.0140625, 0.34375, 0.375, -0.1]])


def test_gae_with_unit_gamma_lambda_is_return_minus_value():
    torch.manual_seed(0)
    mask = t(MASK)
    values = torch.randn(4, 4, dtype=torch.float64)
    adv, ret = ops.gae(t(R), values, mask, gamma=1.0, lam=1.0)
    close(adv * mask, (ops.discounted_returns(t(R), 1.0) - values) * mask)
    close(ret * mask, ops.discounted_returns(t(R), 1.0) * mask)


# --- loss aggregation ----------------------------------------------------------------------


def test_aggregation_modes():
    x, m = t(X), t(XM)  # masked tokens 1,2 | 5,7,8
    close(ops.aggregate(x, m, "token_mean"), 23 / 5)
    close(ops.aggregate(x, m, "token_mean", token_count=10), 2.3)
    close(ops.aggregate(x, m, "seq_mean_token_mean"), (1.5 + 20 / 3) / 2)
    close(ops.aggregate(x, m, "seq_mean_token_sum_norm", max_len=8), (3 / 8 + 20 / 8) / 2)
    with pytest.raises(ValueError, match="max_len"):
        ops.aggregate(x, m, "seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="token_mean"):
        ops.aggregate(x, m, "sum")


@pytest.mark.parametrize("mode", sorted(ops.AGGREGATIONS))
def test_micro_batches_sum_to_the_whole_batch(mode):
    torch.manual_seed(0)
    per_token = torch.randn(6, 5, dtype=torch.float64)
    mask = (torch.rand(6, 5) > 0.3).double()
    mask[:, 0] = 1
    counts = dict(token_count=mask.sum(), seq_count=6, max_len=5)
    whole = ops.aggregate(per_token, mask, mode, max_len=5)
    parts = sum(ops.aggregate(per_token[s], mask[s], mode, **counts) for s in (slice(0, 2), slice(2, 3), slice(3, 6)))
    close(parts, whole.item(), atol=1e-12)


# --- policy and value losses ------------------------------------------------------------
# ρ = 1.5, 0.5, 1.1, 3 with A = 1, 1, -1, -1 (ε = 0.2); a fifth token is masked out.
#   t0: min(1.5, 1.2) = 1.2 (clipped)   t1: min(0.5, 0.8) = 0.5
#   t2: min(-1.1, -1.1) = -1.1          t3: min(-3, -1.2) = -3
RHO = [1.5, 0.5, 1.1, 3.0, 9.0]
ADV = [1.0, 1.0, -1.0, -1.0, 1.0]
PMASK = [1, 1, 1, 1, 0]


def test_ppo_clip_loss():
    logp = t([math.log(r) for r in RHO]).requires_grad_()
    loss, metrics = ops.ppo_clip_loss(logp, t([0.0] * 5), t(ADV), t(PMASK))
    close(loss[:4], [-1.2, -0.5, 1.1, 3.0])
    close(metrics["clip_frac"], 0.25)
    kl = [(r - 1) - math.log(r) for r in RHO[:4]]
    close(metrics["approx_kl"], sum(kl) / 4)
    # d/dlogp of -ρA is -ρA where unclipped, 0 where the clipped term is taken
    (loss * t(PMASK)).sum().backward()
    close(logp.grad, [0.0, -0.5, 1.1, 3.0, 0.0])


def test_ppo_dual_clip_and_clip_higher():
    logp, old, adv, mask = t([math.log(r) for r in RHO]), t([0.0] * 5), t(ADV), t(PMASK)
    # c = 2 for A < 0: t2 max(-1.1, -2) = -1.1, t3 max(-3, -2) = -2
    loss, _ = ops.ppo_clip_loss(logp, old, adv, mask, dual_clip=2.0)
    close(loss[:4], [-1.2, -0.5, 1.1, 2.0])
    # ε_high = 0.28: t0 min(1.5, 1.28)
    loss, _ = ops.ppo_clip_loss(logp, old, adv, mask, eps_high=0.28)
    close(loss[:4], [-1.28, -0.5, 1.1, 3.0])
    with pytest.raises(ValueError):
        ops.ppo_clip_loss(logp, old, adv, mask, dual_clip=0.5)


def test_ppo_log_ratio_is_clamped():
    loss, _ = ops.ppo_clip_loss(t([30.0]), t([0.0]), t([-1.0]), t([1]))
    close(loss, [math.exp(20)], atol=1e-3)


# GSPO: row 0 log-ratios 0.1, 0.2, 0.3 -> ρ = e^0.2; row 1 -0.3, 0.1 (and a masked 5) -> ρ = e^-0.1
G_LOGP = [[0.1, 0.2, 0.3], [-0.3, 0.1, 5.0]]
G_MASK = [[1, 1, 1], [1, 1, 0]]


def test_gspo_ratio_and_loss():
    logp, old, mask = t(G_LOGP).requires_grad_(), t([[0.0] * 3] * 2), t(G_MASK)
    close(ops.gspo_ratio(logp, old, mask), [math.exp(0.2), math.exp(-0.1)])
    adv = t([[1.0] * 3, [-1.0] * 3])
    loss, metrics = ops.gspo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    # row 0: min(1.2214, 1.2) = 1.2 (clipped); row 1: A < 0, e^-0.1 inside [0.8, 1.2]
    close(loss, [[-1.2] * 3, [math.exp(-0.1)] * 3])
    close(metrics["clip_frac"], 3 / 5)
    # the gradient is the sequence-level objective's: L = mean_i -min(ρ_i A_i, clip(ρ_i) A_i)
    ops.aggregate(loss, mask, "seq_mean_token_mean").backward()
    grad = logp.grad.clone()
    logp.grad = None
    rho = ops.gspo_ratio(logp, old, mask)
    a = t([1.0, -1.0])
    (-(rho * a).minimum(rho.clamp(0.8, 1.2) * a)).mean().backward()
    close(grad, logp.grad, atol=1e-12)
    # by hand: row 1 tokens get -A ρ / 2 tokens / 2 sequences
    close(grad[1, :2], [math.exp(-0.1) / 4] * 2)


def test_clipped_value_loss():
    # V = 2, 0, 1; V_old = 1; R = 3, 0.5, 1.2; ε_v = 0.5
    # t0: V̂ = 1.5 -> max(2.25, 1) ; t1: V̂ = 0.5 -> max(0, 0.25) ; t2: V̂ = 1 -> max(0.04, 0.04)
    values, old, returns, mask = t([2.0, 0.0, 1.0]), t([1.0, 1.0, 1.0]), t([3.0, 0.5, 1.2]), t([1, 1, 1])
    loss, metrics = ops.clipped_value_loss(values, old, returns, mask)
    close(loss, [0.5 * 2.25, 0.5 * 0.25, 0.5 * 0.04])
    close(metrics["clip_frac"], 1 / 3)
    loss, _ = ops.clipped_value_loss(values, old, returns, mask, clip=None)
    close(loss, [0.5 * 1.0, 0.5 * 0.25, 0.5 * 0.04])


def test_entropy_and_token_logprobs():
    logits = t([[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3), -1e9, -1e9]])
    # uniform over 4 -> log 4; probs 1/4, 3/4 -> -(1/4 log 1/4 + 3/4 log 3/4)
    close(ops.entropy_from_logits(logits), [math.log(4), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))])
    labels = torch.tensor([2, 1])
    close(ops.token_logprobs(logits, labels), [math.log(0.25), math.log(0.75)])
    # temperature 2 halves the logits: row 1 probs ∝ 1, sqrt(3)
    s3 = math.sqrt(3)
    close(ops.token_logprobs(logits, labels, temperature=2.0), [math.log(0.25), math.log(s3 / (1 + s3))])


# --- preference losses -----------------------------------------------------------------


def test_logsigmoid():
    x = t([-1000.0, -1.0, 0.0, 1.0, 1000.0])
    expected = [-1000.0, -math.log(1 + math.e), -math.log(2), -math.log(1 + math.exp(-1)), 0.0]
    close(ops.logsigmoid(x), expected)
    y = torch.randn(100, dtype=torch.float64) * 30
    close(ops.logsigmoid(y), torch.nn.functional.logsigmoid(y), atol=1e-12)


@pytest.mark.parametrize("x, dtype", [(0.0, torch.float32), (0.0, torch.float64), (16.0, torch.float32),
                                      (45.0, torch.float64), (-30.0, torch.float32), (-30.0, torch.float64)])
def test_logsigmoid_gradient_is_sigma_of_minus_x(x, dtype):
    # d/dx log σ(x) = σ(−x) = 1/(1 + e^x): exactly 0.5 at 0, tiny but not 0 for large x
    point = torch.tensor(x, dtype=dtype, requires_grad=True)
    ops.logsigmoid(point).backward()
    exact = 1 / (1 + math.exp(x))
    assert point.grad.item() == pytest.approx(exact, rel=1e-6 if dtype == torch.float32 else 1e-12, abs=0)
    if x == 0.0:
        assert point.grad.item() == 0.5


def test_dpo_and_ipo():
    # z = (-1 - -3) - (-2 - -2.5) = 1.5, β = 0.1 -> βz = 0.15
    args = t([-1.0]), t([-3.0]), t([-2.0]), t([-2.5])
    close(ops.dpo_loss(*args, beta=0.1), [math.log(1 + math.exp(-0.15))])
    smoothed = 0.9 * math.log(1 + math.exp(-0.15)) + 0.1 * math.log(1 + math.exp(0.15))
    close(ops.dpo_loss(*args, beta=0.1, label_smoothing=0.1), [smoothed])
    close(ops.ipo_loss(*args, beta=0.1), [(1.5 - 5.0) ** 2])
    close(ops.implicit_reward(t([-1.0]), t([-2.0]), 0.1), [0.1])


def test_reward_model_losses():
    rc, rr = t([2.0]), t([0.5])
    close(ops.bt_loss(rc, rr), [math.log(1 + math.exp(-1.5))])
    close(ops.bt_loss(rc, rr, margin=t([1.0])), [math.log(1 + math.exp(-0.5))])
    close(ops.log_exp_loss(rc, rr), [math.log(1 + math.exp(0.5 - 2.0))])


def test_kto_loss():
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    logratio, desirable = t([0.5, -0.2]), torch.tensor([True, False])
    # z0 = 0.3: desirable 1 - σ(0.1 * 0.2); undesirable 1.5 * (1 - σ(0.1 * 0.5))
    out = ops.kto_loss(logratio, 0.3, desirable, beta=0.1, w_d=1.0, w_u=1.5)
    close(out, [1 - sigmoid(0.02), 1.5 * (1 - sigmoid(0.05))])
    # a negative reference point is floored at 0, and no gradient flows into it
    z0 = t(-0.4).requires_grad_()
    out = ops.kto_loss(logratio, z0, desirable, beta=0.1)
    close(out, [1 - sigmoid(0.05), 1 - sigmoid(0.02)])
    assert not out.requires_grad
