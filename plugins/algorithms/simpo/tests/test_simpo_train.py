"""SimPO end to end: the demo settings teach the demo policy to stop hedging; CPO-SimPO and label smoothing run."""

from __future__ import annotations

import math

import pytest

from rlx.testing import greedy_accuracy, one_thread, train  # noqa: F401


def test_defaults_learn_the_preference(tmp_path):
    # the demo policy prefers the hedged "17?" to "17", so it starts ranking half the
    # pairs wrongly; `rlx train --algo simpo` (40 steps) must fix that
    rows = train("simpo", tmp_path / "run", {"data.eval_size": 128, "training.eval_every": 20})
    assert not (tmp_path / "run" / "reference_logps.pt").exists()
    assert rows[0]["accuracy"] < 0.7
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    assert len(evals) == 2 and evals[-1] >= 0.9, evals
    assert greedy_accuracy("builtin:tiny-arithmetic") == 0.0
    # over 11 seeds (benchmarks/learning_seeds.py): greedy 0.92 to 1.0, held-out accuracy 1.0
    assert greedy_accuracy(str(tmp_path / "run" / "final")) >= 0.8


def _short_run(out, algo, **settings):
    short = {"data.builtin_size": 64, "data.eval_size": 8, "training.batch_size": 8, "training.micro_batch_size": 8,
             "training.max_steps": 2, "checkpoint.save_final": False}
    return train(algo, out, {**short, **settings})


def test_cpo_simpo_and_label_smoothing_run(tmp_path):
    plain = _short_run(tmp_path / "simpo", "simpo")
    smoothed = _short_run(tmp_path / "smoothed", "simpo", **{"algorithm.label_smoothing": 0.1})
    cpo = _short_run(tmp_path / "cpo", "cpo_simpo")
    for rows in (plain, smoothed, cpo):
        assert len(rows) == 2 and all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    assert smoothed[0]["loss"] != plain[0]["loss"]
    # the same first step: CPO-SimPO adds α·NLL (α = 1) to SimPO's loss
    assert cpo[0]["loss"] == pytest.approx(plain[0]["loss"] + cpo[0]["nll"], abs=1e-5)
    assert not (tmp_path / "cpo" / "reference_logps.pt").exists()
