"""The calculator task played by an agent: rlx's OpenAI-compatible chat API on one side, a
plain agent loop on the other.

The agent sends the question as a user message and reads the model's reply. A reply that
calls the calculator, ``<calc>12*(3+4)</calc>``, is evaluated in rlx's sandbox and sent
back as a user message ``<result>84</result>``; any other reply is the answer, scored
against the row's label by the built-in tasks' rule, less ``tool_cost`` per call. It talks
to the model over HTTP with the standard library alone, as an agent written for any
OpenAI-compatible server would (with the ``openai`` package it would be
``AsyncOpenAI(base_url=base_url, api_key="none").chat.completions.create(...)``).

    rlx train --algo grpo --set agent.name=calculator --set agent.options.max_calls=2
"""

from __future__ import annotations

import json
import re
import urllib.request

from rlx.tasks import exact_match

CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)


def chat(base_url: str, messages: list[dict], **request) -> str:
    """The content of the model's reply to ``messages``."""
    body = json.dumps({"model": "policy", "messages": messages, **request}).encode()
    http = urllib.request.Request(f"{base_url}/chat/completions", data=body,
                                  headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(http, timeout=600) as response:
        return json.load(response)["choices"][0]["message"]["content"]


def solve(row: dict, base_url: str, max_calls: int = 3, tool_cost: float = 0.0) -> float:
    """One episode: the reward of the final answer, less the calculator calls' cost."""
    from rlx.tools import calculator

    messages = [{"role": "user", "content": row["prompt"]}]
    cost = 0.0
    for _ in range(max_calls):
        reply = chat(base_url, messages, stop=["</calc>"])
        call = CALL.search(reply)
        if call is None:
            return exact_match(reply, str(row["label"])) - cost
        cost += float(tool_cost)
        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": f"<result>{calculator(call.group(1))}</result>"}]
    return -cost  # no answer within max_calls
