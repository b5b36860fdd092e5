"""The online loop's reward pipeline: sources, weights, scores, metrics and loud errors."""

import math

import pytest

from rlx.config import RewardConfig
from rlx.plugins import build_host
from rlx.rewards import RewardError, build_reward

# Registered through a local plugin, so these tests need no reward plugin installed.
PLUGIN = '''
from rlx import hookimpl

def chars(prompts, completions, labels, **columns):
    return [len(c) for c in completions]

def graded(prompts, completions, labels, **columns):
    right = [float(c == l) for c, l in zip(completions, labels)]
    return {"rewards": [2 * r - 1 for r in right], "scores": right, "right": right, "batch": 7}

def uses_column(prompts, completions, labels, bonus, **columns):
    return bonus

def raises_on_b(prompts, completions, labels, **columns):
    if "b" in completions:
        raise ValueError("cannot score b")
    return [0.0] * len(completions)

def short(prompts, completions, labels, **columns):
    return [1.0] * (len(completions) - 1)

def nan_at_1(prompts, completions, labels, **columns):
    return [0.0, math.nan, 0.0][:len(completions)]

def inf_at_2(prompts, completions, labels, **columns):
    return {"rewards": [0.0, 0.0, math.inf][:len(completions)]}

def text_at_0(prompts, completions, labels, **columns):
    return ["1.0", 0.0, 0.0][:len(completions)]

def nan_metric(prompts, completions, labels, **columns):
    return {"rewards": [0.0] * len(completions), "kl": [0.0, 0.0, math.nan]}

@hookimpl
def register_reward_functions(register):
    for fn in (chars, graded, uses_column, raises_on_b, short, nan_at_1, inf_at_2, text_at_0, nan_metric):
        register(fn.__name__, fn)
'''

PROMPTS = ["p0", "p1", "p2"]
COMPLETIONS = ["a", "b", "cc"]
LABELS = ["a", "x", "cc"]


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugin") / "reward_plugin.py"
    path.write_text("import math\n" + PLUGIN)
    return build_host([str(path)])


def score(host, functions, weights=(), columns=None):
    pipeline = build_reward(RewardConfig(functions=list(functions), weights=list(weights)), host)
    return pipeline(PROMPTS, COMPLETIONS, LABELS, columns or {})


def test_weighted_sum_and_per_source_means(host):
    result = score(host, ["chars", "graded"], weights=[0.5, 2.0])
    assert result.rewards == [0.5 * 1 + 2 * 1, 0.5 * 1 - 2, 0.5 * 2 + 2]
    assert result.metrics["reward/chars"] == pytest.approx(4 / 3)
    assert result.metrics["reward/graded"] == pytest.approx(1 / 3)


def test_scores_come_from_the_functions_that_give_them(host):
    assert score(host, ["chars"]).scores == [1.0, 1.0, 2.0]  # none given: the rewards
    assert score(host, ["chars", "graded"]).scores == [1.0, 0.0, 1.0]


def test_extra_metrics_are_averaged(host):
    metrics = score(host, ["graded"]).metrics
    assert metrics["reward/graded/right"] == pytest.approx(2 / 3)
    assert metrics["reward/graded/batch"] == 7


def test_columns_reach_the_functions(host):
    assert score(host, ["uses_column"], columns={"bonus": [1, 2, 3]}).rewards == [1, 2, 3]


def test_a_users_file_function(host, tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text("def brevity(prompts, completions, labels, **columns):\n"
                    "    return [-len(c) / 10 for c in completions]\n")
    result = score(host, ["graded", f"{path}:brevity"], weights=[1, 10])
    assert result.rewards == pytest.approx([1 - 1, -1 - 1, 1 - 2])
    assert result.metrics["reward/my_rewards.py:brevity"] == pytest.approx(-4 / 30)


def test_first_party_default_builds():
    result = build_reward(RewardConfig(), build_host())(["1+1="], ["2\n"], ["2"], {})
    assert result.rewards == [1.0] and result.metrics == {"reward/exact_match": 1.0}


def test_empty_batch(host):
    assert build_reward(RewardConfig(functions=["chars"]), host)([], [], [], {}).rewards == []


@pytest.mark.parametrize("name, index, text", [
    ("raises_on_b", 1, ": cannot score b"),
    ("short", 2, "returned 2 rewards for 3 samples"),
    ("nan_at_1", 1, "nan"),
    ("inf_at_2", 2, "inf"),
    ("text_at_0", 0, "not a number"),
    ("nan_metric", 2, "kl nan"),
])
def test_bad_values_name_the_function_and_sample(host, name, index, text):
    with pytest.raises(RewardError) as err:
        score(host, ["chars", name])
    message = str(err.value)
    assert f"reward function {name!r}" in message and text in message
    assert f"sample {index} (prompt 'p{index}', completion {COMPLETIONS[index]!r})" in message


def test_a_raising_function_chains_the_original_error(host):
    with pytest.raises(RewardError) as err:
        score(host, ["raises_on_b"])
    assert isinstance(err.value.__cause__, ValueError)


def test_long_samples_are_shortened_in_errors(host):
    pipeline = build_reward(RewardConfig(functions=["nan_at_1"]), host)
    with pytest.raises(RewardError) as err:
        pipeline(["q" * 1000] * 3, ["c" * 1000] * 3, [None] * 3, {})
    assert "sample 1" in str(err.value) and len(str(err.value)) < 400


def test_a_file_function_is_named_by_its_spec(host, tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("def fn(prompts, completions, labels):\n    return [float('nan')] * len(completions)\n")
    with pytest.raises(RewardError, match=rf"reward function '{path}:fn' returned rewards nan for sample 0"):
        score(host, [f"{path}:fn"])


def test_unknown_name_suggests_the_nearest(host):
    with pytest.raises(RewardError, match="reward.functions: unknown reward function 'charz'. Did you mean 'chars'"):
        build_reward(RewardConfig(functions=["charz"]), host)


def test_missing_file_and_unknown_model_type(host, tmp_path):
    with pytest.raises(RewardError, match="does not exist"):
        build_reward(RewardConfig(functions=[f"{tmp_path}/none.py:fn"]), host)
    with pytest.raises(RewardError, match="reward.model_type: unknown reward model 'nope'"):
        build_reward(RewardConfig(functions=[], model="some/folder", model_type="nope"), host)


def test_weight_count_must_match_the_sources(host):
    with pytest.raises(RewardError, match="reward.weights has 3 values but there are 2 reward sources"):
        build_reward(RewardConfig(functions=["chars", "graded"], weights=[1, 2, 3]), host)
    with pytest.raises(RewardError, match="weight"):
        build_reward(RewardConfig(functions=["chars"], weights=[math.nan]), host)


def test_no_source_and_repeated_sources_fail(host):
    with pytest.raises(RewardError, match="no reward"):
        build_reward(RewardConfig(functions=[]), host)
    with pytest.raises(RewardError, match="repeated: chars"):
        build_reward(RewardConfig(functions=["chars", "chars"]), host)


def test_inputs_of_different_lengths_fail(host):
    pipeline = build_reward(RewardConfig(functions=["chars"]), host)
    with pytest.raises(RewardError, match="labels 2"):
        pipeline(PROMPTS, COMPLETIONS, LABELS[:2], {})
    assert math.isfinite(pipeline(PROMPTS, COMPLETIONS, LABELS, {}).rewards[0])
