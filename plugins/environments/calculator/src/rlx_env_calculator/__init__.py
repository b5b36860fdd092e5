"""``calculator``: a tool-use environment for questions with exact answers.

In each turn the policy either calls the calculator, writing ``<calc>EXPRESSION</calc>``
(the turn ends at ``</calc>``), and reads back ``<result>VALUE</result>``; or it answers,
and the episode ends with reward 1.0 if the answer matches the row's label (the built-in
tasks' rule: the text up to the first new line), else 0.0. Each call may cost
``tool_cost`` reward. The expression is evaluated in rlx's sandbox (a separate process
with time and memory limits), so a call that would hang or exhaust memory reads back an
error instead of stalling the run.

    rlx train --algo grpo --set environment.name=calculator --set environment.max_turns=3

The same task is also registered as an agent (``agent.name=calculator``, ``agent.py``): an
agent loop of its own that talks to the policy through rlx's OpenAI-compatible chat API.
"""

from __future__ import annotations

import asyncio
import re

from rlx import hookimpl
from rlx.tasks import exact_match
from rlx_env_calculator.agent import solve

CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)


class Calculator:
    stop = ("</calc>",)

    def __init__(self, tool_cost: float = 0.0):
        self.tool_cost = float(tool_cost)
        self.label = ""

    async def reset(self, row: dict) -> str:
        self.label = str(row["label"])
        return ""

    async def step(self, action: str) -> Step:
        from rlx.environments import Step  # imports torch: not at load, where `rlx plugins list` runs

        call = CALL.search(action)
        if call is None:
            return Step(reward=exact_match(action, self.label), done=True)
        from rlx.tools import calculator

        # the sandbox blocks on a child process: a thread lets other episodes' calls run meanwhile
        value = await asyncio.to_thread(calculator, call.group(1))
        return Step(observation=f"<result>{value}</result>", reward=-self.tool_cost)


@hookimpl
def register_environments(register):
    register("calculator", Calculator)


@hookimpl
def register_agents(register):
    register("calculator", solve)
