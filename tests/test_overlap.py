"""Rollouts that overlap training (``rollout.overlap``): the staleness bound, each sample's
policy version, the engine's own weights, exact resume, and the settings checked early.
The same run under Ray is in test_launchers.py."""

import json

import pytest

from e2e import KillAfter, Killed, one_thread  # noqa: F401 (one_thread: autouse)
from rlx.config import ConfigError, resolve
from rlx.plugins import build_host
from rlx.run import run

QUIET = {"logging": {"progress": False, "tensorboard": False}, "checkpoint": {"save_final": False}}
TIS = {"off_policy_correction": "tis", "eval_size": 8}


@pytest.fixture(scope="module")
def host():
    return build_host()


def train(host, out, steps, rollout=None, **tree):
    tree = {"output": str(out), **QUIET, "training": {"max_steps": steps}, "algorithm": TIS,
            "rollout": rollout or {}, **tree}
    run(resolve(host.algorithms.get("grpo"), tree), host)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"reward/mean"' in line]


def test_overlapped_rollouts_lag_within_the_bound(host, demo_policy, tmp_path):
    synchronous = train(host, tmp_path / "sync", 3)
    one = train(host, tmp_path / "one", 3, {"overlap": True})
    two = train(host, tmp_path / "two", 5, {"overlap": True, "max_staleness": 2})
    assert [r["rollout/staleness"] for r in synchronous] == [0, 0, 0]
    assert [r["rollout/staleness"] for r in one] == [0, 1, 1]
    # the engine takes new weights only when the next rollout would lag more than 2 updates
    assert [r["rollout/staleness"] for r in two] == [0, 1, 2, 1, 2]
    # step 1 trains on the starting weights' samples either way: the same numbers
    for key in ("reward/mean", "loss/policy", "grad_norm"):
        assert one[0][key] == pytest.approx(synchronous[0][key], abs=1e-6), key
    # later samples come from weights one update old: the trainer's log-probs moved away
    # from the engine's, by far more than the rounding a synchronous step sees
    assert one[1]["rollout/logp_diff"] > 10 * synchronous[1]["rollout/logp_diff"] + 1e-5


def test_a_killed_overlapped_run_resumes_exactly(host, demo_policy, tmp_path):
    """The rollout in flight at a checkpoint is saved with it: the resumed run trains on
    the samples the uninterrupted one did, made by the same (older) weights."""
    whole = train(host, tmp_path / "whole", 4, {"overlap": True})
    tree = {"output": str(tmp_path / "cut"), **QUIET, "training": {"max_steps": 4}, "algorithm": TIS,
            "rollout": {"overlap": True}, "checkpoint": {"every": 2, "save_final": False}}
    config = resolve(host.algorithms.get("grpo"), tree)
    killing = build_host()
    killing.pm.register(KillAfter(3))
    with pytest.raises(Killed):
        run(config, killing)
    state = json.loads((tmp_path / "cut" / "checkpoints" / "step_00000002" / "trainer_state.json").read_text())
    assert state["pending_rollout"]["step"] == 2 and state["pending_rollout"]["version"] == 1
    run(config, host, resume=True)
    resumed = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
               if '"reward/mean"' in line]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]  # the killed run's step 3 is dropped and made again
    for key in ("reward/mean", "loss/policy", "grad_norm", "rollout/staleness", "rollout/logp_diff"):
        assert [r[key] for r in resumed] == pytest.approx([r[key] for r in whole], abs=1e-6), key


def test_overlap_settings_are_checked_before_anything_loads(host):
    grpo = host.algorithms.get("grpo")
    with pytest.raises(ConfigError, match="algorithm.off_policy_correction=tis"):
        resolve(grpo, {"rollout": {"overlap": True}})
    with pytest.raises(ConfigError, match="rollout.overlap and rollout.sleep"):
        resolve(grpo, {"rollout": {"overlap": True, "sleep": True}, "algorithm": TIS})
    with pytest.raises(ConfigError, match="rollout.max_staleness must be at least 1"):
        resolve(grpo, {"rollout": {"overlap": True, "max_staleness": 0}, "algorithm": TIS})
