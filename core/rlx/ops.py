"""The shared maths of every rlx algorithm: masked statistics, reward shaping, returns,
advantages, KL estimators, loss aggregation and the policy, value and preference losses.

Each function cites the step of docs/algorithms/README.md it implements. Shapes:
``[B, T]`` is a batch of B responses of T action tokens, right-padded; ``mask`` is 1 on
tokens that get a gradient and 0 on padding and on tool/environment tokens inside a
response.

Importing this module must not import torch (plugins that ``rlx plugins list`` loads
import it), so the maths is written with tensor methods only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from torch import Tensor


def _at_least_f32(x: Tensor) -> Tensor:
    """Upcast half/bfloat16 (and integer) tensors to float32; float64 stays float64."""
    return x if x.is_floating_point() and x.element_size() >= 4 else x.float()


# ---------------------------------------------------------------------------------------
# Masked statistics


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ x·m over ``dim`` (all elements when ``dim`` is None)."""
    x = x * mask
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ x·m / Σ m over ``dim``; an empty mask gives 0 rather than NaN."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def logp_mismatch(rollout_logp: Tensor, old_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """Mean and largest |log π_rollout − log π_old| over the response tokens: float rounding
    when the engine samples with the trainer's weights, more when a sync went wrong."""
    diff = (rollout_logp - old_logp).abs() * mask
    return {"rollout/logp_diff": masked_mean(diff, mask).item(), "rollout/logp_diff_max": diff.max().item()}


