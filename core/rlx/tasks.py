"""Built-in synthetic tasks with exact answers, used as ``data.path: builtin:NAME``.

Each task makes short prompts whose answers are a few tokens, so a tiny model trained
on CPU can learn them and a rule reward can score them exactly. Rows are generated
deterministically from a seed. Every prompt belongs to exactly one split ("train" or
"test"), decided by a hash of the prompt text, so evaluation rows never repeat a
training prompt whatever the seeds.

Only the standard library is imported here: ``import rlx`` stays cheap.
"""

from __future__ import annotations

import random
import string
import zlib
from dataclasses import dataclass
from typing import Callable

from rlx.hookspecs import hookimpl

SPLITS = ("train", "test")
TEST_FRACTION = 0.1  # share of all possible prompts that belong to the test split

# Text at which a completion's answer ends: a new line, or a leftover special token
# such as "<|endoftext|>" when a completion is decoded without skipping them.
_ANSWER_ENDS = ("\n", "<|")


def exact_match(completion: str, answer: str) -> float:
    """1.0 when the completion's answer equals ``answer``, else 0.0.

    The answer part of a completion is its text up to the first new line or the
    first ``<|`` (the start of a special token such as ``<|endoftext|>`` or
    ``<|im_end|>``), with surrounding whitespace removed. Anything after that is
    ignored; anything else before it makes the answer wrong.
    """
    text = completion
    for end in _ANSWER_ENDS:
        text = text.split(end, 1)[0]
    return 1.0 if text.strip() == answer.strip() else 0.0


@dataclass(frozen=True)
class Task:
    """A synthetic task.

    ``make(rng)`` returns ``{"prompt": str, "answer": str}``; ``wrong(rng, example)``
    returns a plausible answer that differs from the right one (used for rejected
    and undesirable completions); ``score(completion, answer)`` is the exact reward.
    """

    name: str
    description: str
    make: Callable[[random.Random], dict]
    wrong: Callable[[random.Random, dict], str]
    score: Callable[[str, str], float] = exact_match


