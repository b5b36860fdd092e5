"""Multi-turn episodes: token in, token out; observations masked; turn and length caps."""

import pytest
import torch

from e2e import one_thread  # noqa: F401 (autouse)
from rlx.environments import Step, run_episodes
from rlx.online import batch_of_completions
from rlx.rollout import SamplingParams


class Echo:
    """Answers every turn with `` ok`` and a newline; done after three turns."""

    def __init__(self):
        self.turns = 0

    async def reset(self, row):
        return f" [{row['label']}]"

    async def step(self, action):
        self.turns += 1
        return Step(observation=" ok\n", reward=0.5, done=self.turns == 3)


def prompts(tokenizer):
    return [{"prompt_ids": tokenizer(t)["input_ids"], "prompt_text": t, "label": t[:2]} for t in ("12+3=", "7-5=")]


def test_the_trained_tokens_are_the_generated_ones(engine):
    engine, tokenizer = engine
    calls = []

    def generate(ids, params):
        out = engine.generate(ids, params)
        calls.append((ids, out))
        return out

    rows = prompts(tokenizer)
    episodes, rewards, metrics = run_episodes(rows, generate, SamplingParams(n=2, max_new_tokens=6, seed=3), Echo,
                                              tokenizer, max_turns=5, max_length=200)
    assert len(calls) == 3 and rewards == [1.5] * 4 and metrics["env/turns"] == 3
    ok = tokenizer(" ok\n", add_special_tokens=False)["input_ids"]
    for i, e in enumerate(episodes):
        row = rows[i // 2]
        expected, mask = list(tokenizer(f" [{row['label']}]", add_special_tokens=False)["input_ids"]), None
        mask = [0] * len(expected)
        for turn, (ids, out) in enumerate(calls):
            assert ids[i] == row["prompt_ids"] + expected  # each turn continues the exact tokens so far
            expected += out[i].token_ids
            mask += [1] * len(out[i].token_ids)
            if turn < 2:
                expected += ok
                mask += [0] * len(ok)
        assert e.token_ids == expected and e.action_mask == mask and e.turns == 3

    # the trainer scores the same tokens in the same contexts the engine sampled them in
    batch = batch_of_completions([r["prompt_ids"] for r in rows for _ in range(2)], episodes, tokenizer.pad_token_id,
                                 rewards, [0, 0, 1, 1], "cpu")
    assert batch.action_mask.tolist() == [e.action_mask + [0] * (batch.action_mask.shape[1] - len(e.action_mask))
                                          for e in episodes]
    with torch.no_grad():
        logits = engine.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                              position_ids=batch.position_ids).logits.float()
    p = batch.prompt_len
    logp = torch.log_softmax(logits[:, p - 1:-1], -1).gather(-1, batch.input_ids[:, p:, None]).squeeze(-1)
    gap = ((logp - batch.rollout_logp).abs() * batch.action_mask).max().item()
    assert gap < 1e-4


def test_turns_and_length_are_capped(engine):
    engine, tokenizer = engine
    rows = prompts(tokenizer)
    params = SamplingParams(n=1, max_new_tokens=6, seed=0)
    episodes, _, metrics = run_episodes(rows, engine.generate, params, Echo, tokenizer, max_turns=2, max_length=200)
    assert all(e.turns == 2 for e in episodes) and metrics["env/turns"] == 2
    episodes, _, metrics = run_episodes(rows, engine.generate, params, Echo, tokenizer, max_turns=3, max_length=9)
    assert all(len(e.token_ids) <= 9 and len(e.action_mask) == len(e.token_ids) for e in episodes)
    assert metrics["env/truncated"] == 1.0


def test_an_unknown_environment_is_named(demo_policy, tmp_path):
    from rlx.config import resolve
    from rlx.plugins import build_host
    from rlx.run import run

    host = build_host()
    config = resolve(host.algorithms.get("grpo"), {"output": str(tmp_path / "run"), "environment": {"name": "chess"}})
    with pytest.raises(Exception, match="chess"):
        run(config, host)


class Broken(Echo):
    async def step(self, action):
        raise ValueError("no such move")


def test_an_environment_that_raises_is_named_with_the_prompt_and_turn(engine):
    from rlx.errors import RunError

    engine, tokenizer = engine
    with pytest.raises(RunError, match=r"environment Broken failed in turn 1 of the episode on prompt '12\+3=': "
                                       r"ValueError: no such move"):
        run_episodes(prompts(tokenizer), engine.generate, SamplingParams(n=1, max_new_tokens=4, seed=0), Broken,
                     tokenizer, max_turns=2, max_length=50)
