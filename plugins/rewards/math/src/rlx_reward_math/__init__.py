r"""``math_answer``: 1.0 when a completion's final answer equals the label, else 0.0.

The final answer is the content of the completion's last ``\boxed{...}`` (nested
braces allowed), or, without a complete one, its last number. It is right when:

1. both it and the label read as numbers and are equal exactly: integers, decimals,
   fractions (``3/4``, ``\frac{3}{4}``), thousands separators (``1,000``), with ``$``,
   ``%`` and LaTeX spacing ignored; so ``0.75`` matches ``3/4``;
2. otherwise, the two are the same text once spaces and ``$`` are removed;
3. otherwise, ``math_verify`` (``pip install rlx-reward-math[symbolic]``) finds them
   equal symbolically (``\sqrt{2}`` and ``2^{1/2}``); without it such answers score 0.

Returns ``rewards`` and the same values as ``scores`` (correctness stays what dynamic
filtering sees when other rewards are added), plus ``extracted``: the fraction of
completions in which an answer was found, which separates "wrong" from "no answer".
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction

from rlx import hookimpl

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
# a number, with an optional sign that is not a binary minus ("5-3"), strict thousands
# groups ("1,000" but not "1,2"), a decimal part or a denominator
_NUMBER = re.compile(r"(?:(?<![\w)])-)?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:/\d+)?|(?<![\w)])-?\.\d+")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_LATEX_FRAC = re.compile(r"(-?)\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}")
_IGNORED = ("\\$", "$", "\\%", "%", "\\!", "\\,", "\\;", " ")
_SYMBOLIC_TIMEOUT_S = 5


def last_box(text: str) -> str | None:
    """The content of the last ``\\boxed{...}``; ``None`` when there is none or it is unclosed."""
    boxes = list(_BOXED.finditer(text))
    if not boxes:
        return None
    start, depth = boxes[-1].end(), 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i].strip()
    return None  # cut off inside the box


def final_answer(completion: str) -> str | None:
    """The last box's content, else the last number, else ``None``."""
    numbers = _NUMBER.findall(completion)
    return last_box(completion) or (numbers[-1] if numbers else None)


def as_number(text: str) -> Fraction | None:
    """``text`` as an exact number, or ``None`` when it is not a plain number."""
    for token in _IGNORED:
        text = text.replace(token, "")
    text = text.removesuffix(".")
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    frac = _LATEX_FRAC.fullmatch(text)
    if frac:
        text = f"{frac[1]}{frac[2]}/{frac[3]}"
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def is_correct(answer: str, label: str) -> bool:
    """Whether ``answer`` equals ``label``: numerically, textually, then symbolically."""
    a, b = as_number(answer), as_number(label)
    if a is not None and b is not None:
        return a == b
    if answer.replace(" ", "").strip("$") == label.replace(" ", "").strip("$"):
        return True
    return _symbolically_equal(answer.strip("$"), label.strip("$"))


def _symbolically_equal(answer: str, label: str) -> bool:
    try:
        from math_verify import parse, verify
    except ImportError:
        return False
    # math_verify times out through SIGALRM, which only the main thread may use
    timeout = _SYMBOLIC_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"${label}$", parsing_timeout=timeout)
    pred = parse(f"${answer}$", parsing_timeout=timeout)
    return bool(gold and pred and verify(gold, pred, timeout_seconds=timeout))


def math_answer(prompts, completions, labels, **columns):
    """``{"rewards", "scores", "extracted"}``: correctness of each final answer (module docstring)."""
    rewards, extracted = [], []
    for completion, label in zip(completions, labels):
        if label is None:
            raise ValueError("math_answer needs a label for every sample (data.label_key)")
        answer = final_answer(completion)
        label = last_box(str(label)) or str(label).strip()
        rewards.append(1.0 if answer is not None and is_correct(answer, label) else 0.0)
        extracted.append(0.0 if answer is None else 1.0)
    return {"rewards": rewards, "scores": list(rewards), "extracted": extracted}


@hookimpl
def register_reward_functions(register):
    register("math_answer", math_answer)
