"""Built-in synthetic tasks: exact answers, deterministic rows, disjoint splits."""

import random
import subprocess
import sys

import pytest

from rlx import tasks
from rlx.plugins import build_host
from rlx.tasks import ARITHMETIC, ARITHMETIC_SMALL, COPY, COUNT, HEDGE, TASKS, exact_match, pair_rows, prompt_rows, sft_rows, unpaired_rows

ALL = list(TASKS.values())


def _solve(prompt: str) -> str:
    """An independent solver of the three tasks, to check their answers."""
    body = prompt.removesuffix("=")
    if body.startswith("copy "):
        return body.removeprefix("copy ")
    if body.startswith("count "):
        letter, text = body.removeprefix("count ").split(" in ")
        return str(text.count(letter))
    op = "+" if "+" in body else "-"
    a, b = body.split(op)
    return str(int(a) + int(b) if op == "+" else int(a) - int(b))


@pytest.mark.parametrize("task", ALL, ids=lambda t: t.name)
def test_answers_are_right_and_short(task):
    for row in sft_rows(task, 300):
        assert row["response"] == row["label"] == _solve(row["prompt"])
        assert len(row["prompt"]) <= 20 and 1 <= len(row["response"]) <= 6


def test_arithmetic_covers_both_operations_and_range():
    prompts = [r["prompt"] for r in prompt_rows(ARITHMETIC, 500)]
    assert any("+" in p for p in prompts) and any("-" in p for p in prompts)
    answers = [int(_solve(p)) for p in prompts]
    assert min(answers) >= 0 and max(answers) <= 198


@pytest.mark.parametrize("make", [sft_rows, pair_rows, unpaired_rows, prompt_rows], ids=lambda f: f.__name__)
@pytest.mark.parametrize("task", ALL, ids=lambda t: t.name)
def test_rows_are_deterministic_per_seed(task, make):
    assert make(task, 50, seed=3) == make(task, 50, seed=3)
    assert make(task, 50, seed=3) != make(task, 50, seed=4)
    assert make(task, 50, seed=3, split="train") != make(task, 50, seed=3, split="test")


@pytest.mark.parametrize("task", ALL, ids=lambda t: t.name)
def test_test_prompts_never_appear_in_training(task):
    train = {r["prompt"] for seed in range(3) for r in prompt_rows(task, 2000, seed=seed)}
    test = {r["prompt"] for r in prompt_rows(task, 300, split="test")}
    assert len(test) > 50  # the test split is not degenerate
    assert not train & test


def test_unknown_split_is_refused():
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        prompt_rows(ARITHMETIC, 1, split="dev")


@pytest.mark.parametrize("task", ALL, ids=lambda t: t.name)
def test_pairs_reject_a_plausible_wrong_answer(task):
    rows = pair_rows(task, 500)
    for row in rows:
        assert row["chosen"] == row["label"] == _solve(row["prompt"])
        assert row["rejected"] != row["chosen"] and row["rejected"].strip()
        assert task.score(row["rejected"], row["label"]) == 0.0
    if task is COPY:
        return
    # numbers: close to the right one; for arithmetic, half are the right one hedged ("17?")
    hedged = [r for r in rows if r["rejected"] == r["chosen"] + HEDGE]
    near = [r for r in rows if r not in hedged]
    assert all(abs(int(r["rejected"]) - int(r["chosen"])) <= 10 and int(r["rejected"]) >= 0 for r in near)
    if task in (ARITHMETIC, ARITHMETIC_SMALL):
        assert 0.4 < len(hedged) / len(rows) < 0.6
    else:
        assert not hedged


@pytest.mark.parametrize("task", ALL, ids=lambda t: t.name)
def test_unpaired_rows_are_about_half_desirable(task):
    rows = unpaired_rows(task, 400)
    share = sum(r["desirable"] for r in rows) / len(rows)
    assert 0.4 < share < 0.6
    for row in rows:
        assert isinstance(row["desirable"], bool)
        assert (row["completion"] == row["label"]) == row["desirable"]


@pytest.mark.parametrize(
    "completion, score",
    [
        ("68", 1.0),
        (" 68 ", 1.0),
        ("68<|endoftext|>", 1.0),
        ("68<|im_end|>\n<|endoftext|>junk", 1.0),
        ("68\n23+45=68", 1.0),
        ("\n68", 0.0),  # the first line is empty
        ("6", 0.0),
        ("680", 0.0),
        ("68 and more", 0.0),
        ("", 0.0),
    ],
)
def test_exact_match_rule(completion, score):
    assert exact_match(completion, "68") == score
    assert ARITHMETIC.score(completion, "68") == score


def test_tasks_register_through_the_hook():
    host = build_host()
    registry = host.registry("register_tasks")
    assert registry.get("arithmetic") is ARITHMETIC
    assert registry.get("copy") is COPY and registry.get("count") is COUNT
    assert registry.providers["count"] == "rlx"


def test_corpus_covers_every_character_of_the_tasks():
    text = "\n".join(tasks.corpus())
    rows = [r for task in ALL for r in pair_rows(task, 200, split="test")]
    used = {c for r in rows for c in r["prompt"] + r["chosen"] + r["rejected"]}
    assert used <= set(text)
    assert {"system", "user", "assistant"} <= set(text.split())


def test_wrong_answers_use_the_generator_they_are_given():
    example = {"prompt": "copy abcd=", "answer": "abcd"}
    assert COPY.wrong(random.Random(1), example) == COPY.wrong(random.Random(1), example)
    assert COUNT.wrong(random.Random(0), {"prompt": "count a in bbbb=", "answer": "0"}) in {"1", "2"}


def test_importing_tasks_needs_no_torch():
    code = "import sys, rlx.tasks; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