def in_split(prompt: str, split: str) -> bool:
    """Whether ``prompt`` belongs to ``split``: a fixed hash partition of all prompts."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; builtin tasks have {', '.join(SPLITS)}")
    is_test = zlib.crc32(prompt.encode()) % 1000 < TEST_FRACTION * 1000
    return is_test == (split == "test")


# ---------------------------------------------------------------------------
# the tasks


def _make_arithmetic(rng: random.Random, top: int = 99) -> dict:
    a, b = rng.randint(0, top), rng.randint(0, top)
    if rng.random() < 0.5:
        return {"prompt": f"{a}+{b}=", "answer": str(a + b)}
    a, b = max(a, b), min(a, b)  # keep answers non-negative: fewer tokens to learn
    return {"prompt": f"{a}-{b}=", "answer": str(a - b)}


HEDGE = "?"  # the demo policy's habit ("17?"), which exact match counts as wrong


def _wrong_number(rng: random.Random, example: dict) -> str:
    # half the wrong answers are the right number hedged: a habit to unlearn, as in
    # sloppy human data; the others a near miss
    if rng.random() < 0.5:
        return example["answer"] + HEDGE
    right = int(example["answer"])
    delta = rng.choice([-10, -2, -1, 1, 2, 10])
    wrong = right + delta if right + delta >= 0 else right - delta
    return str(wrong)


def _make_copy(rng: random.Random) -> dict:
    text = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 6)))
    return {"prompt": f"copy {text}=", "answer": text}


def _wrong_copy(rng: random.Random, example: dict) -> str:
    text = example["answer"]
    i = rng.randrange(len(text))
    if rng.random() < 0.5:
        return text[:i] + text[i + 1:]  # a dropped letter
    other = rng.choice([c for c in string.ascii_lowercase if c != text[i]])
    return text[:i] + other + text[i + 1:]  # a changed letter


_COUNT_LETTERS = "abc"  # few letters, so every count from 0 up appears often


def _make_count(rng: random.Random) -> dict:
    text = "".join(rng.choices(_COUNT_LETTERS, k=rng.randint(4, 8)))
    letter = rng.choice(_COUNT_LETTERS)
    return {"prompt": f"count {letter} in {text}=", "answer": str(text.count(letter))}


def _wrong_count(rng: random.Random, example: dict) -> str:
    right = int(example["answer"])
    return str(rng.choice([c for c in (right - 1, right + 1, right + 2) if c >= 0]))


ARITHMETIC = Task(
    "arithmetic",
    "add or subtract two numbers from 0 to 99: '23+45=' -> '68'",
    _make_arithmetic,
    _wrong_number,
)
ARITHMETIC_SMALL = Task(
    "arithmetic_small",
    "add or subtract two numbers from 0 to 19: '12+5=' -> '17'",
    lambda rng: _make_arithmetic(rng, top=19),
    _wrong_number,
)
COPY = Task(
    "copy",
    "copy a short lowercase string: 'copy abcd=' -> 'abcd'",
    _make_copy,
    _wrong_copy,
)
COUNT = Task(
    "count",
    "count a letter in a short string: 'count a in abca=' -> '2'",
    _make_count,
    _wrong_count,
)
TASKS = {task.name: task for task in (ARITHMETIC, ARITHMETIC_SMALL, COPY, COUNT)}


@hookimpl
def register_tasks(register):
    for name, task in TASKS.items():
        register(name, task)


# ---------------------------------------------------------------------------
# row generators


def _rng(task: Task, seed: int, split: str) -> random.Random:
    # Seeded by (task, split, seed): train and test rows come from different streams
    # as well as from disjoint prompts.
    return random.Random(f"{task.name}:{split}:{seed}")


def draw(task: Task, rng: random.Random, split: str) -> dict:
    """The next example of ``split`` from ``rng`` (examples of the other split are skipped)."""
    for _ in range(10_000):
        example = task.make(rng)
        if in_split(example["prompt"], split):
            return example
    raise RuntimeError(f"task {task.name!r} made no prompt of split {split!r} in 10000 tries")


def sft_rows(task: Task, n: int, seed: int = 0, split: str = "train") -> list[dict]:
    """Rows ``{"prompt", "response", "label"}`` with the right answer as response."""
    rng = _rng(task, seed, split)
    rows = []
    for _ in range(n):
        ex = draw(task, rng, split)
        rows.append({"prompt": ex["prompt"], "response": ex["answer"], "label": ex["answer"]})
    return rows


def pair_rows(task: Task, n: int, seed: int = 0, split: str = "train") -> list[dict]:
    """Rows ``{"prompt", "chosen", "rejected", "label"}``: chosen right, rejected wrong."""
    rng = _rng(task, seed, split)
    rows = []
    for _ in range(n):
        ex = draw(task, rng, split)
        rows.append({"prompt": ex["prompt"], "chosen": ex["answer"], "rejected": task.wrong(rng, ex),
                     "label": ex["answer"]})
    return rows


def unpaired_rows(task: Task, n: int, seed: int = 0, split: str = "train") -> list[dict]:
    """Rows ``{"prompt", "completion", "desirable", "label"}``, about half desirable."""
    rng = _rng(task, seed, split)
    rows = []
    for _ in range(n):
        ex = draw(task, rng, split)
        desirable = rng.random() < 0.5
        completion = ex["answer"] if desirable else task.wrong(rng, ex)
        rows.append({"prompt": ex["prompt"], "completion": completion, "desirable": desirable, "label": ex["answer"]})
    return rows


def prompt_rows(task: Task, n: int, seed: int = 0, split: str = "train") -> list[dict]:
    """Rows ``{"prompt", "label"}`` for online RL and evaluation."""
    rng = _rng(task, seed, split)
    rows = []
    for _ in range(n):
        ex = draw(task, rng, split)
        rows.append({"prompt": ex["prompt"], "label": ex["answer"]})
    return rows


ROW_GENERATORS = {"sft": sft_rows, "pairs": pair_rows, "unpaired": unpaired_rows, "prompts": prompt_rows}


def corpus(n: int = 200) -> list[str]:
    """Lines of text covering every task's vocabulary, to train a tokenizer on.

    ``n`` examples of each task (prompt, answer and a wrong answer) plus every
    letter, digit and the words of a chat template.
    """
    lines = [string.ascii_lowercase, string.digits, string.ascii_uppercase, string.punctuation]
    lines += ["system\nuser\nassistant\n", "You are a helpful assistant."]
    for task in TASKS.values():
        rng = random.Random(f"corpus:{task.name}")
        for _ in range(n):
            ex = task.make(rng)
            lines += [ex["prompt"] + ex["answer"], ex["prompt"] + task.wrong(rng, ex)]
    return lines
