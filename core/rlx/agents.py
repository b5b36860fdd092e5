"""Agents: episodes played by user code that talks to the policy over an OpenAI-compatible chat API.

An agent plugin registers a function under a name (``register_agents``); ``agent.name``
picks it, and the online loop's rollouts are played by it: for each sample rlx calls
``agent(row, base_url, **agent.options)`` (async, or plain in a thread of its own) with a
base URL that serves the rollout engine as ``/v1/chat/completions`` (``rlx.chat_endpoint``),
and the agent returns the episode's reward, or a list of per-turn rewards (summed).

Token in, token out: every call is recorded as the prompt ids given to the engine and the
ids and log-probs it sampled. When a call's messages are the previous call's, then the
reply as it came back, then new ones, its prompt is the previous prompt and reply tokens
as they were, plus the new messages' text tokenized on its own; the episode is then one
sequence whose model tokens are trained on and whose added tokens are masked, exactly
like an environment's (``rlx.environments``). A call that does not continue the previous
one (the agent rewrote its history) stops the run (``agent.rewrites=error``), or starts
the episode afresh from that call (``last``: the calls before it are not trained on).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import queue
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from rlx.chat_endpoint import BadRequest, ChatCall, ChatEndpoint, completion_body
from rlx.config import AgentConfig
from rlx.environments import Episode
from rlx.errors import RunError
from rlx.rollout import SamplingParams


@dataclass
class AgentEpisode(Episode):
    """An episode an agent played; ``prompt_ids`` is its first call's prompt, which the agent
    wrote (a system message, its own wording) and need not be the data row's."""

    prompt_ids: list[int] = field(default_factory=list)


@dataclass
class _Call:
    """One answered call: the conversation as rendered, the engine's prompt and sample, and
    the reply the agent got (the sampled tokens' text)."""

    text: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    content: str
    finish_reason: str


@dataclass
class _Conversation:
    """One episode's state while its agent plays; ``trajectories`` are runs of calls each
    continuing the one before (one run unless the agent rewrote its history)."""

    index: int  # the episode's place in the rollout
    row: dict
    url: str = ""
    trajectories: list[list[_Call]] = field(default_factory=list)
    calls: int = 0
    truncated: bool = False
    result: Any = None
    failure: str = ""  # why the episode failed; the run stops
    finished: bool = False


def play(prompts: list[dict], generate: Callable, params: SamplingParams, agent: Callable, tokenizer,
         settings: AgentConfig, *, name: str = "agent", template: str | None = None, temperature: float = 1.0,
         max_prompt_length: int | None = None) -> tuple[list[AgentEpisode], list[float], dict[str, float]]:
    """``params.n`` episodes per prompt played by ``agent``, prompt-major; their rewards and
    metrics. ``template`` is the chat template (None: a conversation is its messages'
    contents one after the other); ``temperature`` the one calls must sample at (the
    trainer's). An agent that raises, returns no reward or times out stops the run,
    naming ``name`` and the episode's prompt."""
    return _Rollout(prompts, generate, params, tokenizer, settings, template, temperature,
                    max_prompt_length).run(agent, name)


