"""ORPO end to end: the demo settings teach the demo policy to stop hedging."""

from __future__ import annotations

from rlx.testing import greedy_accuracy, one_thread, train  # noqa: F401


def test_defaults_learn_the_preference(tmp_path):
    # the demo policy prefers the hedged "17?" to "17", so it starts ranking half the
    # pairs wrongly; `rlx train --algo orpo` (40 steps) must fix that
    rows = train("orpo", tmp_path / "run", {"data.eval_size": 128, "training.eval_every": 20})
    assert not (tmp_path / "run" / "reference_logps.pt").exists()
    assert rows[0]["accuracy"] < 0.7
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    assert len(evals) == 2 and evals[-1] >= 0.9, evals
    assert greedy_accuracy("builtin:tiny-arithmetic") == 0.0
    # over 11 seeds (benchmarks/learning_seeds.py): greedy 0.98 to 1.0, held-out accuracy 1.0; on another
    # machine of the CI kind greedy 0.90 (the demo policy's SFT rounds differently on another CPU)
    assert greedy_accuracy(str(tmp_path / "run" / "final")) >= 0.8
