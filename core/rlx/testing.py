"""Shared pieces for the tests of rlx and of its plugins; import them into a test module.

``from rlx.testing import QUIET, one_thread`` gives a module one intra-op torch thread
(autouse) and the settings that keep test runs silent. Importing this module points
``RLX_CACHE`` at a fresh temporary folder unless it is set, so built-in models made by
tests never land in ``~/.cache``. ``train`` runs an algorithm as ``rlx train`` would and
returns its metrics; ``greedy_accuracy`` measures a model on the demo task.
"""

import json
import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("RLX_CACHE", tempfile.mkdtemp(prefix="rlx-test-cache-"))

QUIET = {"logging.progress": False, "logging.tensorboard": False}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: the tiny models gain nothing from a second one, and two
    threads on two cores slow down many times over whenever anything else runs."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def train(algo: str, out: Path, settings: dict | None = None, *, resume: bool = False, host=None) -> list[dict]:
    """Run ``algo`` into ``out`` with dotted ``settings`` (``{"training.max_steps": 2}``) over
    its defaults, quietly, in this process; the rows of its metrics.jsonl. ``host`` is the
    plugin host to look the algorithm up in (the installed plugins' by default)."""
    from rlx.config import resolve, set_dotted
    from rlx.plugins import get_host
    from rlx.run import run

    host = host or get_host()
    tree: dict = {"output": str(out)}
    for key, value in {**QUIET, **(settings or {})}.items():
        set_dotted(tree, key, value)
    run(resolve(host.algorithms.get(algo), tree), host, resume=resume)
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def greedy_accuracy(model_path: str, n: int = 128, ignore: str = "") -> float:
    """Greedy exact-match accuracy on ``n`` held-out ``arithmetic_small`` prompts.

    ``ignore`` is removed from each response first: with ``ignore=HEDGE`` it counts
    the right number whether or not the demo policy hedges it.
    """
    import torch

    from rlx import data, models
    from rlx.config import DataConfig, ModelConfig
    from rlx.rollout import NativeEngine, SamplingParams
    from rlx.tasks import TASKS, exact_match, prompt_rows
    from rlx.tiny import builtin_model

    path = builtin_model(model_path) if model_path.startswith("builtin:") else model_path
    tokenizer = models.load_tokenizer(path)
    model = models.load_causal_lm(ModelConfig(path=path), torch.device("cpu"), trainable=False)
    rows = prompt_rows(TASKS["arithmetic_small"], n, split="test")
    cfg = DataConfig(chat_template="none")
    prompts = [data.encode_prompt(r, tokenizer, cfg)["prompt_ids"] for r in rows]
    outs = NativeEngine(model, tokenizer).generate(prompts, SamplingParams(greedy=True, max_new_tokens=8))
    texts = [o.text.replace(ignore, "") if ignore else o.text for o in outs]
    return sum(exact_match(t, r["label"]) for t, r in zip(texts, rows)) / n
