"""DPO end to end on the demo policy: learning, the reference cache, micro-batching, bad data.

Runs go through ``rlx.run.run(resolve(spec, tree), host)``, the path ``rlx train`` takes
after parsing its arguments. The demo policy ``builtin:tiny-arithmetic`` answers
``arithmetic_small`` prompts with the right number but mostly hedges it ("17?"), which
exact match counts as wrong; chosen responses are the clean right answer, rejected ones
the hedged right answer or a near-miss number.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlx import testing
from rlx.tasks import HEDGE
from rlx.testing import greedy_accuracy, one_thread  # noqa: F401


SHORT = {"data.builtin_size": 64, "data.eval_size": 8, "training.batch_size": 8, "training.micro_batch_size": 8, "training.max_steps": 1,
         "checkpoint.save_final": False}


def train(out: Path, algo: str = "dpo", resume: bool = False, **settings) -> list[dict]:
    return testing.train(algo, out, settings, resume=resume)


def test_defaults_learn_the_preference_and_keep_the_answers(tmp_path):
    # the demo settings as `rlx train --algo dpo` runs them (β = 0.5, lr 5e-5, 80 steps), with a larger eval;
    # over 11 seeds (benchmarks/learning_seeds.py): held-out accuracy 0.78-0.85, greedy 0.92-0.95, and
    # the share of right numbers fell by 0.06-0.08; on another machine of the CI kind the same run gave
    # greedy 0.84 (the demo policy's SFT rounds differently on another CPU)
    rows = train(tmp_path / "run", **{"data.eval_size": 128, "training.eval_every": 40})
    assert rows[0]["accuracy"] == 0.0 and rows[0]["loss"] == pytest.approx(0.6931, abs=1e-3)  # policy == reference
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    assert len(evals) == 2 and evals[-1] >= 0.7, evals
    assert rows[-1]["eval/reward/margin"] > 0
    final = str(tmp_path / "run" / "final")
    # the demo policy hedges every answer; DPO removes the hedge ...
    assert greedy_accuracy("builtin:tiny-arithmetic") == 0.0 and greedy_accuracy(final) >= 0.75
    # ... and the numbers themselves stay right
    assert greedy_accuracy(final, ignore=HEDGE) >= greedy_accuracy("builtin:tiny-arithmetic", ignore=HEDGE) - 0.15


def test_precomputed_reference_matches_the_live_one(tmp_path):
    live = train(tmp_path / "live", **SHORT)
    cached = train(tmp_path / "cached", **SHORT, **{"algorithm.precompute_reference": True})
    cache = tmp_path / "cached" / "reference_logps.pt"
    assert cache.is_file() and not (tmp_path / "live" / "reference_logps.pt").exists()
    for key in ("loss", "grad_norm", "eval/loss", "eval/accuracy"):
        assert cached[0][key] == pytest.approx(live[0][key], abs=1e-5), key
    # --resume reuses the cache
    before = cache.stat().st_mtime_ns
    train(tmp_path / "cached", resume=True, **{**SHORT, "algorithm.precompute_reference": True,
                                               "training.max_steps": 2})
    assert cache.stat().st_mtime_ns == before


def test_micro_batching_does_not_change_the_step(tmp_path):
    one = train(tmp_path / "one", **SHORT)
    four = train(tmp_path / "four", **{**SHORT, "training.micro_batch_size": 2})
    for key in ("loss", "grad_norm", "reward/margin"):
        assert four[0][key] == pytest.approx(one[0][key], abs=1e-5), key


def test_ipo_runs(tmp_path):
    rows = train(tmp_path / "run", "ipo", **{**SHORT, "training.max_steps": 2})
    assert rows[0]["loss"] == pytest.approx(25.0, abs=1e-3)  # z = 0 at the start: (0 − 1/(2·0.1))²


@pytest.mark.parametrize("bad, message", [
    ({"chosen": "5", "rejected": "5"}, "line 3: keys 'chosen' and 'rejected' are the same"),
    ({"chosen": "  ", "rejected": "5"}, "line 3: key 'chosen' is empty"),
    ({"rejected": "5"}, "line 3: key 'chosen' is missing"),
])
def test_bad_pairs_are_named_by_the_cli(tmp_path, bad, message):
    rows = [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}] * 4
    rows.insert(2, {"prompt": "2+3=", **bad})
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = subprocess.run([sys.executable, "-m", "rlx_cli", "train", "--algo", "dpo", "--data", str(path),
                             "--output", str(tmp_path / "run"), "--model", "builtin:tiny"],
                            capture_output=True, text=True, env={**os.environ, "RLX_CACHE": os.environ["RLX_CACHE"]})
    assert result.returncode == 1, result.stderr
    assert f"{path} {message}" in result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("algo, settings, first_loss", [
    ("hinge", {}, 1.0),                                    # z = 0 at the start: max(0, 1 − 0)
    ("robust_dpo", {}, 0.6931),                            # ((1 − ε) − ε)·log 2 / (1 − 2ε) = log 2
    ("fdpo", {}, 0.6931),                                  # log σ(0) − log σ(0) = 0: −log σ(0)
    ("ipo", {"algorithm.length_normalize": True}, 25.0),   # z = 0 however it is normalised: 1/(4·0.1²)
])
def test_dpo_family_runs(tmp_path, algo, settings, first_loss):
    rows = train(tmp_path / "run", algo, **{**SHORT, "training.max_steps": 2, **settings})
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    assert rows[0]["loss"] == pytest.approx(first_loss, abs=1e-3)
    assert math.isfinite(rows[-1]["eval/loss"]) and "eval/accuracy" in rows[-1]
