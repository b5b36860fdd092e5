import pytest

from rlx.plugins import build_host
from rlx_reward_format import TARGET_CHARS, format_reward, length_reward


def test_registered_by_its_distribution():
    host = build_host()
    providers = host.registry("register_reward_functions").providers
    assert providers["format"] == providers["length"] == "rlx-reward-format"
    assert host.get("register_reward_functions", "length") is length_reward


def test_format_accepts_only_think_then_answer():
    completions = [
        "<think>2+2 is\n4</think>\n<answer>4</answer>\n",
        "<think>a</think><answer>b</answer>",
        "<answer>4</answer>",
        "<think>a</think>",
        "<think>a</think> <answer>4</answer> trailing text",
        "<think>a</think><answer>4</answer><answer>5</answer>",
        "<think>a<think>b</think><answer>4</answer>",
    ]
    assert format_reward([""] * 7, completions, [None] * 7) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_format_pattern_column_overrides_per_row():
    out = format_reward(["", ""], ["Answer: 4", "Answer: 4"], [None, None], format_pattern=[r"Answer: \d+", ""])
    assert out == [1.0, 0.0]  # an empty pattern means the default


def test_length_penalises_only_beyond_the_target():
    target = TARGET_CHARS
    completions = ["x" * n for n in (0, target, target + target // 4, 2 * target, 5 * target)]
    assert length_reward([""] * 5, completions, [None] * 5) == [0.0, 0.0, -0.25, -1.0, -1.0]


def test_length_target_column():
    assert length_reward([""] * 3, ["x" * 15] * 3, [None] * 3, length_target=[10, 30, None]) == [-0.5, 0.0, 0.0]
    with pytest.raises(ValueError, match="length_target"):
        length_reward([""], ["x"], [None], length_target=[0])
