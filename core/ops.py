"""The shared maths of every rlx algorithm: masked statistics, reward shaping, returns,
advantages, KL estimators, loss aggregation and the policy, value and preference losses.

Each function cites the step of ALGORITHMS.md it implements. Shapes: ``[B, T]`` is a
batch of B responses of T action tokens, right-padded; ``mask`` is 1 on tokens that
get a gradient and 0 on padding and on tool/environment tokens inside a response.

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


# ---------------------------------------------------------------------------------------
# Reward pipeline, steps 1-3: length shaping, group baselines, clipping


def overlong_penalty(rewards: Tensor, lengths: Tensor, max_len: int, buffer: int, factor: float) -> Tensor:
    """Step 1 (DAPO overlong buffer): e = min(len − (L_max − L_b), L_b); r −= max(e, 0)/L_b·factor."""
    excess = (lengths.to(rewards.dtype) - (max_len - buffer)).clamp(min=0, max=buffer)
    return rewards - excess / buffer * factor


def _groups(rewards: Tensor, n: int) -> Tensor:
    if rewards.numel() % n:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of n={n}")
    return rewards.reshape(-1, n)


def rloo_baseline(rewards: Tensor, n: int) -> Tensor:
    """Step 2, ``rloo``: r_i − (Σ_{j∈G} r_j − r_i)/(n − 1), on rewards ordered prompt-major."""
    if n < 2:
        raise ValueError("rloo needs n >= 2 samples per prompt")
    r = _groups(rewards, n)
    baseline = (r.sum(-1, keepdim=True) - r) / (n - 1)
    return (r - baseline).reshape(rewards.shape)


def mean_baseline(rewards: Tensor, n: int) -> Tensor:
    """Step 2, ``reinforce_baseline`` and ``dr_grpo``: r_i − mean_G(r)."""
    r = _groups(rewards, n)
    return (r - r.mean(-1, keepdim=True)).reshape(rewards.shape)


def group_normalize(rewards: Tensor, n: int, eps: float = 1e-9) -> Tensor:
    """Step 2, ``group_norm`` (GRPO): (r_i − mean_G(r)) / (std_G(r) + 1e-9), std unbiased."""
    if n < 2:
        raise ValueError("group_norm needs n >= 2 samples per prompt")
    r = _groups(rewards, n)
    std = r.std(-1, keepdim=True, correction=1)
    return ((r - r.mean(-1, keepdim=True)) / (std + eps)).reshape(rewards.shape)


def clip_rewards(rewards: Tensor, limit: float = 10.0) -> Tensor:
    """Step 3: clip r_i to [−limit, limit], applied after the baseline."""
    return rewards.clamp(-limit, limit)


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


def _seq_mean_token_mean(per_token: Tensor, mask: Tensor, *, seq_count: float | None, **_) -> Tensor:
    """Σ_i (Σ_t ℓ_{i,t} m_{i,t} / Σ_t m_{i,t}) / (sequences in the optimizer step)."""
    count = mask.shape[0] if seq_count is None else seq_count
    return masked_mean(per_token, mask, dim=-1).sum() / count


def _seq_mean_token_sum_norm(
    per_token: Tensor, mask: Tensor, *, seq_count: float | None, max_len: int | None, **_
) -> Tensor:
    """Dr.GRPO: Σ_i (Σ_t ℓ_{i,t} m_{i,t} / L_max) / (sequences in the optimizer step)."""
    if max_len is None:
        raise ValueError("seq_mean_token_sum_norm needs max_len (the generation budget)")
    count = mask.shape[0] if seq_count is None else seq_count
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
    and ``seq_count`` are the action tokens and sequences of the whole optimizer step
    (all micro-batches, all ranks); ``max_len`` is the constant length normaliser.
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


def entropy_from_logits(logits: Tensor) -> Tensor:
    """H = logsumexp(z) − Σ softmax(z)·z over the last dim, in at least float32."""
    logits = _at_least_f32(logits)
    return logits.logsumexp(-1) - (logits.softmax(-1) * logits).sum(-1)


def token_logprobs(logits: Tensor, labels: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(z / temperature) at ``labels``, in at least float32 (Losses: log-probs use z / T)."""
    logits = _at_least_f32(logits) / temperature
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - logits.logsumexp(-1)


# ---------------------------------------------------------------------------------------
# Preference losses: per-example values, to be averaged over the optimizer step


def logsigmoid(x: Tensor) -> Tensor:
    """log σ(x) = min(x, 0) − log(1 + exp(−|x|)), stable for any x.

    min(x, 0) is written as the mean of two forms whose gradients at x = 0 are 1 and 0,
    so the gradient there is σ(0) = 0.5 as it should be (a bare clamp gives 1, which
    doubled the first step of DPO, where policy == reference makes z exactly 0).
    """
    low = 0.5 * (x.clamp(max=0) + (x - x.clamp(min=0)))
    return low - (-x.abs()).exp().log1p()


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
    return -(1 - label_smoothing) * logsigmoid(beta * z) - label_smoothing * logsigmoid(-beta * z)


def ipo_loss(
    policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor, beta: float = 0.1
) -> Tensor:
    """IPO per pair: L = (z − 1/(2β))²."""
    z = _dpo_logits(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
    return (z - 1 / (2 * beta)) ** 2


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
