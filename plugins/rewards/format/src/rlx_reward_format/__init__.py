r"""Format and length rewards.

``format``: 1.0 when the whole completion (surrounding whitespace ignored) matches
``PATTERN``, else 0.0. The default is the reasoning format of R1-style training,
``<think>...</think>`` then ``<answer>...</answer>``, each block holding no further
tag of its kind. A dataset can ask for another format per row with a
``format_pattern`` column holding a regular expression (matched the same way).

``length``: 0.0 up to a target length, then −(chars − target) / target, down to −1.0
at twice the target and beyond. The target is in characters of the completion: a
row's ``length_target`` column, or ``TARGET_CHARS`` when the row has none. The online
loop's token-level overlong shaping is separate from this reward.
"""

from __future__ import annotations

import re

from rlx import hookimpl

PATTERN = r"<think>(?:(?!</?think>).)*</think>\s*<answer>(?:(?!</?answer>).)*</answer>"
TARGET_CHARS = 1024


def format_reward(prompts, completions, labels, format_pattern=None, **columns):
    """1.0 per completion that matches its row's pattern (``PATTERN`` when none), else 0.0."""
    patterns = format_pattern or [PATTERN] * len(completions)
    return [1.0 if re.fullmatch(p or PATTERN, c.strip(), re.DOTALL) else 0.0
            for p, c in zip(patterns, completions)]


def length_reward(prompts, completions, labels, length_target=None, **columns):
    """0.0 up to the row's target length in characters, then a linear penalty down to -1.0."""
    targets = length_target or [TARGET_CHARS] * len(completions)
    rewards = []
    for target, completion in zip(targets, completions):
        target = TARGET_CHARS if target is None else target  # a row without a target of its own
        if target <= 0:
            raise ValueError(f"length_target must be a positive number of characters, got {target!r}")
        rewards.append(-min(max(len(completion) - target, 0) / target, 1.0))
    return rewards


@hookimpl
def register_reward_functions(register):
    register("format", format_reward)
    register("length", length_reward)
