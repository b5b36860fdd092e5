"""Multi-turn environments: episodes in which the policy acts and an environment answers.

An environment plugin registers a factory under a name (``register_environments``);
``environment.name`` picks it, and the online loop's rollouts become episodes: the
policy generates a turn, the environment reads it and answers with an observation (a
tool's output, a user's reply) and a reward, until it says the episode is done, the
turns run out (``environment.max_turns``) or the response reaches
``environment.max_length`` tokens.

Token in, token out: a turn's tokens are kept exactly as the engine sampled them, and an
observation is tokenized on its own and appended, so the sequence the policy trains on
is the one it generated (a decoded and re-tokenized text can split differently). The
observation's tokens are masked out of the loss. An episode's reward is the sum of its
turns' rewards.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

from rlx.errors import RunError
from rlx.rollout import Completion, SamplingParams


@dataclass
class Step:
    """What an environment answers to a turn: ``observation`` is appended to the
    conversation (not trained on), ``reward`` is this turn's, ``done`` ends the episode."""

    observation: str = ""
    reward: float = 0.0
    done: bool = False


@runtime_checkable
class Environment(Protocol):
    """One episode's environment; a factory makes a fresh one per episode.

    ``stop`` (optional attribute): strings that end a turn, e.g. the close of a tool call.
    """

    async def reset(self, row: dict[str, Any]) -> str:
        """Start an episode on a data row (``prompt``, ``label`` and the row's other
        columns); returns text appended after the prompt before the first turn ("" for none)."""
        ...

    async def step(self, action: str) -> Step:
        """The policy's turn, as text; the environment's answer."""
        ...


@dataclass
class Episode(Completion):
    """A completion of several turns: ``action_mask`` is 1 on the policy's tokens and 0
    on the environment's, ``logprobs`` 0.0 on the environment's."""

    action_mask: list[int] = field(default_factory=list)
    turns: int = 0
    turn_rewards: list[float] = field(default_factory=list)


def run_episodes(prompts: list[dict], generate: Callable, params: SamplingParams, make_env: Callable[[], Environment],
                 tokenizer, max_turns: int, max_length: int) -> tuple[list[Episode], list[float], dict[str, float]]:
    """``params.n`` episodes per prompt, prompt-major; their rewards and metrics. An
    environment that raises stops the run, naming the episode's prompt and turn."""
    return asyncio.run(_episodes(prompts, generate, params, make_env, tokenizer, max_turns, max_length))


async def _checked(call, env, row: dict, what: str):
    try:
        return await call
    except Exception as e:
        raise RunError(f"environment {type(env).__name__} failed in {what} of the episode on prompt "
                       f"{row['prompt_text'][:80]!r}: {type(e).__name__}: {e}") from e


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


async def _episodes(prompts, generate, params, make_env, tokenizer, max_turns, max_length):
    n = params.n
    rows = [p for p in prompts for _ in range(n)]
    envs = [make_env() for _ in rows]
    stop = tuple(params.stop) + tuple(getattr(envs[0], "stop", ()))
    first = await asyncio.gather(*(_checked(env.reset({"prompt": row["prompt_text"], "label": row["label"],
                                                       **row.get("columns", {})}), env, row, "reset")
                                   for env, row in zip(envs, rows)))
    episodes = [Episode(i // n, [], [], "", "stop") for i in range(len(rows))]
    for episode, text in zip(episodes, first):
        _observe(episode, _ids(tokenizer, text), max_length)
    done = [len(e.token_ids) >= max_length for e in episodes]
    for turn in range(max_turns):
        active = [i for i, d in enumerate(done) if not d]
        if not active:
            break
        room = max(max_length - len(episodes[i].token_ids) for i in active)
        turn_params = dataclasses.replace(params, n=1, stop=stop, max_new_tokens=min(params.max_new_tokens, room),
                                          seed=None if params.seed is None else params.seed + turn * 1_000_003)
        sampled = generate([rows[i]["prompt_ids"] + episodes[i].token_ids for i in active], turn_params)
        for i, c in zip(active, sampled):  # the engine's tokens as sampled, cut to the episode's room
            keep = max_length - len(episodes[i].token_ids)
            episodes[i].token_ids += c.token_ids[:keep]
            episodes[i].logprobs += list(c.logprobs[:keep]) if c.logprobs is not None else [0.0] * len(c.token_ids[:keep])
            episodes[i].action_mask += [1] * len(c.token_ids[:keep])
            episodes[i].turns += 1
            if len(c.token_ids) > keep or (c.finish_reason == "length" and len(episodes[i].token_ids) >= max_length):
                episodes[i].finish_reason = "length"
        steps = await asyncio.gather(*(_checked(envs[i].step(c.text), envs[i], rows[i], f"turn {turn + 1}")
                                       for i, c in zip(active, sampled)))
        for i, s in zip(active, steps):
            episodes[i].turn_rewards.append(float(s.reward))
            if s.done or turn == max_turns - 1 or episodes[i].finish_reason == "length":
                done[i] = True
                continue
            _observe(episodes[i], _ids(tokenizer, s.observation), max_length)
            done[i] = len(episodes[i].token_ids) >= max_length
    for e in episodes:
        e.text = tokenizer.decode(e.token_ids, skip_special_tokens=True)
    rewards = [sum(e.turn_rewards) for e in episodes]
    metrics = {"env/turns": sum(e.turns for e in episodes) / len(episodes),
               "env/truncated": sum(e.finish_reason == "length" for e in episodes) / len(episodes)}
    return episodes, rewards, metrics


def _observe(episode: Episode, ids: list[int], max_length: int) -> None:
    """Append an observation's tokens, masked, within the episode's length."""
    ids = ids[:max(0, max_length - len(episode.token_ids))]
    episode.token_ids += ids
    episode.logprobs += [0.0] * len(ids)
    episode.action_mask += [0] * len(ids)
