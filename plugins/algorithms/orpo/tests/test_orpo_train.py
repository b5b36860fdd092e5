"""ORPO end to end: a short run on the demo policy moves the margin the right way."""

from __future__ import annotations

import json


from rlx.config import resolve, set_dotted
from rlx.plugins import get_host
from rlx.run import run
from rlx.testing import one_thread  # noqa: F401


def test_short_run_raises_the_margin(tmp_path):
    tree: dict = {"output": str(tmp_path / "run")}
    for key, value in {"logging.progress": False, "logging.tensorboard": False, "data.builtin_size": 256,
                       "data.eval_size": 32, "training.max_steps": 15, "training.eval_every": 5,
                       "checkpoint.save_final": False}.items():
        set_dotted(tree, key, value)
    host = get_host()
    run(resolve(host.algorithms.get("orpo"), tree), host)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert not (tmp_path / "run" / "reference_logps.pt").exists()
    evals = [r for r in rows if "eval/loss" in r]
    assert len(evals) == 3
    assert evals[-1]["eval/loss"] < evals[0]["eval/loss"]
    assert evals[-1]["eval/nll"] < evals[0]["eval/nll"]
    assert 0 <= evals[-1]["eval/accuracy"] <= 1
