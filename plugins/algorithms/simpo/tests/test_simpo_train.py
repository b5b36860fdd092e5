"""SimPO end to end: a short run on the demo policy moves the margin the right way."""

from __future__ import annotations

import json


from rlx.config import resolve, set_dotted
from rlx.plugins import get_host
from rlx.run import run
from rlx.testing import one_thread  # noqa: F401


def test_short_run_raises_the_margin(tmp_path):
    # the demo policy already ranks these pairs well (eval accuracy ~0.95, margin ~9), so
    # held-out numbers barely move in a few steps; the direction shows on one repeated
    # batch (32 rows = one step's batch), where the loss must fall and the margin grow
    tree: dict = {"output": str(tmp_path / "run")}
    for key, value in {"logging.progress": False, "logging.tensorboard": False, "data.builtin_size": 32,
                       "data.eval_size": 32, "training.max_steps": 6, "training.lr": 2e-5,
                       "checkpoint.save_final": False}.items():
        set_dotted(tree, key, value)
    host = get_host()
    run(resolve(host.algorithms.get("simpo"), tree), host)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert not (tmp_path / "run" / "reference_logps.pt").exists()
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert rows[-1]["reward/margin"] > rows[0]["reward/margin"]
    assert rows[-1]["eval/accuracy"] >= 0.8