def masked_var(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Population variance Σ m·(x − μ)² / Σ m over the masked elements."""
    mean = masked_mean(x, mask, dim)
    if dim is not None:
        mean = mean.unsqueeze(dim)
    return masked_mean((x - mean) ** 2, mask, dim)


def masked_whiten(x: Tensor, mask: Tensor) -> Tensor:
    """Reward pipeline step 6: A ← (A − μ) / sqrt(max(σ², 1e-8)).

    μ and σ² (population) are taken over the masked tokens of the whole tensor, in at
    least float32; every position is shifted, masked ones included, so compare results
    under the mask. Returns the upcast dtype.
    """
    x = _at_least_f32(x)
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    return (x - mean) * var.clamp(min=1e-8).rsqrt()


def masked_center(x: Tensor, mask: Tensor) -> Tensor:
    """Whitening without the std division (REINFORCE++-baseline, no std norm): A ← A − μ,
    μ over the masked tokens, in at least float32; every position is shifted."""
    x = _at_least_f32(x)
    return x - masked_mean(x, mask)


# ---------------------------------------------------------------------------------------
# Reward pipeline, steps 1-3: length shaping, group baselines, clipping


def overlong_penalty(rewards: Tensor, lengths: Tensor, max_len: int, buffer: int, factor: float) -> Tensor:
    """Step 1 (DAPO overlong buffer): e = min(len − (L_max − L_b), L_b); r −= max(e, 0)/L_b·factor."""
    excess = (lengths.to(rewards.dtype) - (max_len - buffer)).clamp(min=0, max=buffer)
    return rewards - excess / buffer * factor


def group_index(rewards: Tensor, groups: Tensor | int) -> tuple[Tensor, int]:
    """Each sample's group as an index 0..G−1, and G.

    ``groups`` holds a group id per sample (samples with equal ids share a prompt; any
    order), or an int n for contiguous blocks of n samples, prompt-major.
    """
    if isinstance(groups, int):
        if groups < 1 or rewards.numel() % groups:
            raise ValueError(f"{rewards.numel()} rewards do not split into groups of n={groups}")
        import torch

        return torch.arange(rewards.numel(), device=rewards.device) // groups, rewards.numel() // groups
    if groups.shape != rewards.shape:
        raise ValueError(f"group ids of shape {tuple(groups.shape)} for rewards of shape {tuple(rewards.shape)}")
    ids, index = groups.unique(return_inverse=True)
    return index, ids.numel()


def _group_sums(x: Tensor, index: Tensor, size: int) -> Tensor:
    return x.new_zeros(size).index_add_(0, index, x)


def _group_counts(rewards: Tensor, index: Tensor, size: int, at_least: int, name: str) -> Tensor:
    counts = _group_sums(rewards.new_ones(rewards.shape), index, size)
    if (counts < at_least).any():
        raise ValueError(f"{name} needs at least {at_least} samples per group; a group has "
                         f"{int(counts.min().item())}")
    return counts


def group_mean(rewards: Tensor, groups: Tensor | int) -> Tensor:
    """mean_G(r) of each sample's group, [B]."""
    index, size = group_index(rewards, groups)
    counts = _group_counts(rewards, index, size, 1, "a group mean")
    return (_group_sums(rewards, index, size) / counts)[index]


def group_std(rewards: Tensor, groups: Tensor | int) -> Tensor:
    """std_G(r) of each group, unbiased (n − 1), [G] in the order of the sorted group ids."""
    index, size = group_index(rewards, groups)
    counts = _group_counts(rewards, index, size, 2, "a group std")
    mean = _group_sums(rewards, index, size) / counts
    return (_group_sums((rewards - mean[index]) ** 2, index, size) / (counts - 1)).sqrt()


def rloo_baseline(rewards: Tensor, groups: Tensor | int) -> Tensor:
    """Step 2, ``rloo``: r_i − (Σ_{j∈G} r_j − r_i)/(n − 1)."""
    index, size = group_index(rewards, groups)
    counts = _group_counts(rewards, index, size, 2, "rloo")
    others = _group_sums(rewards, index, size)[index] - rewards
    return rewards - others / (counts[index] - 1)


def mean_baseline(rewards: Tensor, groups: Tensor | int) -> Tensor:
    """Step 2, ``reinforce_baseline`` and ``dr_grpo``: r_i − mean_G(r)."""
    return rewards - group_mean(rewards, groups)


def group_normalize(rewards: Tensor, groups: Tensor | int, eps: float = 1e-9) -> Tensor:
    """Step 2, ``group_norm`` (GRPO): (r_i − mean_G(r)) / (std_G(r) + 1e-9), std unbiased."""
    index, _ = group_index(rewards, groups)
    return (rewards - group_mean(rewards, groups)) / (group_std(rewards, groups)[index] + eps)


def group_metrics(rewards: Tensor, groups: Tensor | int) -> dict[str, float]:
    """What a group baseline saw: the mean within-group std of the rewards and the number
    of groups whose rewards are all equal (they carry no signal)."""
    std = group_std(rewards, groups)
    return {"reward/group_std": std.mean().item(), "reward/zero_std_groups": float((std == 0).sum().item())}


def clip_rewards(rewards: Tensor, limit: float | None = 10.0) -> Tensor:
    """Step 3: clip r_i to [−limit, limit], applied after the baseline; 0 or None: no clip."""
    return rewards.clamp(-limit, limit) if limit else rewards


# ---------------------------------------------------------------------------------------
# KL estimators: Δ = log π_θ − log π_ref, each estimate clamped to [−10, 10] in float32


def _log_ratio(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return _at_least_f32(logp) - _at_least_f32(ref_logp)


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = Δ."""
    return _log_ratio(logp, ref_logp).clamp(-10, 10)


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = Δ²/2."""
    return (_log_ratio(logp, ref_logp) ** 2 / 2).clamp(-10, 10)


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = exp(−Δ) − 1 + Δ (non-negative, unbiased for KL(π_θ‖π_ref) under π_θ samples)."""
    delta = _log_ratio(logp, ref_logp)
    return ((-delta).exp() - 1 + delta).clamp(-10, 10)


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl_estimator(name: str) -> Callable[[Tensor, Tensor], Tensor]:
    """The KL estimator called ``name`` ("k1", "k2" or "k3")."""
    if name not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {name!r}; choose one of {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[name]


# ---------------------------------------------------------------------------------------
# Reward pipeline, steps 4-5: token rewards, returns and GAE


def last_token_mask(mask: Tensor) -> Tensor:
    """True at the last position of each row where mask is 1 (no position for an empty row)."""
    ones_left = mask.flip(-1).cumsum(-1).flip(-1)  # how many mask-1 positions from t onwards
    return (mask > 0) & (ones_left == 1)


def token_rewards(rewards: Tensor, mask: Tensor, kl: Tensor | None = None, beta: float = 0.0) -> Tensor:
    """Step 4: R_t = −β·k_t + [t is the last action token]·r_i.

    ``rewards`` is [B], ``mask`` and ``kl`` are [B, T]. The KL penalty is zero where the
    mask is 0 (padding, tool tokens) and is never clipped beyond the clamp of each k_t.
    Pass ``kl=None`` when KL is a loss term instead of a reward.
    """
    mask = mask.to(rewards.dtype)
    shaped = mask.new_zeros(mask.shape) if kl is None else -beta * _at_least_f32(kl) * mask
    return shaped + last_token_mask(mask) * rewards.unsqueeze(-1)


def discounted_returns(token_rewards: Tensor, gamma: float = 1.0) -> Tensor:
    """Step 5, all estimators but ``gae``: A_t = Σ_{t' ≥ t} γ^{t'−t} R_{t'}.

    Every position is a step of the recursion: masked-0 positions carry R_t = 0 from
    ``token_rewards`` but still discount what follows them.
    """
    if gamma == 1.0:  # a sum from the end: one scan, not two kernels a position
        return token_rewards.flip(-1).cumsum(-1).flip(-1)
    returns = token_rewards.new_zeros(token_rewards.shape)
    running = token_rewards.new_zeros(token_rewards.shape[:-1])
    for t in reversed(range(token_rewards.shape[-1])):
        running = token_rewards[..., t] + gamma * running
        returns[..., t] = running
    return returns


def gae(
    token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Step 5, ``gae``: δ_t = R_t + γV_{t+1} − V_t, A_t = Σ_l (γλ)^l δ_{t+l}, returns = A + V.

    V after the last token is 0; positions with mask 0 are steps of the recursion with
    reward and value 0. Returns (advantages, returns), both [B, T].
    """
    rewards = token_rewards * mask
    values = values * mask
    advantages = rewards.new_zeros(rewards.shape)
    running = rewards.new_zeros(rewards.shape[:-1])
    next_value = rewards.new_zeros(rewards.shape[:-1])
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[..., t] + gamma * next_value - values[..., t]
        running = delta + gamma * lam * running
        advantages[..., t] = running
        next_value = values[..., t]
    return advantages, advantages + values


# ---------------------------------------------------------------------------------------
# Loss aggregation, chosen by name
#
# Each mode returns this micro-batch's share of the optimizer step's loss: the sum over
# all micro-batches (and data-parallel ranks) of the returned values is the loss of the
# whole step computed at once, provided the step-wide counts are passed in. Without
# them, the counts of this batch are used (the step is one batch). A backend that
# averages gradients over R ranks must multiply by R to keep that sum.


def _token_mean(per_token: Tensor, mask: Tensor, *, token_count: float | None, **_) -> Tensor:
    """Σ_{i,t} ℓ_{i,t} m_{i,t} / (action tokens in the optimizer step)."""
    count = mask.sum() if token_count is None else token_count
    return masked_sum(per_token, mask) / count


def sequence_count(mask: Tensor) -> Tensor:
    """Rows with at least one action token: the sequences a sequence-mean divides by
    (a row whose mask is empty contributes nothing and does not count)."""
    return (mask.sum(-1) > 0).sum()


def _seq_mean_token_mean(per_token: Tensor, mask: Tensor, *, seq_count: float | None, **_) -> Tensor:
    """Σ_i (Σ_t ℓ_{i,t} m_{i,t} / Σ_t m_{i,t}) / (non-empty sequences in the optimizer step)."""
    count = sequence_count(mask).clamp(min=1) if seq_count is None else seq_count
    return masked_mean(per_token, mask, dim=-1).sum() / count


def _seq_mean_token_sum_norm(
    per_token: Tensor, mask: Tensor, *, seq_count: float | None, max_len: int | None, **_
) -> Tensor:
    """Dr.GRPO: Σ_i (Σ_t ℓ_{i,t} m_{i,t} / L_max) / (non-empty sequences in the optimizer step)."""
    if max_len is None:
        raise ValueError("seq_mean_token_sum_norm needs max_len (the generation budget)")
    count = sequence_count(mask).clamp(min=1) if seq_count is None else seq_count
    return masked_sum(per_token, mask) / max_len / count


AGGREGATIONS: dict[str, Callable[..., Tensor]] = {
    "token_mean": _token_mean,
    "seq_mean_token_mean": _seq_mean_token_mean,
    "seq_mean_token_sum_norm": _seq_mean_token_sum_norm,
}


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    mode: str = "token_mean",
    *,
    token_count: float | None = None,
    seq_count: float | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Reduce a [B, T] per-token loss to a scalar (Losses, aggregation).

    ``mode`` is one of ``AGGREGATIONS``: ``"token_mean"`` (the default, OpenRLHF's),
    ``"seq_mean_token_mean"`` or ``"seq_mean_token_sum_norm"`` (Dr.GRPO). ``token_count``
    and ``seq_count`` are the action tokens and the sequences with at least one action
    token of the whole optimizer step (all micro-batches, all ranks); ``max_len`` is the constant length normaliser.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {sorted(AGGREGATIONS)}")
    return AGGREGATIONS[mode](per_token, mask, token_count=token_count, seq_count=seq_count, max_len=max_len)


# ---------------------------------------------------------------------------------------
# Policy and value losses


def _clipped_surrogate(
    log_ratio: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float, dual_clip: float | None
) -> tuple[Tensor, dict[str, Tensor]]:
    """ℓ_t = −min(ρA, clip(ρ, 1 − ε_low, 1 + ε_high)A), dual clip −max(·, cA) for A < 0."""
    ratio = log_ratio.clamp(-20, 20).exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - eps_low, 1 + eps_high) * advantages
    objective = surr1.minimum(surr2)
    if dual_clip is not None:
        if dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        objective = objective.maximum(dual_clip * advantages).where(advantages < 0, objective)
    rho = ratio.detach()
    metrics = {
        "clip_frac": masked_mean((surr2 < surr1).to(mask.dtype), mask).detach(),
        # KL(π_old ‖ π_θ) from samples of π_old: (ρ − 1) − log ρ
        "approx_kl": masked_mean(rho - 1 - rho.log(), mask),
    }
    return -objective, metrics


def ppo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clip: ρ_t = exp(clamp(log π_θ − log π_old, −20, 20)),
    ℓ_t = −min(ρ_t A_t, clip(ρ_t, 1 − ε_low, 1 + ε_high) A_t); with dual clip c > 1,
    ℓ_t = −max(min(ρA, clip(ρ)A), cA) where A_t < 0.

    Returns the per-token loss [B, T] (aggregate it) and detached metrics: ``clip_frac``
    (share of action tokens where the clipped term is taken) and ``approx_kl``
    ((ρ − 1) − log ρ, the k3 estimate of KL(π_old ‖ π_θ)).
    """
    return _clipped_surrogate(logp - old_logp, advantages, mask, eps_low, eps_high, dual_clip)


def gspo_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO sequence ratio [B]: ρ_i = exp(mean over the sample's tokens of log π_θ − log π_old)."""
    return masked_mean(logp - old_logp, mask, dim=-1).clamp(-20, 20).exp()


def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025): the PPO clip objective on the sequence ratio ρ_i.

    Written as GSPO-token: every token carries the ratio sg[ρ_i]·π_θ(y_t)/sg[π_θ(y_t)],
    whose value is ρ_i and whose gradient is ρ_i ∇log π_θ(y_t), so that with the
    ``seq_mean_token_mean`` aggregation the loss and its gradient are GSPO's, and
    per-token advantages are allowed. Clip ranges default to the paper's (3e-4, 4e-4).
    """
    seq_log_ratio = gspo_ratio(logp, old_logp, mask).detach().log().unsqueeze(-1)
    log_ratio = logp - logp.detach() + seq_log_ratio
    return _clipped_surrogate(log_ratio, advantages, mask, eps_low, eps_high, None)


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float | None = 0.5
) -> tuple[Tensor, dict[str, Tensor]]:
    """Critic: V̂ = V_old + clamp(V − V_old, −ε_v, ε_v), ℓ = max((V̂ − R)², (V − R)²), L = 0.5·aggregate(ℓ).

    Returns 0.5·ℓ per token, so that aggregating it gives L (aggregation is linear), and
    ``clip_frac``, the share of action tokens where the clipped term is the larger.
    ``clip=None`` is the plain squared error.
    """
    unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * unclipped, {}
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)
    clipped = (clipped_values - returns) ** 2
    metrics = {"clip_frac": masked_mean((clipped > unclipped).to(mask.dtype), mask).detach()}
    return 0.5 * clipped.maximum(unclipped), metrics


def entropy_from_logits(logits: Tensor, lse: Tensor | None = None) -> Tensor:
    """H = logsumexp(z) − Σ softmax(z)·z over the last dim, in at least float32; ``lse`` is
    logsumexp(z) when the caller has it already."""
    logits = _at_least_f32(logits)
    lse = logits.logsumexp(-1) if lse is None else lse
    return lse - ((logits - lse.unsqueeze(-1)).exp() * logits).sum(-1)


def token_logprobs(logits: Tensor, labels: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(z / temperature) at ``labels``, in at least float32 (Losses: log-probs use z / T)."""
    logits = _at_least_f32(logits) / temperature
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - logits.logsumexp(-1)


# ---------------------------------------------------------------------------------------
# Off-policy corrections: w_t = exp(log π_old − log π_rollout), detached, where π_rollout is
# what the rollout engine reported for the sampled token


def _rollout_weights(old_logp: Tensor, rollout_logp: Tensor) -> Tensor:
    return (_at_least_f32(old_logp) - _at_least_f32(rollout_logp)).detach().clamp(max=80).exp()


def rollout_kl(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> Tensor:
    """vllm_kl: the masked mean of log π_rollout − log π_old."""
    return masked_mean(_at_least_f32(rollout_logp) - _at_least_f32(old_logp), mask).detach()


def tis(per_token: Tensor, old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, low: float, high: float):
    """Truncated importance sampling: ℓ_t ← clamp(w_t, lo, hi)·ℓ_t. Logs the share of
    action tokens whose weight was clamped."""
    w = _rollout_weights(old_logp, rollout_logp)
    clipped = ((w < low) | (w > high)).to(mask.dtype)
    return w.clamp(low, high) * per_token, {"correction/clipped_frac": masked_mean(clipped, mask),
                                            "correction/rollout_kl": rollout_kl(old_logp, rollout_logp, mask)}


def icepop(per_token: Tensor, old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, low: float, high: float):
    """ICEPOP masking: ℓ_t ← w_t·[lo ≤ w_t ≤ hi]·ℓ_t. A weight outside the band (inf
    included) gives exactly 0, never NaN. Logs the share of action tokens masked."""
    w = _rollout_weights(old_logp, rollout_logp)
    keep = (w >= low) & (w <= high)
    loss = w.where(keep, w.new_zeros(())) * per_token  # zero the weight, not the product: no inf·0
    return loss, {"correction/masked_frac": masked_mean((~keep).to(mask.dtype), mask),
                  "correction/rollout_kl": rollout_kl(old_logp, rollout_logp, mask)}


def seq_mask_tis(per_token: Tensor, old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, low: float,
                 high: float):
    """Sequence-level masked TIS: ℓ_t ← [lo ≤ exp(masked mean_t log w_t) ≤ hi]·w_t·ℓ_t,
    with the unclamped w_t as OpenRLHF v0.11 does. Logs the share of sequences masked
    (among those with an action token)."""
    log_w = (_at_least_f32(old_logp) - _at_least_f32(rollout_logp)).detach()
    seq_w = masked_mean(log_w, mask, dim=-1).exp()
    keep = ((seq_w >= low) & (seq_w <= high)).unsqueeze(-1)
    w = log_w.clamp(max=80).exp()
    loss = w.where(keep, w.new_zeros(())) * per_token
    rows = (mask.sum(-1) > 0).to(mask.dtype)
    return loss, {"correction/masked_seq_frac": masked_mean((~keep.squeeze(-1)).to(mask.dtype), rows),
                  "correction/rollout_kl": rollout_kl(old_logp, rollout_logp, mask)}


# ---------------------------------------------------------------------------------------
# Preference losses: per-example values, to be averaged over the optimizer step


def logsigmoid(x: Tensor) -> Tensor:
    """log σ(x), stable for any x, with the gradient σ(−x) accurate everywhere.

    torch's own logsigmoid (imported here, not with the module). Its gradient is exactly
    σ(0) = 0.5 at x = 0, where policy == reference puts DPO's first step (a bare
    min(x, 0) gives 1 and doubles that step), and keeps its relative accuracy for large
    x, where σ(−x) is tiny: writing min(x, 0) as the mean of two clamps, as rlx once did,
    sums gradient terms of ±½ that cancel to rounding noise there (5% off at x = 16 in
    float32, exactly 0 at x = 45 in float64).
    """
    from torch.nn.functional import logsigmoid as torch_logsigmoid

    return torch_logsigmoid(x)


def _smoothed_logistic(logits: Tensor, label_smoothing: float) -> Tensor:
    """−(1 − ε) log σ(x) − ε log σ(−x): the logistic loss when labels flip with rate ε."""
    return -(1 - label_smoothing) * logsigmoid(logits) - label_smoothing * logsigmoid(-logits)


def implicit_reward(policy_logp: Tensor, ref_logp: Tensor, beta: float) -> Tensor:
    """DPO's implicit reward β(log π − log π_ref), detached for logging."""
    return (beta * (policy_logp - ref_logp)).detach()


def _dpo_logits(policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor) -> Tensor:
    """z = (log π_c − log π_r) − (log π^ref_c − log π^ref_r), log π summed over response tokens."""
    return (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)


def dpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> Tensor:
    """DPO / cDPO per pair: L = −(1 − ε) log σ(βz) − ε log σ(−βz)."""
    z = _dpo_logits(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
    return _smoothed_logistic(beta * z, label_smoothing)


def ipo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    beta: float = 0.1,
    chosen_tokens: Tensor | None = None,
    rejected_tokens: Tensor | None = None,
) -> Tensor:
    """IPO per pair: L = (z − 1/(2β))².

    Given the response lengths ``chosen_tokens`` and ``rejected_tokens``, each log-ratio
    is divided by its length first (TRL's IPO):
    z = (log π_c − log π^ref_c)/|y_c| − (log π_r − log π^ref_r)/|y_r|.
    """
    if chosen_tokens is None or rejected_tokens is None:
        z = _dpo_logits(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
    else:
        z = ((policy_chosen - ref_chosen) / chosen_tokens.clamp(min=1)
             - (policy_rejected - ref_rejected) / rejected_tokens.clamp(min=1))
    return (z - 1 / (2 * beta)) ** 2


def hinge_loss(
    policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor, beta: float = 0.1
) -> Tensor:
    """Hinge (SLiC) per pair: L = max(0, 1 − βz); zero once z ≥ 1/β."""
    z = _dpo_logits(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
    return (1 - beta * z).clamp(min=0)


def robust_dpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.1,
) -> Tensor:
    """Robust DPO per pair: L = (−(1 − ε) log σ(βz) + ε log σ(−βz)) / (1 − 2ε), 0 ≤ ε < 1/2.

    Its expectation over labels flipped with probability ε is the DPO loss of the clean
    labels. Unlike cDPO's, the ε term has a plus sign, so the loss is unbounded below.
    """
    if not 0 <= label_smoothing < 0.5:
        raise ValueError(f"robust DPO needs 0 <= label_smoothing < 0.5, got {label_smoothing}")
    z = _dpo_logits(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
    eps = label_smoothing
    return (-(1 - eps) * logsigmoid(beta * z) + eps * logsigmoid(-beta * z)) / (1 - 2 * eps)


# f-DPO: the reward β·f'(u) of an f-divergence f, u = π/π_ref, as a function of log u
# (constants dropped: they cancel between chosen and rejected)
F_DIVERGENCES: dict[str, Callable[[Tensor], Tensor]] = {
    "reverse_kl": lambda log_u: log_u,  # f(u) = u log u, f'(u) = log u + 1: DPO itself
    "js_divergence": lambda log_u: logsigmoid(log_u),  # f'(u) = log(2u/(1 + u)) = log 2 + log σ(log u)
}


def f_dpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    beta: float = 0.1,
    divergence: str = "js_divergence",
) -> Tensor:
    """f-DPO per pair: L = −log σ(β(f'(u_c) − f'(u_r))), log u = log π − log π_ref summed
    over the response; ``divergence`` names f' in ``F_DIVERGENCES``. Jensen-Shannon gives
    L = −log σ(β(log σ(log u_c) − log σ(log u_r))) = −log σ(β(z − softplus(log u_c) + softplus(log u_r))).
    """
    if divergence not in F_DIVERGENCES:
        raise ValueError(f"unknown f-divergence {divergence!r}; choose one of {sorted(F_DIVERGENCES)}")
    score = F_DIVERGENCES[divergence]
    return -logsigmoid(beta * (score(policy_chosen - ref_chosen) - score(policy_rejected - ref_rejected)))


def simpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    chosen_tokens: Tensor,
    rejected_tokens: Tensor,
    beta: float = 2.0,
    gamma: float = 0.5,
    label_smoothing: float = 0.0,
) -> Tensor:
    """SimPO per pair, with labels flipped at rate ε (TRL's CPO ``simpo`` form):
    m = β/|y_c|·log π_c − β/|y_r|·log π_r − γ, L = −(1 − ε) log σ(m) − ε log σ(−m).
    """
    margin = (beta * policy_chosen / chosen_tokens.clamp(min=1)
              - beta * policy_rejected / rejected_tokens.clamp(min=1) - gamma)
    return _smoothed_logistic(margin, label_smoothing)


def bt_loss(r_chosen: Tensor, r_rejected: Tensor, margin: Tensor | None = None) -> Tensor:
    """Bradley-Terry reward-model loss per pair: −log σ(r_c − r_r − margin)."""
    diff = r_chosen - r_rejected
    if margin is not None:
        diff = diff - margin
    return -logsigmoid(diff)


def log_exp_loss(r_chosen: Tensor, r_rejected: Tensor) -> Tensor:
    """Reward-model loss per pair: log(1 + exp(r_r − r_c)), computed as −log σ(r_c − r_r)."""
    return -logsigmoid(r_chosen - r_rejected)


def kto_loss(
    policy_logratio: Tensor,
    kl_ref_point: Tensor | float,
    desirable: Tensor,
    beta: float = 0.1,
    w_d: float = 1.0,
    w_u: float = 1.0,
) -> Tensor:
    """KTO per example: w_d(1 − σ(β(logratio − z_0))) if desirable else w_u(1 − σ(β(z_0 − logratio))).

    ``policy_logratio`` is log π − log π_ref summed over the response; ``kl_ref_point``
    the mean of that log-ratio on mismatched prompt/response pairs; z_0 = max(0, it),
    detached.
    """
    z0 = kl_ref_point.detach().clamp(min=0) if hasattr(kl_ref_point, "detach") else max(float(kl_ref_point), 0.0)
    loss_d = w_d * (1 - (beta * (policy_logratio - z0)).sigmoid())
    loss_u = w_u * (1 - (beta * (z0 - policy_logratio)).sigmoid())
    return loss_d.where(desirable.bool(), loss_u)


def apo_zero_unpaired_loss(
    policy_logratio: Tensor, desirable: Tensor, beta: float = 0.1, w_d: float = 1.0, w_u: float = 1.0
) -> Tensor:
    """APO-zero on unpaired rows, per example: w_d(1 − σ(β·logratio)) if desirable else w_u·σ(β·logratio).

    KTO with its reference point fixed at 0: desirable completions are pushed above the
    reference's likelihood, undesirable ones below it, with no KL estimate.
    """
    value = (beta * policy_logratio).sigmoid()
    return (w_d * (1 - value)).where(desirable.bool(), w_u * value)


def _class_means(step_logratio: Tensor, step_desirable: Tensor) -> tuple[Tensor, Tensor]:
    """Mean detached logratio of the desirable and of the undesirable rows (0 for a class without rows)."""
    d = step_desirable.bool()
    r = step_logratio.detach()
    return masked_mean(r, d.to(r.dtype)), masked_mean(r, (~d).to(r.dtype))


def kto_vanilla_reference_points(step_logratio: Tensor, step_desirable: Tensor) -> tuple[Tensor, Tensor]:
    """(z_D, z_U): max(0, mean logratio) of the step's desirable rows and of its undesirable
    rows, detached; a class without rows gives 0."""
    mean_d, mean_u = _class_means(step_logratio, step_desirable)
    return mean_d.clamp(min=0), mean_u.clamp(min=0)


def kto_vanilla_loss(
    policy_logratio: Tensor, desirable: Tensor, step_logratio: Tensor, step_desirable: Tensor, beta: float = 0.1
) -> Tensor:
    """The first KTO (HALOs' first release, OpenRLHF's ``VanillaKTOLoss``), per example.

    With (z_D, z_U) from ``kto_vanilla_reference_points`` over the step: desirable rows
    1 − σ(β(logratio − z_U)), undesirable rows 1 − σ(β(z_D − logratio)). As in the
    original, gradient flows through z_D and z_U: a desirable row's log-ratio moves z_D
    and with it every undesirable row's loss, and the other way round. Those terms come
    from the whole step (``step_logratio``: the detached log-ratios of all its rows,
    ``step_desirable``: their flags) and are added as g·(logratio − sg[logratio]), zero in
    value, so that summed over the step's micro-batches the gradient is exactly that of
    the loss on the whole step at once:
    g = [mean_U ≥ 0]/n_U · Σ_{j desirable} β σ'(β(r_j − z_U)) on an undesirable row,
    g = −[mean_D ≥ 0]/n_D · Σ_{j undesirable} β σ'(β(z_D − r_j)) on a desirable row
    (the clamp at 0 passes the gradient at exactly 0, as torch's clamp does).
    """
    d_step = step_desirable.bool()
    r = step_logratio.detach()
    mean_d, mean_u = _class_means(r, d_step)
    z_d, z_u = mean_d.clamp(min=0), mean_u.clamp(min=0)
    v_d = (beta * (r - z_u)).sigmoid()  # the value of each desirable row of the step
    v_u = (beta * (z_d - r)).sigmoid()  # ... and of each undesirable row
    pull_u = (beta * v_d * (1 - v_d) * d_step).sum() * (mean_u >= 0) / (~d_step).sum().clamp(min=1)
    pull_d = -(beta * v_u * (1 - v_u) * ~d_step).sum() * (mean_d >= 0) / d_step.sum().clamp(min=1)

    des = desirable.bool()
    loss_d = 1 - (beta * (policy_logratio - z_u)).sigmoid()
    loss_u = 1 - (beta * (z_d - policy_logratio)).sigmoid()
    return loss_d.where(des, loss_u) + (policy_logratio - policy_logratio.detach()) * pull_d.where(des, pull_u)
