"""``exact_match``: 1.0 when a completion's answer equals its label, else 0.0.

The rule is the built-in tasks' (``rlx.tasks.exact_match``): the answer is the
completion up to its first new line or special token (``<|...``), stripped, and must
equal ``str(label).strip()``. Rewards for ``builtin:`` data therefore agree exactly
with the tasks' own scoring.
"""

from rlx import hookimpl
from rlx.tasks import exact_match as _rule


def exact_match(prompts, completions, labels, **columns):
    """1.0 per completion whose answer is its label under the built-in tasks' rule, else 0.0."""
    rewards = []
    for completion, label in zip(completions, labels):
        if label is None:
            raise ValueError("exact_match needs a label for every sample (data.label_key)")
        rewards.append(_rule(completion, str(label)))
    return rewards


@hookimpl
def register_reward_functions(register):
    register("exact_match", exact_match)