class _Rollout:
    def __init__(self, prompts, generate, params, tokenizer, settings, template, temperature, max_prompt_length):
        self.generate, self.params, self.tokenizer, self.settings = generate, params, tokenizer, settings
        self.template, self.temperature, self.max_prompt_length = template, temperature, max_prompt_length
        self.n = params.n
        self.rows = [p for p in prompts for _ in range(self.n)]
        self.conversations: dict[str, _Conversation] = {}
        self.batches = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.main: asyncio.Task | None = None
        self.started = threading.Event()

    # -- the run: agents in an event loop of their own, the engine in this thread

    def run(self, agent: Callable, name: str):
        self.endpoint = ChatEndpoint()
        for i, row in enumerate(self.rows):
            key = secrets.token_hex(8)
            self.conversations[key] = _Conversation(i, row, self.endpoint.open(key))
        players = threading.Thread(target=self._play_all, args=(agent,), name="rlx-agents", daemon=True)
        players.start()
        try:
            self._serve()
        finally:
            self.started.wait()
            if players.is_alive():  # the run stops early: what still plays is cancelled
                try:
                    self.loop.call_soon_threadsafe(self.main.cancel)
                except RuntimeError:  # the loop closed meanwhile
                    pass
            self.endpoint.close()
            players.join(timeout=10)
        played = list(self.conversations.values())
        # a failure first: when one stops the rollout, other episodes may not have called yet
        failed = next((c for c in played if c.failure), None)
        if failed is None:
            failed = next((c for c in played if not c.trajectories), None)
            if failed is not None:
                failed.failure = f"made no call to the model at {failed.url}: there is nothing to train on"
        if failed is not None:
            raise RunError(f"agent {name!r} failed on the episode of prompt {failed.row['prompt_text'][:80]!r}: "
                           f"{failed.failure}")
        episodes = [self._episode(c, c.index // self.n) for c in played]
        rewards = [sum(e.turn_rewards) for e in episodes]
        count = len(episodes)
        metrics = {"reward/agent": sum(rewards) / count,
                   "agent/calls": sum(c.calls for c in played) / count,
                   "agent/truncated": sum(e.finish_reason == "length" for e in episodes) / count,
                   "agent/rewritten": sum(len(c.trajectories) > 1 for c in played) / count}
        return episodes, rewards, metrics

    def _play_all(self, agent: Callable) -> None:
        async def main():
            self.loop, self.main = asyncio.get_running_loop(), asyncio.current_task()
            self.started.set()
            await asyncio.gather(*(self._play(agent, c) for c in self.conversations.values()))

        try:
            asyncio.run(main())
        except asyncio.CancelledError:
            pass
        finally:
            self.started.set()
            self.endpoint.calls.put(None)  # wakes the engine's loop

    async def _play(self, agent: Callable, c: _Conversation) -> None:
        row = {"prompt": c.row.get("prompt", c.row["prompt_text"]), "label": c.row["label"], **c.row.get("columns", {})}
        options = self.settings.options
        if _is_async(agent):
            task = asyncio.ensure_future(agent(row, c.url, **options))
        else:  # a plain function blocks: a daemon thread, which a timeout can leave behind
            task = _in_thread(agent, row, c.url, options)
        try:
            done, _ = await asyncio.wait({task}, timeout=self.settings.timeout)
            if not done:
                c.failure = c.failure or f"it took longer than agent.timeout={self.settings.timeout:g} s"
            else:
                c.result = _turn_rewards(task.result())
        except Exception as e:  # a refused call comes first: it is what the agent's error follows from
            c.failure = c.failure or (str(e) if isinstance(e, _Raised) else f"{type(e).__name__}: {e}")
        finally:  # the rollout stopped early: an agent still playing is dropped, its outcome unheard
            task.cancel()
            c.finished = True
            self.endpoint.calls.put(None)

    def _serve(self) -> None:
        """Answer calls in batches until every agent has finished or one has failed: a batch
        goes to the engine once every playing agent waits on a call, or ``batch_wait``
        after its first call came (an agent may be busy with a tool meanwhile)."""
        pending: list[ChatCall] = []
        wait = self.settings.batch_wait
        while True:
            timeout = 0.5 if not pending else max(0.0, pending[0].arrived + wait - time.monotonic())
            items = []
            try:
                items.append(self.endpoint.calls.get(timeout=timeout))
                while True:
                    items.append(self.endpoint.calls.get_nowait())
            except queue.Empty:
                pass
            for item in items:
                if isinstance(item, ChatCall):
                    pending.append(item)
                elif isinstance(item, tuple):  # ("refused", key, why): the endpoint refused a malformed call
                    self._refuse(self.conversations[item[1]], item[2])
            if any(c.failure for c in self.conversations.values()):
                return
            playing = sum(not c.finished for c in self.conversations.values())
            if pending and (len(pending) >= playing or time.monotonic() >= pending[0].arrived + wait):
                self._answer(pending)
                pending = []
            elif not pending and not playing:
                return

    @staticmethod
    def _refuse(c: _Conversation, why: str) -> None:
        c.failure = c.failure or f"the chat endpoint refused call {c.calls + 1}: {why}"

    # -- calls

    def _answer(self, calls: list[ChatCall]) -> None:
        """Generate the replies of ``calls``, one engine call per distinct sampling setting, in
        the episodes' order (not the calls' arrival), so that a seeded rollout draws alike."""
        groups: dict[tuple, list] = {}
        for call in sorted(calls, key=lambda call: self.conversations[call.key].index):
            c = self.conversations[call.key]
            try:
                job = self._prepare(c, call)
            except BadRequest as e:
                self._refuse(c, str(e))
                call.fail(e)
                continue
            if job is None:  # the episode's budget is spent
                c.truncated = True
                call.answer(200, completion_body("", "length", 0, 0, [] if call.logprobs else None))
                continue
            text, ids, new, params, limit = job
            groups.setdefault((params.top_p, params.stop), []).append((call, c, text, ids, new, params, limit))
        for jobs in groups.values():
            params = dataclasses.replace(jobs[0][5], max_new_tokens=max(j[6] for j in jobs),
                                         seed=None if self.params.seed is None else self.params.seed
                                         + self.batches * 1_000_003)
            self.batches += 1
            samples = self.generate([j[3] for j in jobs], params)
            for (call, c, text, ids, new, _, limit), sample in zip(jobs, samples):
                self._record(call, c, text, ids, new, limit, sample)

    def _prepare(self, c: _Conversation, call: ChatCall):
        """(text, prompt ids, starts a trajectory, sampling params, token limit) of a call, or
        None when the episode may not call the model again."""
        if call.temperature is not None and call.temperature != self.temperature:
            raise BadRequest(f"temperature {call.temperature:g}: this endpoint samples at rollout.temperature="
                             f"{self.temperature:g}, the temperature the trainer's log-probs are taken at; "
                             "leave temperature out of the request or set rollout.temperature")
        if c.calls >= self.settings.max_calls:
            return None
        text = self._render(call)
        ids, new = self._continue(c, text), False
        if ids is None:
            if c.trajectories and self.settings.rewrites == "error":
                raise BadRequest(f"call {c.calls + 1} does not continue call {c.calls}: its messages must be the "
                                 "earlier call's, its reply exactly as it came back, then new ones "
                                 "(agent.rewrites=last trains on the calls from such a call on instead)")
            ids, new = self._ids(text, first=True), True
            if self.max_prompt_length is not None and len(ids) > self.max_prompt_length:
                raise BadRequest(f"the conversation is {len(ids)} tokens long, more than data.max_prompt_length="
                                 f"{self.max_prompt_length}")
        start = len(ids) if new else len(c.trajectories[-1][0].prompt_ids)
        room = self.settings.max_length - (len(ids) - start)
        limit = min(call.max_tokens or self.params.max_new_tokens, self.params.max_new_tokens, room)
        if limit < 1:
            return None
        params = dataclasses.replace(self.params, n=1, top_p=min(self.params.top_p, call.top_p or 1.0),
                                     stop=tuple(dict.fromkeys(self.params.stop + call.stop)))
        return text, ids, new, params, limit

    def _render(self, call: ChatCall) -> str:
        if self.template is None:
            return "".join(m["content"] for m in call.messages)
        try:
            return self.tokenizer.apply_chat_template(call.messages, tools=call.tools, chat_template=self.template,
                                                      tokenize=False, add_generation_prompt=True)
        except Exception as e:  # the template refuses the conversation (an order of roles it does not know)
            raise BadRequest(f"the chat template cannot render these messages: {type(e).__name__}: {e}") from e

    def _ids(self, text: str, first: bool = False) -> list[int]:
        # a conversation's start gets the tokenizer's special tokens only as plain text, as data prompts do
        special = first and self.template is None
        return self.tokenizer(text, add_special_tokens=special)["input_ids"] if text else []

    def _continue(self, c: _Conversation, text: str) -> list[int] | None:
        """The prompt ids of a call whose conversation ``text`` continues the last call's:
        that call's prompt and sampled tokens as they were, then the new text's tokens. None
        when it does not continue it."""
        if not c.trajectories:
            return None
        last = c.trajectories[-1][-1]
        seen = last.text + last.content
        if not text.startswith(seen):
            return None
        added = text[len(seen):]
        # the sampled tokens may end in special ones the reply's text leaves out (an end of turn);
        # a template that writes them again after the reply must not add them twice
        full = self.tokenizer.decode(last.token_ids, skip_special_tokens=False)
        tail = full[len(last.content):] if full.startswith(last.content) else ""
        if tail and added.startswith(tail):
            added = added[len(tail):]
        return last.prompt_ids + last.token_ids + self._ids(added)

    def _record(self, call: ChatCall, c: _Conversation, text: str, ids: list[int], new: bool, limit: int,
                sample) -> None:
        tokens = list(sample.token_ids[:limit])
        logprobs = list(sample.logprobs[:limit]) if sample.logprobs is not None else [0.0] * len(tokens)
        reason = "length" if len(sample.token_ids) > limit else sample.finish_reason
        # the reply is the text of exactly the tokens sampled (a stop string included), so that
        # an agent that sends it back continues the very same tokens
        content = self.tokenizer.decode(tokens, skip_special_tokens=True)
        record = _Call(text, ids, tokens, logprobs, content, reason)
        if new:
            c.trajectories.append([record])
        else:
            c.trajectories[-1].append(record)
        c.calls += 1
        shown = None
        if call.logprobs:
            pieces = [self.tokenizer.decode([t]) for t in tokens]
            shown = [{"token": p, "logprob": lp, "bytes": list(p.encode()), "top_logprobs": []}
                     for p, lp in zip(pieces, logprobs)]
        call.answer(200, completion_body(content, reason, len(ids), len(tokens), shown))

    # -- episodes

    def _episode(self, c: _Conversation, prompt_index: int) -> AgentEpisode:
        """The last trajectory as one sequence: sampled tokens trained on, the agent's masked."""
        calls = c.trajectories[-1]
        start = len(calls[0].prompt_ids)
        ids, logprobs, mask = [], [], []
        for call in calls:
            added = call.prompt_ids[start + len(ids):]  # what the agent sent since the last reply
            ids += added + call.token_ids
            logprobs += [0.0] * len(added) + call.logprobs
            mask += [0] * len(added) + [1] * len(call.token_ids)
        truncated = c.truncated or calls[-1].finish_reason == "length"
        return AgentEpisode(prompt_index, ids, logprobs, self.tokenizer.decode(ids, skip_special_tokens=True),
                            "length" if truncated else "stop", action_mask=mask, turns=len(calls),
                            turn_rewards=c.result, prompt_ids=calls[0].prompt_ids)


def _turn_rewards(result: Any) -> list[float]:
    """An agent's result as per-turn rewards: one number, or a non-empty list of them."""
    values = result if isinstance(result, (list, tuple)) else [result]
    if not values or not all(isinstance(v, (int, float)) for v in values):
        raise ValueError(f"it returned {result!r}; an agent returns its reward (a number) or one per turn "
                         "(a list of numbers)")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"it returned {result!r}, which is not a finite reward")
    return [float(v) for v in values]


def _is_async(agent: Callable) -> bool:
    return inspect.iscoroutinefunction(agent) or inspect.iscoroutinefunction(getattr(agent, "__call__", None))


class _Raised(Exception):
    """What an agent run in a thread raised, as text: the exception itself, with its frames
    of another thread, stays in that thread."""


def _in_thread(fn: Callable, row: dict, url: str, options: dict) -> asyncio.Future:
    """``fn(row, url, **options)`` in a daemon thread, as a future of the running loop."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value, error: str | None) -> None:
        if not future.done():
            future.set_exception(_Raised(error)) if error is not None else future.set_result(value)

    def run() -> None:
        try:
            value, error = fn(row, url, **options), None
        except BaseException as e:  # noqa: BLE001 (handed to the loop, which reports it)
            value, error = None, f"{type(e).__name__}: {e}"
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the rollout ended (a failure elsewhere) and its loop closed
            pass

    threading.Thread(target=run, name="rlx-agent", daemon=True).start()
    return future


def agent_sampler(config, host, generate, tokenizer):
    """``(prompts, params) -> (episodes, RewardResult)`` for a run with an agent; None without."""
    g = config.agent
    if not g.name:
        return None
    from rlx import data
    from rlx.rewards import RewardResult

    agent = host.get("register_agents", g.name)
    template = data.resolve_template(tokenizer, config.data.chat_template)

    def sample(prompts, params):
        episodes, rewards, metrics = play(prompts, generate, params, agent, tokenizer, g, name=g.name,
                                          template=template, temperature=config.rollout.temperature,
                                          max_prompt_length=config.data.max_prompt_length)
        return episodes, RewardResult(rewards, rewards, metrics)

    return sample
