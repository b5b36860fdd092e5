from rlx.plugins import build_host
from rlx.tasks import TASKS, prompt_rows
from rlx_reward_match import exact_match


def test_registered_by_its_distribution():
    host = build_host()
    assert host.get("register_reward_functions", "exact_match") is exact_match
    assert host.registry("register_reward_functions").providers["exact_match"] == "rlx-reward-match"


def test_answer_is_the_first_line_stripped():
    completions = ["68", " 68 \nmore text", "68<|endoftext|>", "6 8", "68 is it", "", "69"]
    assert exact_match([""] * 7, completions, ["68"] * 7) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_labels_that_are_not_strings():
    assert exact_match(["", ""], ["7", "7.0"], [7, 7]) == [1.0, 0.0]


def test_agrees_with_every_builtin_task():
    for task in TASKS.values():
        rows = prompt_rows(task, 5)
        completions = [r["label"] + "\n" for r in rows[:3]] + ["x", rows[4]["label"] + "?"]
        expected = [task.score(c, r["label"]) for c, r in zip(completions, rows)]
        assert exact_match([r["prompt"] for r in rows], completions, [r["label"] for r in rows]) == expected
