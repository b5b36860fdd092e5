"""The hooks rlx plugins implement.

Registration hooks are called once per process with a ``register(name, component)``
callable. Observer hooks are called by the training loops with keyword arguments.
A hook may gain arguments over time but never loses one: implementations may accept
fewer arguments than the spec names.
"""

from __future__ import annotations

from typing import Any, Callable

import pluggy

hookspec = pluggy.HookspecMarker("rlx")
hookimpl = pluggy.HookimplMarker("rlx")

Register = Callable[[str, Any], None]


@hookspec
def register_algorithms(register: Register) -> None:
    """Register algorithms: ``register(name, AlgorithmSpec(...))``."""


@hookspec
def register_advantage_estimators(register: Register) -> None:
    """Register advantage estimators: ``register(name, fn)``, where
    ``fn(rewards, mask, *, kl, beta, values, group_ids, n_samples, config)`` returns
    ``(advantages, returns)`` or ``(advantages, returns, metrics)``: ``rewards`` [B] after
    length shaping, ``mask`` [B, T] action tokens, ``kl`` [B, T] or None when KL is not in
    the reward, ``values`` [B, T] or None without a critic, ``group_ids`` [B] (samples with
    equal ids share a prompt; group by them, not by position), ``metrics`` floats to log."""


@hookspec
def register_policy_losses(register: Register) -> None:
    """Register policy losses: ``register(name, fn)``, where
    ``fn(logp, old_logp, advantages, mask, *, config, rollout_logp) -> (per_token_loss, metrics)``;
    ``rollout_logp`` [B, T] (the rollout engine's log-probs of the sampled tokens, or None)
    is passed only to a function that takes it. ``config`` is the algorithm's config,
    ``per_token_loss`` is [B, T] like ``mask`` and ``metrics`` maps names to scalars."""


@hookspec
def register_off_policy_corrections(register: Register) -> None:
    """Register off-policy corrections, wrappers of any policy loss chosen with
    ``algorithm.off_policy_correction``: ``register(name, fn)``, where
    ``fn(per_token_loss, old_logp, rollout_logp, mask, *, config) -> (per_token_loss, metrics)``
    reweights or masks the policy loss by w = exp(log π_old − log π_rollout)."""


@hookspec
def register_value_losses(register: Register) -> None:
    """Register critic losses: ``register(name, fn)``, where
    ``fn(values, old_values, returns, mask, *, config) -> (per_token_loss, metrics)``."""


@hookspec
def register_preference_losses(register: Register) -> None:
    """Register offline pairwise/unpaired losses: ``register(name, fn)``, where
    ``fn(scores: PreferenceScores, *, config) -> (loss, metrics)`` (pairs data), or
    ``fn(scores: UnpairedScores, *, config) -> (loss, metrics)`` (unpaired data)."""


@hookspec
def register_reward_functions(register: Register) -> None:
    """Register rule rewards: ``register(name, fn)``, where
    ``fn(prompts, completions, labels, **columns) -> list[float] | dict``."""


@hookspec
def register_reward_models(register: Register) -> None:
    """Register reward-model loaders: ``register(name, factory)``, where
    ``factory(path, *, config) -> scorer`` and ``scorer(prompts, completions) -> list[float]``."""


@hookspec
def register_samplers(register: Register) -> None:
    """Register rollout-group samplers (filters, curricula): ``register(name, factory)``,
    where ``factory(options) -> sampler``, ``options`` the dict ``algorithm.sampler_options``,
    and the sampler has ``max_rounds`` and ``keep(groups: list[list[float]]) -> list[bool]``."""


@hookspec
def register_vlm_processors(register: Register) -> None:
    """Register multimodal processors: ``register(name, factory)``, where
    ``factory(model_path, *, config) -> processor`` and ``processor.encode(prompt, images)``
    returns an ``rlx.multimodal.VisionPrompt``; ``name`` is the ``model_type`` it serves."""


@hookspec
def register_tasks(register: Register) -> None:
    """Register built-in synthetic tasks, used as ``--data builtin:NAME``:
    ``register(name, Task(...))``."""


@hookspec
def register_environments(register: Register) -> None:
    """Register multi-turn environments, chosen with ``environment.name``:
    ``register(name, factory)``, where ``factory(**environment.options)`` makes one
    ``rlx.environments.Environment`` per episode (async ``reset(row) -> str`` and
    ``step(action) -> Step``)."""


@hookspec
def register_agents(register: Register) -> None:
    """Register agents, chosen with ``agent.name``: ``register(name, agent)``, where
    ``agent(row, base_url, **agent.options)`` (a function, async or not) plays one episode
    against the policy through the OpenAI-compatible chat API at ``base_url`` and returns
    its reward, or a list of per-turn rewards (``rlx.agents``)."""


@hookspec
def register_loggers(register: Register) -> None:
    """Register run loggers, chosen with ``logging.loggers``: ``register(name, factory)``,
    where ``factory(output_dir, options, *, start_step) -> logger`` opens one on rank 0 for
    a run (``options``: the dict ``logging.logger_options[name]``; ``start_step`` > 0 when
    the run resumes) and the logger has ``log(step, metrics)`` (name -> float, or None for
    a non-finite value), optionally ``log_samples(step, rows)`` (dicts with prompt,
    completion, reward, advantage) and ``close()``."""


@hookspec
def register_commands(app: Any) -> None:
    """Add sub-commands to the ``rlx`` typer application."""


@hookspec
def on_train_start(config: Any, output_dir: str) -> None:
    """Called once a run's config is resolved and its output folder exists."""


@hookspec
def on_rollout_end(step: int, rollout: Any, metrics: dict[str, float]) -> None:
    """Called after a rollout batch is generated, scored and given advantages."""


@hookspec
def on_step_end(step: int, metrics: dict[str, float]) -> None:
    """Called after each optimizer step with the metrics logged for it."""


@hookspec
def on_eval_end(step: int, metrics: dict[str, float]) -> None:
    """Called after each evaluation with its metrics."""


@hookspec
def on_train_end(output_dir: str, metrics: dict[str, float]) -> None:
    """Called once a run has finished and its final model is saved."""


@hookspec(firstresult=True)
def choose_rollout_engine(config: Any) -> str | None:
    """Name the rollout engine for a run (``"native"``, ``"vllm"`` ...); first answer wins."""


@hookspec(firstresult=True)
def choose_train_backend(config: Any) -> str | None:
    """Name the training backend for a run (``"plain"``, ``"deepspeed"``); first answer wins."""
