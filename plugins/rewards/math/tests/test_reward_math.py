import pytest

from rlx.plugins import build_host
from rlx_reward_math import final_answer, math_answer

def score(completion, label):
    return math_answer(["q"], [completion], [label])["rewards"][0]


def test_registered_by_its_distribution():
    host = build_host()
    assert host.get("register_reward_functions", "math_answer") is math_answer
    assert host.registry("register_reward_functions").providers["math_answer"] == "rlx-reward-math"


@pytest.mark.parametrize("completion, answer", [
    (r"so the answer is \boxed{42}.", "42"),
    (r"\boxed{\frac{a}{b^{2}}} and later 7", r"\frac{a}{b^{2}}"),
    (r"first \boxed{1}, finally \boxed{2}", "2"),
    ("we get 5-3 = 2, then -7", "-7"),
    ("total: 1,234.5 dollars", "1,234.5"),
    ("a list 1,2,3", "3"),
    ("half is 3/4 of it", "3/4"),
    (r"cut off \boxed{4", "4"),
    ("no answer here", None),
])
def test_final_answer(completion, answer):
    assert final_answer(completion) == answer


@pytest.mark.parametrize("completion, label, right", [
    (r"\boxed{0.75}", "3/4", 1.0),
    (r"\boxed{\frac{3}{4}}", "0.75", 1.0),
    ("It costs $1,000.", 1000, 1.0),
    ("so 12.50", "12.5", 1.0),
    (r"\boxed{50\%}", "50", 1.0),
    ("answer 7", r"\boxed{7}", 1.0),
    ("answer 7", "8", 0.0),
    ("answer 1,000", "100", 0.0),
    (r"\boxed{x+1}", "x + 1", 1.0),
    ("nothing", "3", 0.0),
])
def test_numeric_and_textual_comparison(completion, label, right):
    assert score(completion, label) == right


def test_symbolic_answers_through_math_verify():
    assert score(r"\boxed{\sqrt{2}}", "2^{1/2}") == 1.0
    assert score(r"\boxed{\frac{\pi}{2}}", r"\pi/2") == 1.0
    assert score(r"\boxed{\sqrt{3}}", r"\sqrt{2}") == 0.0


def test_returns_scores_and_extracted():
    out = math_answer(["a", "b", "c"], [r"\boxed{2}", "3", "none"], ["2", "2", "2"])
    assert out == {"rewards": [1.0, 0.0, 0.0], "scores": [1.0, 0.0, 0.0], "extracted": [1.0, 1.0, 0.0]}


def test_missing_label_is_an_error():
    with pytest.raises(ValueError, match="label"):
        math_answer(["a"], ["1"], [None])
