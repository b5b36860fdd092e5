"""The online loop: rollout → reward → advantage → update.

One step of this loop, as docs/algorithms/README.md lays it out:

1. take ``rollout_batch_size`` prompts and sample ``n_samples`` responses for each;
2. score them (reward functions and/or a reward model); a sampler may reject groups
   and ask for more prompts (dynamic filtering);
3. compute the old policy's log-probs, the reference's (only with a KL term) and the
   critic's values (only with a critic);
4. the algorithm's estimator turns rewards into per-token advantages and returns;
5. ``epochs`` passes of mini-batch updates (``training.batch_size`` samples per
   optimizer step) of the actor with the policy loss and of the critic with the value
   loss; per-token losses are aggregated over the whole optimizer step.

The parts come from the registries by the names in the algorithm's spec; nothing here
knows which algorithm runs.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlx import data, models, multimodal, ops
from rlx.agents import agent_sampler
from rlx.ahead import RolloutsAhead
from rlx.algorithm import AlgorithmSpec, call_with_accepted
from rlx.batch import Batch
from rlx.checkpoint import resume_latest
from rlx.config import RunConfig
from rlx.errors import RunError
from rlx.launch import make_launcher
from rlx.metrics import RunLogger, add_shares, pick_samples
from rlx.partial import generate_in_segments
from rlx.rollout import SamplingParams
from rlx.workers.critic import CriticWorker
from rlx.workers.forward import minibatches
from rlx.workers.policy import PolicyWorker
from rlx.workers.reference import ReferenceWorker
from rlx.workers.reward import RewardWorker
from rlx.workers.rollout import generate_balanced


def batch_of_completions(prompt_ids: list[list[int]], completions: list, pad_id: int, rewards: list[float],
                         group_ids: list[int], device, inputs: list | None = None) -> Batch:
    """The padded batch of a rollout: prompts left-padded, responses right-padded. ``inputs``
    (one ``ModelInputs`` per sample) adds image tensors and multi-axis positions."""
    prompt_len = max(len(p) for p in prompt_ids)
    response_len = max(1, max(len(c.token_ids) for c in completions))
    # filled in numpy arrays: torch.tensor over nested lists took 8 ms a W0 step
    rows = np.full((len(completions), prompt_len + response_len), pad_id, dtype=np.int64)
    attention = np.zeros(rows.shape, dtype=np.int64)
    actions = np.zeros((len(completions), response_len), dtype=np.float32)
    logps = np.zeros(actions.shape, dtype=np.float32)
    has_logps = all(c.logprobs is not None for c in completions)
    for i, (p, c) in enumerate(zip(prompt_ids, completions)):
        r, start, end = c.token_ids, prompt_len - len(p), prompt_len + len(c.token_ids)
        rows[i, start:prompt_len], rows[i, prompt_len:end] = p, r
        attention[i, start:end] = 1
        actions[i, :len(r)] = getattr(c, "action_mask", None) or 1  # an episode masks its observations
        if c.logprobs is not None and len(c.logprobs) != len(r):
            raise ValueError(f"the rollout engine gave {len(c.logprobs)} log-probs for {len(r)} tokens")
        if has_logps:
            logps[i, :len(r)] = c.logprobs
    attention_mask = torch.from_numpy(attention).to(device)
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    extra, extra_rows = {}, {}
    if inputs is not None:
        extra, extra_rows = multimodal.collate(inputs)
        extra = {k: v.to(device) for k, v in extra.items()}
        if inputs[0].positions is not None:
            lengths = [len(p) + response_len for p in prompt_ids]  # the right padding continues the count
            positions = multimodal.padded_positions([i.positions for i in inputs], lengths, prompt_len + response_len,
                                                    left=True).to(device)
    return Batch(
        input_ids=torch.from_numpy(rows).to(device),
        attention_mask=attention_mask,
        position_ids=positions,
        action_mask=torch.from_numpy(actions).to(device),
        prompt_len=prompt_len,
        rewards=torch.tensor(rewards, device=device, dtype=torch.float32),
        group_ids=torch.tensor(group_ids, device=device),
        rollout_logp=torch.from_numpy(logps).to(device) if has_logps else None,
        extra=extra,
        extra_rows=extra_rows,
    )


def token_versions(completions: list, made_by: int, width: int) -> torch.Tensor:
    """[B, R] the policy version that sampled each response token: a completion's own
    record (a partial rollout's), else ``made_by`` throughout; the padding repeats a
    sample's last version."""
    out = np.full((len(completions), width), made_by, dtype=np.int64)
    for i, c in enumerate(completions):
        if c.versions:
            out[i, :len(c.versions)], out[i, len(c.versions):] = c.versions, c.versions[-1]
    return torch.from_numpy(out)


class AdaptiveKL:
    """β ← β·(1 + clip(KL/target − 1, ±0.2)·n/horizon) (Ziegler et al. 2019); fixed when target is 0."""

    def __init__(self, beta: float, target: float, horizon: int):
        self.value, self.target, self.horizon = beta, target, horizon

    def update(self, kl: float, n: int) -> None:
        if self.target > 0:
            error = max(-0.2, min(0.2, kl / self.target - 1))
            self.value *= 1 + error * n / self.horizon


class PromptStream:
    """Prompts in a seeded order, a fresh permutation each epoch; ``cursor`` counts
    prompts handed out, so a checkpoint of it resumes exactly."""

    def __init__(self, rows: list[dict], seed: int, cursor: int = 0):
        self.rows, self.seed, self.cursor = rows, seed, cursor
        self._epoch, self._order = -1, []

    def take(self, n: int) -> list[dict]:
        out = []
        for _ in range(n):
            epoch, index = divmod(self.cursor, len(self.rows))
            if epoch != self._epoch:  # shuffled once per epoch: a shuffle per prompt took 10 ms a step
                self._order = list(range(len(self.rows)))
                random.Random(self.seed * 100_003 + epoch).shuffle(self._order)
                self._epoch = epoch
            out.append(self.rows[self._order[index]])
            self.cursor += 1
        return out


def generate_scored(prompts: list[dict], generate, params: SamplingParams, score) -> tuple[list, Any]:
    """``generate(prompt_ids, params)`` completions of ``prompts`` (with their image inputs,
    when they have any) and their ``score(...)``."""
    ids = [p["prompt_ids"] for p in prompts]
    if "inputs" in prompts[0]:
        completions = generate(ids, params, [p["inputs"] for p in prompts])
    else:
        completions = generate(ids, params)
    n = params.n
    texts = [p["prompt_text"] for p in prompts for _ in range(n)]
    labels = [p["label"] for p in prompts for _ in range(n)]
    columns: dict[str, list] = {}
    for key in prompts[0].get("columns", {}):
        columns[key] = [p["columns"].get(key) for p in prompts for _ in range(n)]
    result = score(texts, [c.text for c in completions], labels, columns)
    return completions, result


def rollout(stream: PromptStream, generate_scored, params: SamplingParams, sampler, batch: int):
    """Generate and score ``batch`` prompt groups with ``generate_scored(prompts, params)``;
    a sampler may reject groups and ask for more."""
    prompts = stream.take(batch)
    completions, result = generate_scored(prompts, params)
    metrics = dict(result.metrics)
    if sampler is None:
        return prompts, completions, result.rewards, metrics
    n = params.n
    kept, rejected = [], []  # groups: (prompt, completions, rewards)
    seen = 0
    for round_ in range(sampler.max_rounds + 1):
        keep = sampler.keep([result.scores[i * n:(i + 1) * n] for i in range(len(prompts))])
        seen += len(prompts)
        for i, ok in enumerate(keep):
            group = (prompts[i], completions[i * n:(i + 1) * n], result.rewards[i * n:(i + 1) * n])
            (kept if ok else rejected).append(group)
        if len(kept) >= batch or round_ == sampler.max_rounds:
            break
        prompts = stream.take(batch)  # a whole batch per round, as DAPO draws, so rounds stay few
        # a fresh seed per round, or every round would draw the same random numbers
        params = dataclasses.replace(params, seed=None if params.seed is None else params.seed + round_ + 1)
        completions, result = generate_scored(prompts, params)
    metrics["sampler/pass_rate"] = len(kept) / seen
    metrics["sampler/rounds"] = round_ + 1
    # out of rounds: rejected groups fill the batch so that it keeps its size
    groups = (kept + rejected)[:batch]
    return ([g[0] for g in groups], [c for g in groups for c in g[1]], [r for g in groups for r in g[2]],
            metrics)


def environment_sampler(config: RunConfig, host, generate, tokenizer):
    """``(prompts, params) -> (episodes, RewardResult)`` for a run with an environment."""
    e = config.environment
    if not e.name:
        return None
    from rlx.environments import run_episodes
    from rlx.rewards import RewardResult

    factory = host.get("register_environments", e.name)

    def sample(prompts, params):
        episodes, rewards, metrics = run_episodes(prompts, generate, params, partial(factory, **e.options), tokenizer,
                                                  e.max_turns, e.max_length)
        return episodes, RewardResult(rewards, rewards, {"reward/env": sum(rewards) / len(rewards), **metrics})

    return sample


@torch.no_grad()
def evaluate(prompts: list[dict], sample, rollout_cfg, k: int, pass_score: float) -> dict[str, float]:
    """Greedy score and sampled pass@k on held-out prompts (``sample(prompts, params)``
    generates and scores, as the rollouts do)."""
    if not prompts:
        return {}
    greedy = SamplingParams(n=1, greedy=True, max_new_tokens=rollout_cfg.max_new_tokens, stop=tuple(rollout_cfg.stop))
    _, result = sample(prompts, greedy)
    sampled = dataclasses.replace(_sampling(rollout_cfg, k), seed=0)
    _, sampled_result = sample(prompts, sampled)
    passed = [max(sampled_result.scores[i * k:(i + 1) * k]) >= pass_score for i in range(len(prompts))]
    return {
        "eval/greedy_score": sum(result.scores) / len(prompts),
        "eval/greedy_accuracy": sum(s >= pass_score for s in result.scores) / len(prompts),
        f"eval/pass@{k}": sum(passed) / len(prompts),
    }


def engine_sleeps(r, launcher: str, engine: str, device: torch.device) -> bool:
    """Whether the rollout engines free their memory while the policy trains. ``auto``:
    when the native engine samples with the policy's own module on its GPU (the local
    launcher, no overlap), where its cache would sit beside the update's activations (on W1
    the update's peak fell by 3.8 GiB, and the step was no slower)."""
    if r.sleep != "auto":
        return r.sleep
    return launcher == "local" and engine == "native" and not r.overlap and device.type == "cuda"


def _sampling(r, n: int) -> SamplingParams:
    return SamplingParams(n=n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_new_tokens, stop=tuple(r.stop))


def _load_prompts(config: RunConfig, host, tokenizer, split: str, log, vision=None) -> list[dict]:
    """The split's prompts, encoded; with ``vision`` (a model that sees images) each row's
    images are read, checked and encoded too."""
    path = config.data.path if split != "test" or not config.data.eval_path else config.data.eval_path
    source = data.load_rows(path, config.data, split=split, task_format="prompts",
                            tasks=host.registry("register_tasks").items)
    schema = data.required_keys(config.data, "prompts")
    rows, skipped, _ = data.validate_rows(source, vision.reading(path).schema(schema) if vision else schema,
                                          config.data.skip_bad_rows)
    if skipped:
        log(f"skipped {skipped} malformed rows of {source.source}")
    if vision is not None:
        return [vision.encode_prompt(r) for r in rows]
    return [data.encode_prompt(r, tokenizer, config.data) for r in rows]


def train(config: RunConfig, spec: AlgorithmSpec, host, out: Path, *, resume: bool, log=print) -> dict[str, float]:
    a, t, r = config.algorithm, config.training, config.rollout
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise RunError("an online run has one driver: for several training ranks use --launcher ray with "
                       "launcher.policy_ranks (and training.backend=deepspeed), not torchrun")
    torch.manual_seed(t.seed)
    device = models.resolve_device(t.device)
    tokenizer = models.load_tokenizer(config.model.path)
    vision = multimodal.vision_data(config, host, tokenizer)

    prompts = _load_prompts(config, host, tokenizer, config.data.split, log, vision)
    if config.data.max_samples:
        prompts = prompts[:config.data.max_samples]
    eval_prompts = []
    if config.data.eval_path or config.data.path.startswith("builtin:"):
        eval_prompts = _load_prompts(config, host, tokenizer, "test", log, vision)[:a.eval_size]
    if not prompts:
        raise RunError(f"no prompts in {config.data.path!r}")

    estimator = host.get("register_advantage_estimators", spec.estimator)
    if config.environment.name:
        host.get("register_environments", config.environment.name)  # an unknown name fails before anything loads
    if config.agent.name:
        host.get("register_agents", config.agent.name)
    sampler = host.get("register_samplers", a.sampler)(a.sampler_options) if a.sampler else None
    engine_name = host.hook.choose_rollout_engine(config=config) or r.engine
    engine_name = "native" if engine_name == "auto" else engine_name
    if engine_name not in ("native", "vllm"):
        raise RunError(f"rollout engine {engine_name!r} is not one of native, vllm")
    if vision is not None:
        videos = any(getattr(p["inputs"], "videos", None) for p in prompts + eval_prompts)
        multimodal.check_supported(config, spec, engine_name, videos)

    # the roles, placed by the launcher
    samples = a.rollout_batch_size * a.n_samples
    updates = samples * a.epochs // t.batch_size
    total = t.max_steps or math.ceil(len(prompts) * t.epochs / a.rollout_batch_size)
    def sizes(ranks: int) -> dict:  # optimizer steps, and backward passes per step on each rank
        return dict(total_steps=total * updates, micro_steps=max(1, t.batch_size // ranks // t.micro_batch_size))
    launcher, ahead, logger = make_launcher(config, host), None, None
    try:
        ranks = config.launcher
        roles = {"reward": (1, 1 if config.reward.model else 0), "policy": (ranks.policy_ranks, 1),
                 "rollout": (r.num_engines, r.tensor_parallel_size if engine_name == "vllm" else 1)}
        if a.kl_coef > 0:
            roles["reference"] = (1, 1)
        if spec.value_loss:
            roles["critic"] = (ranks.critic_ranks, 1)
        launcher.reserve(roles)  # (ranks, devices per rank) of each role this run has
        reward = launcher.place("reward", RewardWorker, config)
        policy = launcher.place("policy", PolicyWorker, config, ranks=ranks.policy_ranks,
                        **sizes(ranks.policy_ranks))
        reference = launcher.place("reference", ReferenceWorker, config) if a.kl_coef > 0 else None
        critic = (launcher.place("critic", CriticWorker, config, ranks=ranks.critic_ranks,
                         **sizes(ranks.critic_ranks)) if spec.value_loss else None)
        rollout_group = launcher.place_rollout(policy, config, tokenizer, engine_name)
        sleep = engine_sleeps(r, launcher.name, engine_name, device)
        generate, score = partial(generate_balanced, rollout_group), partial(reward.wait, "score")
        sample = environment_sampler(config, host, generate, tokenizer) or agent_sampler(
            config, host, generate, tokenizer) or (lambda prompts, params: generate_scored(prompts, generate, params, score))
        if a.off_policy_correction:
            host.get("register_off_policy_corrections", a.off_policy_correction)  # an unknown name fails now

        params = _sampling(r, a.n_samples)
        kl_coef = AdaptiveKL(a.kl_coef, a.kl_target, a.kl_horizon)
        step, stream, pending = 0, PromptStream(prompts, t.seed), None
        checkpoints = out / "checkpoints"

        def restore(path: Path) -> int:
            nonlocal pending
            state = policy.wait("load", path)
            if critic is not None:
                critic.wait("load", checkpoints / f"critic_{state['step']:08d}")
            stream.cursor, kl_coef.value = state["cursor"], state["kl_coef"]
            pending = state.get("pending_rollout")
            launcher.sync_weights(policy, rollout_group)  # an engine with its own copy starts from the model folder
            return state["step"]

        if resume:
            step = resume_latest(checkpoints, restore, log)

        made_in = sample
        if r.partial_tokens:  # in segments, so that the weights of an update finished meanwhile come in between
            segmented = partial(generate_in_segments, generate, segment=r.partial_tokens,
                                version=lambda: ahead.boundary(), tokenizer=tokenizer)

            def made_in(prompts, params):
                return generate_scored(prompts, segmented, params, score)

        def make_rollout(k: int):
            sampling = dataclasses.replace(params, seed=t.seed * 1_000_003 + k)
            return rollout(stream, made_in, sampling, sampler, a.rollout_batch_size)

        ahead = RolloutsAhead(make_rollout, partial(launcher.sync_weights, policy, rollout_group),
                              r.max_staleness if r.overlap else 0, total, prompts, version=step, pending=pending)

        def checkpoint() -> None:
            # the critic goes first: the policy's COMPLETE marker is what makes a step resumable
            if critic is not None:
                critic.wait("save", checkpoints, step)
            # the rollout in flight has drawn its prompts already: it is saved with the step
            pending_rollout = ahead.state()
            state = {"step": step, "cursor": stream.cursor, "kl_coef": kl_coef.value, "pending_rollout": pending_rollout}
            policy.wait("save", checkpoints, state=state, step=step, keep=config.checkpoint.keep)
            if critic is not None and policy.wait("rank") == 0:
                kept = {p.name.removeprefix("step_") for p in checkpoints.glob("step_*") if p.is_dir()}
                for old in checkpoints.glob("critic_*"):
                    if old.name.removeprefix("critic_") not in kept:
                        shutil.rmtree(old, ignore_errors=True)

        rank = policy.wait("rank")
        logger = RunLogger(out, config.logging, total, start_step=step, rank=rank, host=host)
        pass_score = a.eval_pass_score
        if step == 0 and eval_prompts:
            before = evaluate(eval_prompts, sample, r, a.eval_k, pass_score)
            log(f"before training: greedy accuracy {before['eval/greedy_accuracy']:.1%}, "
                f"pass@{a.eval_k} {before[f'eval/pass@{a.eval_k}']:.1%}")
            logger.log(0, before)
        metrics: dict[str, float] = {}
        while step < total:
            # 1-2. rollout and reward (with overlap: made while the last step trained)
            started = step_started = time.perf_counter()
            (batch_prompts, completions, rewards, metrics), made_by, rollout_time = ahead.take(step)
            rollout_wait = time.perf_counter() - started
            if sleep:
                rollout_group.wait("sleep")  # the engines' memory goes to training until the sync
            # an agent's episode starts from the prompt its agent wrote
            prompt_ids = [getattr(c, "prompt_ids", None) or p["prompt_ids"]
                          for p, c in zip((p for p in batch_prompts for _ in range(a.n_samples)), completions)]
            group_ids = [i for i in range(len(batch_prompts)) for _ in range(a.n_samples)]
            batch = batch_of_completions(prompt_ids, completions, tokenizer.pad_token_id, rewards, group_ids, device,
                                         [p["inputs"] for p in batch_prompts for _ in range(a.n_samples)]
                                         if vision is not None else None)
            batch.token_versions = token_versions(completions, made_by, batch.action_mask.shape[1]).to(device)
            batch.policy_version = batch.token_versions.min(-1).values
            staleness = (step - batch.token_versions).masked_fill(batch.action_mask == 0, 0)
            if a.off_policy_correction and batch.rollout_logp is None:
                raise RunError(f"algorithm.off_policy_correction={a.off_policy_correction!r} needs the rollout "
                               f"engine's log-probs, and engine {engine_name!r} returns none")
            lengths = batch.action_mask.sum(-1)
            raw_rewards = batch.rewards
            if a.overlong_buffer:
                batch.rewards = ops.overlong_penalty(batch.rewards, lengths, r.max_new_tokens, a.overlong_buffer,
                                                     a.overlong_factor)

            # 3. old log-probs, reference log-probs, values
            started = time.perf_counter()
            # One update per rollout needs no pass of its own for the old log-probs: the
            # training forward's, detached, are the same numbers (ratio 1, the same gradient),
            # and an off-policy correction weighs each micro-batch's tokens by them there.
            single_update = a.epochs == 1 and t.batch_size >= len(batch)
            reuse = single_update and reference is None
            batch.old_logp = None if reuse else gather(policy.call_split("logprobs", batch))
            batch.ref_logp = gather(reference.call_split("logprobs", batch)) if reference is not None else None
            batch.values = gather(critic.call_split("values", batch)) if critic is not None else None
            kl = ops.kl_estimator(a.kl_estimator)(batch.old_logp, batch.ref_logp) if reference is not None else None
            if batch.rollout_logp is not None and batch.old_logp is not None:  # else the update measures it
                metrics.update(ops.logp_mismatch(batch.rollout_logp, batch.old_logp, batch.action_mask))
            logprobs_time = time.perf_counter() - started

            # 4. advantages
            estimated = call_with_accepted(
                estimator, batch.rewards, batch.action_mask, kl=None if a.kl_loss else kl, beta=kl_coef.value,
                values=batch.values, group_ids=batch.group_ids, n_samples=a.n_samples, config=a)
            batch.advantages, batch.returns = estimated[:2]
            estimator_metrics = estimated[2] if len(estimated) > 2 else {}

            # 5. updates, then the new weights to the rollout engines (nothing to send when
            # the engine samples with the policy's own module)
            train_metrics = update(batch, policy, critic, a, t, beta=kl_coef.value, seed=t.seed * 7919 + step)
            train_time = time.perf_counter() - started
            started = time.perf_counter()
            if sleep:
                rollout_group.wait("wake")
            if r.overlap:  # an overlapped engine is busy: it takes the weights between rollouts (or segments)
                ahead.publish(step + 1)
            else:
                launcher.sync_weights(policy, rollout_group)
                ahead.synced(step + 1)
            sync_time = time.perf_counter() - started
            step += 1

            mean_kl = ops.masked_mean(kl, batch.action_mask).item() if kl is not None else 0.0
            kl_coef.update(mean_kl, samples)
            generated = batch.action_mask.sum().item()
            metrics.update(train_metrics)
            metrics.update(estimator_metrics)
            metrics.update({
                "reward/mean": raw_rewards.mean().item(),
                "reward/std": raw_rewards.std().item() if len(raw_rewards) > 1 else 0.0,
                "advantage/mean": ops.masked_mean(batch.advantages, batch.action_mask).item(),
                "kl": mean_kl,
                "kl_coef": kl_coef.value,
                "response_length/mean": lengths.mean().item(),
                "time/rollout": rollout_time,
                "time/rollout_wait": rollout_wait,
                "rollout/staleness": ops.masked_mean(staleness.float(), batch.action_mask).item(),
                "rollout/staleness_max": staleness.max().item(),
                "time/train": train_time,
                "time/logprobs": logprobs_time,
                "time/sync": sync_time,
                "tokens_per_s/rollout": generated / max(rollout_time, 1e-9),
            })
            host.hook.on_rollout_end(step=step, rollout=batch, metrics=metrics)
            if (a.eval_every and step % a.eval_every == 0) or step == total:
                if r.overlap:  # evaluate the policy as it is now, on an idle engine
                    ahead.drain()
                    launcher.sync_weights(policy, rollout_group)
                    ahead.synced(step)
                evaluated = evaluate(eval_prompts, sample, r, a.eval_k, pass_score)
                metrics.update(evaluated)
                host.hook.on_eval_end(step=step, metrics=evaluated)
            metrics["time/step"] = time.perf_counter() - step_started  # all of it, evaluation included
            logger.log(step, metrics)
            if logger.samples_due(step):
                prompt_texts = [p["prompt_text"] for p in batch_prompts for _ in range(a.n_samples)]
                advantages = ops.masked_mean(batch.advantages, batch.action_mask, dim=-1).tolist()
                logger.log_samples(step, pick_samples(prompt_texts, [c.text for c in completions],
                                                      raw_rewards.tolist(), advantages, config.logging.samples_count))
            host.hook.on_step_end(step=step, metrics=metrics)
            if config.checkpoint.every and step % config.checkpoint.every == 0 and step < total:
                checkpoint()
        logger.close()
        checkpoint()
        if eval_prompts and "eval/greedy_accuracy" in metrics:
            log(f"after training: greedy accuracy {metrics['eval/greedy_accuracy']:.1%}, "
                f"pass@{a.eval_k} {metrics[f'eval/pass@{a.eval_k}']:.1%}")
        if config.checkpoint.save_final:
            policy.wait("save_final", tokenizer, out / "final")
            if vision is not None:
                multimodal.copy_processor_files(config.model.path, out / "final")
            if critic is not None:
                critic.wait("save_final", tokenizer, out / "final_critic")
        return metrics
    finally:
        if ahead is not None:
            ahead.close()
        if logger is not None:  # also when a step raised: what the loggers buffer is written
            logger.close()
        launcher.shutdown()


def update(batch: Batch, policy, critic, a, t, *, beta: float, seed: int) -> dict[str, float]:
    """``epochs`` shuffled passes over the rollout batch, one optimizer step of policy and
    critic per ``training.batch_size`` samples, each rank training on its share of the step
    with the step's global token and sequence counts; the steps' mean metrics."""
    sums: dict[str, float] = {}
    steps = 0
    for step in minibatches(batch, epochs=a.epochs, size=t.batch_size, seed=seed):
        counts = dict(token_count=step.action_mask.sum().item(), seq_count=ops.sequence_count(step.action_mask).item())
        pending = [policy.call_split("train_step", step, beta=beta, **counts)]
        if critic is not None:
            pending.append(critic.call_split("train_step", step, **counts))
        for futures in pending:
            results = [f.result() for f in futures]
            for shares, _ in results:  # each rank's share of the step's metrics
                add_shares(sums, shares)
            add_shares(sums, results[0][1])  # the update's own (grad norm, lr): the same on every rank
        steps += 1
    return {k: v if k.endswith("_max") else v / steps for k, v in sums.items()}


def gather(futures) -> torch.Tensor:
    """The per-rank results of a split call, in sample order."""
    return torch.cat([f.result() for f in futures])
