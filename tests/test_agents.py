"""Agents over the OpenAI-compatible chat endpoint: the wire shape, token in and token out,
masking of what the agent adds, budgets, rewritten histories and failing agents."""

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest
import torch

from e2e import one_thread  # noqa: F401 (autouse)
from rlx.agents import play
from rlx.chat_endpoint import ChatEndpoint
from rlx.config import AgentConfig
from rlx.errors import RunError
from rlx.online import batch_of_completions
from rlx.rollout import SamplingParams
from rlx.tiny import CHAT_TEMPLATE


def post(url, body, method="POST"):
    """(status, JSON answer) of a request; plain urllib, as any client would send it."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def chat(base_url, messages, **request):
    status, answer = post(f"{base_url}/chat/completions", {"model": "policy", "messages": messages, **request})
    assert status == 200, answer
    return answer


def prompts(tokenizer):
    return [{"prompt_ids": tokenizer(t)["input_ids"], "prompt_text": t, "prompt": t, "label": t[:2]}
            for t in ("12+3=", "7-5=")]


def settings(**values):
    return AgentConfig(**{"batch_wait": 5.0, **values})  # a batch waits for every episode: deterministic batches


def test_the_endpoint_speaks_the_openai_shape():
    endpoint = ChatEndpoint()
    try:
        base = endpoint.open("ab12")
        assert post(f"{endpoint.url}/v1/models", None, "GET") == post(f"{base}/models", None, "GET")
        status, models = post(f"{base}/models", None, "GET")
        assert status == 200 and models["object"] == "list" and models["data"][0]["id"] == "policy"
        status, answer = post(f"{endpoint.url}/episodes/ffff/v1/chat/completions", {"messages": []})
        assert status == 404 and set(answer["error"]) == {"message", "type", "code"}
        for body, says in (({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n must be 1"),
                           ({"messages": "hi"}, "messages must be a non-empty list"),
                           ({"messages": [{"role": "user", "content": "hi"}], "stream": True}, "stream")):
            status, answer = post(f"{base}/chat/completions", body)
            assert status == 400 and says in answer["error"]["message"]
            assert answer["error"]["type"] == "invalid_request_error"
            assert endpoint.calls.get_nowait()[:2] == ("refused", "ab12")  # the run hears of it
    finally:
        endpoint.close()


def test_every_agent_of_a_large_rollout_connects_at_once():
    """More agents than a listen backlog of 5 calling together: none is reset."""
    import threading

    from rlx.chat_endpoint import completion_body

    endpoint = ChatEndpoint()
    answers, errors = [], []

    def call(base):
        try:
            answers.append(chat(base, [{"role": "user", "content": "hi"}]))
        except Exception as e:
            errors.append(repr(e))

    try:
        agents = [threading.Thread(target=call, args=(endpoint.open(f"{i:04x}"),)) for i in range(256)]
        for agent in agents:
            agent.start()
        waiting = [endpoint.calls.get(timeout=30) for _ in agents]  # every call arrives
        for c in waiting:
            c.answer(200, completion_body("ok", "stop", 1, 1))
        for agent in agents:
            agent.join(timeout=30)
    finally:
        endpoint.close()
    assert errors == [] and len(answers) == 256


def test_replies_have_the_openai_shape_and_the_run_sampling_settings(engine):
    engine, tokenizer = engine
    seen = {}

    def agent(row, base_url):
        seen["answer"] = chat(base_url, [{"role": "user", "content": row["prompt"]}], max_tokens=3, logprobs=True,
                              stop="\n", top_p=0.5)
        return 1.0

    asked = []

    def generate(ids, params):
        asked.append(params)
        return engine.generate(ids, params)

    play(prompts(tokenizer)[:1], generate, SamplingParams(n=1, max_new_tokens=6, seed=0, top_p=0.9), agent, tokenizer,
         settings(), template=CHAT_TEMPLATE)
    answer = seen["answer"]
    assert answer["object"] == "chat.completion" and answer["id"].startswith("chatcmpl-")
    choice = answer["choices"][0]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length") and isinstance(choice["message"]["content"], str)
    usage = answer["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] and usage["completion_tokens"] <= 3
    assert len(choice["logprobs"]["content"]) == usage["completion_tokens"]
    assert all(p["logprob"] <= 0 for p in choice["logprobs"]["content"])
    # the request narrows the run's settings: fewer tokens, a smaller top_p, one more stop string
    assert asked[0].max_new_tokens == 3 and asked[0].top_p == 0.5 and asked[0].stop == ("\n",) and asked[0].n == 1


class Talker:
    """A system message of its own, then three calls; after each reply it says `` ok``."""

    def __init__(self, template=True):
        self.template = template

    def __call__(self, row, base_url):
        messages = [{"role": "system", "content": "Be brief."}] if self.template else []
        messages.append({"role": "user", "content": row["prompt"]})
        for _ in range(3):
            reply = chat(base_url, messages)["choices"][0]["message"]
            messages += [reply, {"role": "user", "content": " ok"}]
        return [0.25, 0.25, 0.5]


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, None], ids=["chat-template", "plain-text"])
def test_the_trained_tokens_are_the_generated_ones_and_the_agents_are_masked(engine, template):
    engine, tokenizer = engine
    calls = []

    def generate(ids, params):
        out = engine.generate(ids, params)
        calls.append((ids, out))
        return out

    rows = prompts(tokenizer)
    episodes, rewards, metrics = play(rows, generate, SamplingParams(n=2, max_new_tokens=5, seed=3),
                                      Talker(template is not None), tokenizer, settings(), template=template)
    assert len(calls) == 3 and all(len(ids) == 4 for ids, _ in calls)  # every call of a turn in one batch
    assert rewards == [1.0] * 4 and metrics["agent/calls"] == 3 and metrics["agent/rewritten"] == 0
    for i, e in enumerate(episodes):
        first = calls[0][0][i]
        assert e.prompt_ids == first and e.turns == 3 and e.prompt_index == i // 2
        if template is not None:  # the agent's own prompt, not the row's
            assert first != rows[i // 2]["prompt_ids"] and tokenizer.decode(first).startswith("<|im_start|>system")
        tokens, mask = [], []
        for turn, (ids, out) in enumerate(calls):
            added = ids[i][len(first) + len(tokens):]
            assert ids[i] == first + tokens + added  # each call continues the exact tokens so far
            assert (len(added) > 0) == (turn > 0)
            if turn:
                assert "ok" in tokenizer.decode(added)
            tokens += added + out[i].token_ids
            mask += [0] * len(added) + [1] * len(out[i].token_ids)
        assert e.token_ids == tokens and e.action_mask == mask
        assert [lp for lp, m in zip(e.logprobs, mask) if m] == [lp for _, out in calls for lp in out[i].logprobs]

    # the trainer scores the same tokens in the same contexts the engine sampled them in
    batch = batch_of_completions([e.prompt_ids for e in episodes], episodes, tokenizer.pad_token_id, rewards,
                                 [0, 0, 1, 1], "cpu")
    with torch.no_grad():
        logits = engine.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                              position_ids=batch.position_ids).logits.float()
    p = batch.prompt_len
    logp = torch.log_softmax(logits[:, p - 1:-1], -1).gather(-1, batch.input_ids[:, p:, None]).squeeze(-1)
    assert ((logp - batch.rollout_logp).abs() * batch.action_mask).max().item() < 1e-4


def test_an_async_agent_and_the_budgets(engine):
    engine, tokenizer = engine
    replies = []

    async def agent(row, base_url):
        messages = [{"role": "user", "content": row["prompt"]}]
        for _ in range(3):
            choice = (await asyncio.to_thread(chat, base_url, messages))["choices"][0]
            replies.append(choice)
            messages += [choice["message"], {"role": "user", "content": " and?"}]
        return 1

    rows = prompts(tokenizer)[:1]
    params = SamplingParams(n=1, max_new_tokens=4, seed=0)
    episodes, rewards, metrics = play(rows, engine.generate, params, agent, tokenizer, settings(max_calls=2))
    assert rewards == [1.0] and episodes[0].turns == 2 and episodes[0].finish_reason == "length"
    assert replies[2] == {"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "length",
                          "logprobs": None}
    assert metrics["agent/truncated"] == 1.0
    episodes, _, _ = play(rows, engine.generate, params, agent, tokenizer, settings(max_length=6))
    assert len(episodes[0].token_ids) <= 6 and len(episodes[0].action_mask) == len(episodes[0].token_ids)


def rewriter(row, base_url):
    """Its second call drops the first reply: a rewritten history."""
    chat(base_url, [{"role": "user", "content": row["prompt"]}])
    chat(base_url, [{"role": "user", "content": row["prompt"] + " again"}])
    return 0.5


def test_a_rewritten_history_stops_the_run_or_starts_the_episode_afresh(engine):
    engine, tokenizer = engine
    params = SamplingParams(n=1, max_new_tokens=4, seed=0)
    with pytest.raises(RunError, match=r"agent 'rewriter' failed on the episode of prompt '12\+3=': the chat endpoint "
                                       r"refused call 2: call 2 does not continue call 1"):
        play(prompts(tokenizer), engine.generate, params, rewriter, tokenizer, settings(), name="rewriter")
    calls = []

    def generate(ids, params):
        calls.append(ids)
        return engine.generate(ids, params)

    episodes, rewards, metrics = play(prompts(tokenizer), generate, params, rewriter, tokenizer,
                                      settings(rewrites="last"))
    assert [e.prompt_ids for e in episodes] == calls[1] and all(e.turns == 1 and 0 not in e.action_mask
                                                                 for e in episodes)
    assert metrics["agent/rewritten"] == 1.0 and metrics["agent/calls"] == 2 and rewards == [0.5, 0.5]


def raises(row, base_url):
    chat(base_url, [{"role": "user", "content": row["prompt"]}])
    raise ValueError("the tool broke")


def no_reward(row, base_url):
    chat(base_url, [{"role": "user", "content": row["prompt"]}])


def no_call(row, base_url):
    return 1.0


def slow(row, base_url):
    time.sleep(30)


def second_fails(row, base_url):
    """The first row's episode waits before calling; the second row's raises."""
    if row["prompt"] == "12+3=":
        time.sleep(2)
        chat(base_url, [{"role": "user", "content": row["prompt"]}])
        return 1.0
    raise ValueError("the second row broke")


def too_hot(row, base_url):
    chat(base_url, [{"role": "user", "content": row["prompt"]}], temperature=0.7)
    return 1.0


@pytest.mark.parametrize("agent, says", [
    (raises, "ValueError: the tool broke"),
    (no_reward, "it returned None; an agent returns its reward"),
    (no_call, "made no call to the model"),
    (slow, "it took longer than agent.timeout=0.5 s"),
    (second_fails, "on the episode of prompt '7-5=': ValueError: the second row broke"),
    (too_hot, "refused call 1: temperature 0.7: this endpoint samples at rollout.temperature=1"),
])
def test_a_failing_agent_stops_the_run_naming_it_and_the_prompt(engine, agent, says):
    engine, tokenizer = engine
    started = time.monotonic()
    with pytest.raises(RunError, match=r"agent 'demo' failed on the episode of prompt '(12\+3|7-5)=': ") as error:
        play(prompts(tokenizer), engine.generate, SamplingParams(n=2, max_new_tokens=3, seed=0), agent, tokenizer,
             settings(timeout=0.5, batch_wait=0.01), name="demo")
    assert says in str(error.value)
    assert time.monotonic() - started < 10  # never waits on the agents still playing


def test_the_openai_client_talks_to_the_endpoint(engine):
    openai = pytest.importorskip("openai")  # not a dependency of rlx: checked when it is installed
    engine, tokenizer = engine

    async def agent(row, base_url):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)
        assert [m.id for m in (await client.models.list()).data] == ["policy"]
        messages = [{"role": "user", "content": row["prompt"]}]
        first = await client.chat.completions.create(model="policy", messages=messages, max_tokens=3)
        messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "?"}]
        second = await client.chat.completions.create(model="policy", messages=messages, max_tokens=3)
        return [0.0, float(second.choices[0].finish_reason in ("stop", "length"))]

    episodes, rewards, _ = play(prompts(tokenizer)[:1], engine.generate, SamplingParams(n=1, max_new_tokens=4, seed=0),
                                agent, tokenizer, settings(), template=CHAT_TEMPLATE)
    assert rewards == [1.0] and episodes[0].turns == 2 and 0 in episodes[0].action_mask
