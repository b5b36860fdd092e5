import asyncio
import json

from rlx.testing import QUIET, one_thread  # noqa: F401 (one_thread: autouse)
from rlx_env_calculator import Calculator


def step(env, action):
    return asyncio.run(env.step(action))


def test_a_tool_call_reads_back_the_value():
    env = Calculator(tool_cost=0.1)
    asyncio.run(env.reset({"prompt": "12*7=", "label": "84"}))
    s = step(env, "<calc>12*(3+4)</calc>")
    assert (s.observation, s.reward, s.done) == ("<result>84</result>", -0.1, False)
    assert Calculator.stop == ("</calc>",)


def test_a_hostile_expression_reads_back_an_error():
    env = Calculator()
    s = step(env, "<calc>9**9**9**9</calc>")  # would run for ever and fill memory
    assert s.observation.startswith("<result>error:") and not s.done
    s = step(env, "<calc>__import__('os').system('touch /tmp/x')</calc>")
    assert "error:" in s.observation and "not arithmetic" in s.observation


def test_an_answer_ends_the_episode_with_its_score():
    env = Calculator()
    asyncio.run(env.reset({"prompt": "12+3=", "label": "15"}))
    assert (step(env, "15\n").reward, step(env, "15\n").done) == (1.0, True)
    assert step(env, "16").reward == 0.0


def test_grpo_in_the_environment_raises_reward(tmp_path):  # on the demo policy, builtin:tiny-arithmetic
    from rlx.config import resolve
    from rlx.plugins import build_host
    from rlx.run import run

    host = build_host()
    tree = {"output": str(tmp_path / "run"), "training": {"max_steps": 16}, "algorithm": {"eval_size": 0},
            "environment": {"name": "calculator", "max_turns": 2, "max_length": 16},
            "logging": {"progress": False, "tensorboard": False}, "checkpoint": {"save_final": False}}
    run(resolve(host.algorithms.get("grpo"), tree), host)
    rewards = [json.loads(line)["reward/mean"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
               if "reward/mean" in line]
    # over seeds 1-3 the last four steps gained 0.10 to 0.17 on the first four
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4 + 0.05, rewards


def test_the_agent_calls_the_calculator_and_scores_its_answer():
    from rlx_env_calculator.agent import solve

    replies = iter(["<calc>12*(3+4)</calc>", "84\n"])
    sent = []

    def chat(base_url, messages, **request):
        sent.append([dict(m) for m in messages])
        return next(replies)

    import rlx_env_calculator.agent as agent

    original, agent.chat = agent.chat, chat
    try:
        assert solve({"prompt": "12*7=", "label": "84"}, "http://x/v1", tool_cost=0.25) == 0.75
    finally:
        agent.chat = original
    assert sent[1][1:] == [{"role": "assistant", "content": "<calc>12*(3+4)</calc>"},
                           {"role": "user", "content": "<result>84</result>"}]


def test_rlx_train_grpo_with_the_calculator_agent(tmp_path):
    import os
    import subprocess
    import sys

    from rlx.tiny import builtin_model

    builtin_model("builtin:tiny-arithmetic")  # the demo policy, made once in the tests' cache

    settings = {"agent.name": "calculator", "agent.options.max_calls": "2", "training.max_steps": "2",
                "algorithm.rollout_batch_size": "4", "algorithm.n_samples": "4", "training.batch_size": "8",
                "training.micro_batch_size": "8", "algorithm.eval_size": "8", "data.builtin_size": "96",
                "logging.progress": "false", "logging.tensorboard": "false", "checkpoint.save_final": "false"}
    args = [a for key, value in settings.items() for a in ("--set", f"{key}={value}")]
    done = subprocess.run([sys.executable, "-m", "rlx_cli", "train", "--algo", "grpo", "--output", str(tmp_path / "run"),
                           *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][1:]
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert s["reward/agent"] == s["reward/mean"] and 1 <= s["agent/calls"] <= 2
        assert s["rollout/logp_diff_max"] < 1e-4  # the trainer scores the tokens the engine sampled, as sampled
