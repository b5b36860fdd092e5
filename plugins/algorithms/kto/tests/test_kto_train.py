"""KTO end to end on the demo policy and the step-size error.

Data: ``builtin:arithmetic_small`` unpaired rows, about half the right answer
(desirable) and half the hedged right answer or a near-miss number. The demo policy ``builtin:tiny-arithmetic`` gives
the right number but mostly hedges it ("17?"), which exact match counts as wrong.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rlx import testing
from rlx.run import RunError
from rlx.tasks import HEDGE
from rlx.testing import greedy_accuracy, one_thread  # noqa: F401


def train(out: Path, algo: str = "kto", **settings) -> list[dict]:
    return testing.train(algo, out, settings)


def test_defaults_learn_the_preference_and_keep_the_answers(tmp_path):
    # the demo settings as `rlx train --algo kto` runs them (β = 0.5, w_d = w_u = 1, lr 5e-5, 80 steps);
    # over 11 seeds (benchmarks/learning_seeds.py): held-out accuracy 0.72-0.82, greedy 0.81-0.98, and
    # the share of right numbers fell by 0.02-0.19
    rows = train(tmp_path / "run", **{"data.eval_size": 128, "training.eval_every": 40})
    assert rows[0]["accuracy"] == 0.5 and rows[0]["kl_ref_point"] == 0.0  # policy == reference: all ties
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    assert len(evals) == 2 and evals[-1] >= 0.65, evals
    assert rows[-1]["eval/reward/desirable"] > rows[-1]["eval/reward/undesirable"]
    final = str(tmp_path / "run" / "final")
    assert greedy_accuracy("builtin:tiny-arithmetic") == 0.0 and greedy_accuracy(final) >= 0.7
    # the numbers themselves stay right
    assert greedy_accuracy(final, ignore=HEDGE) >= greedy_accuracy("builtin:tiny-arithmetic", ignore=HEDGE) - 0.3


def test_a_step_of_one_row_is_refused(tmp_path):
    with pytest.raises(RunError, match=r"a step of 1 row.*mismatched.*training.batch_size=1"):
        train(tmp_path / "run", **{"data.builtin_size": 16, "data.eval_size": 4, "training.batch_size": 1,
                                   "training.micro_batch_size": 1, "training.max_steps": 1})


def test_micro_batching_does_not_change_the_step(tmp_path):
    short = {"data.builtin_size": 64, "data.eval_size": 8, "training.batch_size": 8, "training.max_steps": 1,
             "checkpoint.save_final": False}
    one = train(tmp_path / "one", **short, **{"training.micro_batch_size": 8})
    four = train(tmp_path / "four", **short, **{"training.micro_batch_size": 2})
    for key in ("loss", "grad_norm", "kl_estimate"):
        assert four[0][key] == pytest.approx(one[0][key], abs=1e-5), key


SHORT = {"data.builtin_size": 64, "data.eval_size": 8, "training.batch_size": 8, "training.max_steps": 2,
         "checkpoint.save_final": False}


@pytest.mark.parametrize("algo", ["kto_vanilla", "apo_zero_unpaired"])
def test_variants_run(tmp_path, algo):
    rows = train(tmp_path / "run", algo, **SHORT, **{"training.micro_batch_size": 8})
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    # policy == reference: every logratio 0 and every reference point 0, so each row's loss is 1 − σ(0) or σ(0)
    assert rows[0]["loss"] == pytest.approx(0.5, abs=1e-4) and rows[0]["accuracy"] == 0.5
    assert math.isfinite(rows[-1]["eval/loss"]) and "kl_ref_point" not in rows[0]


def test_kto_vanilla_micro_batching_does_not_change_the_step(tmp_path):
    # the class means are taken over the whole step, and so is their share of the gradient; the second step
    # (log-ratios no longer 0) is where means over micro-batches would differ from means over the step
    one = train(tmp_path / "one", "kto_vanilla", **SHORT, **{"training.micro_batch_size": 8})
    four = train(tmp_path / "four", "kto_vanilla", **SHORT, **{"training.micro_batch_size": 2})
    assert one[1]["ref_point/undesirable"] != 0.0
    for key in ("loss", "grad_norm", "ref_point/desirable", "ref_point/undesirable", "eval/loss"):
        assert four[1][key] == pytest.approx(one[1][key], abs=1e-5), key
