"""Rollouts that overlap training (``rollout.overlap``): the staleness bound, each sample's
policy version, the engine's own weights, exact resume, and the settings checked early.
The same run under Ray is in test_launchers.py."""

import json
import threading

import pytest

from e2e import KillAfter, Killed, one_thread  # noqa: F401 (one_thread: autouse)
from rlx import hookimpl, online
from rlx.ahead import RolloutsAhead
from rlx.config import ConfigError, resolve
from rlx.multimodal import check_supported
from rlx.plugins import build_host
from rlx.run import run

QUIET = {"logging": {"progress": False, "tensorboard": False}, "checkpoint": {"save_final": False}}
TIS = {"off_policy_correction": "tis", "eval_size": 8}
PARTIAL = {"overlap": True, "partial_tokens": 2}


class Lockstep(RolloutsAhead):
    """A rollout made while the policy trains takes the new weights after its first
    segment, however fast either side runs: runs that repeat exactly."""

    def _start(self, step, policy_version):
        self.segments = 0
        self.trained = threading.Event() if step > policy_version else None  # the policy trains meanwhile
        super()._start(step, policy_version)

    def publish(self, version):
        super().publish(version)
        if self.trained is not None:
            self.trained.set()

    def boundary(self):
        self.segments += 1
        if self.segments > 1 and self.trained is not None:
            assert self.trained.wait(timeout=120)
        return super().boundary()


class Versions:
    """Each step's ``Batch.token_versions`` and ``action_mask``."""

    def __init__(self):
        self.steps = []

    @hookimpl
    def on_rollout_end(self, step, rollout, metrics):
        self.steps.append((rollout.token_versions.tolist(), rollout.action_mask.tolist()))


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


def killed_and_resumed(host, tmp_path, rollout: dict, whole: list[dict]) -> dict:
    """A 4-step run checkpointed every 2 steps, killed in step 3 and resumed: its steps equal
    the uninterrupted run's ``whole`` (the killed step 3 is dropped and made again). Returns
    the step-2 checkpoint's trainer state."""
    tree = {"output": str(tmp_path / "cut"), **QUIET, "training": {"max_steps": 4}, "algorithm": TIS,
            "rollout": rollout, "checkpoint": {"every": 2, "save_final": False}}
    config = resolve(host.algorithms.get("grpo"), tree)
    killing = build_host()
    killing.pm.register(KillAfter(3))
    with pytest.raises(Killed):
        run(config, killing)
    state = json.loads((tmp_path / "cut" / "checkpoints" / "step_00000002" / "trainer_state.json").read_text())
    run(config, host, resume=True)
    resumed = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
               if '"reward/mean"' in line]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for key in ("reward/mean", "loss/policy", "grad_norm", "rollout/staleness", "rollout/logp_diff"):
        assert [r[key] for r in resumed] == pytest.approx([r[key] for r in whole], abs=1e-6), key
    return state


def test_a_killed_overlapped_run_resumes_exactly(host, demo_policy, tmp_path):
    """The rollout in flight at a checkpoint is saved with it: the resumed run trains on
    the samples the uninterrupted one did, made by the same (older) weights."""
    whole = train(host, tmp_path / "whole", 4, {"overlap": True})
    state = killed_and_resumed(host, tmp_path, {"overlap": True}, whole)
    assert state["pending_rollout"]["step"] == 2 and state["pending_rollout"]["version"] == 1


def test_overlap_settings_are_checked_before_anything_loads(host):
    grpo = host.algorithms.get("grpo")
    with pytest.raises(ConfigError, match="algorithm.off_policy_correction=tis"):
        resolve(grpo, {"rollout": {"overlap": True}})
    with pytest.raises(ConfigError, match="rollout.overlap and rollout.sleep"):
        resolve(grpo, {"rollout": {"overlap": True, "sleep": True}, "algorithm": TIS})
    with pytest.raises(ConfigError, match="rollout.max_staleness must be at least 1"):
        resolve(grpo, {"rollout": {"overlap": True, "max_staleness": 0}, "algorithm": TIS})
    with pytest.raises(ConfigError, match="rollout.partial_tokens needs rollout.overlap"):
        resolve(grpo, {"rollout": {"partial_tokens": 8}, "algorithm": TIS})
    with pytest.raises(ConfigError, match="rollout.partial_tokens must be 0"):
        resolve(grpo, {"rollout": {**PARTIAL, "partial_tokens": -1}, "algorithm": TIS})
    with pytest.raises(ConfigError, match="rollout.partial_tokens does not work with environment 'calculator'"):
        resolve(grpo, {"rollout": PARTIAL, "algorithm": TIS, "environment": {"name": "calculator"}})
    # a vision-language model is refused where its other limits are, before its weights load
    with pytest.raises(ConfigError, match="rollout.partial_tokens: a response continued .* takes no images"):
        check_supported(resolve(grpo, {"rollout": PARTIAL, "algorithm": TIS}), grpo, "native")


def test_partial_rollouts_take_the_new_weights_between_segments(host, demo_policy, tmp_path, monkeypatch):
    # as it comes: the update lands at whichever segment boundary follows it
    free = train(host, tmp_path / "free", 3, PARTIAL)
    assert [r["rollout/staleness_max"] for r in free][0] == 0
    assert all(0 <= r["rollout/staleness"] <= r["rollout/staleness_max"] <= 1 for r in free)
    # in lockstep: a rollout made while the policy trains has its first segment (2 tokens)
    # from the weights one update old and the rest from the new ones, its responses going on
    monkeypatch.setattr(online, "RolloutsAhead", Lockstep)
    versions = Versions()
    watched = build_host()
    watched.pm.register(versions)
    rows = train(watched, tmp_path / "lockstep", 3, PARTIAL)
    assert rows[0]["rollout/staleness"] == 0
    for r in rows[1:]:
        assert 0 < r["rollout/staleness"] < 1 and r["rollout/staleness_max"] == 1
    for step, (tokens, masks) in enumerate(versions.steps):
        for row, mask in zip(tokens, masks):
            length = int(sum(mask))
            expected = [0] * length if step == 0 else [step - 1] * min(length, 2) + [step] * (length - 2)
            assert row[:length] == expected
    assert any(sum(mask) > 2 for _, masks in versions.steps[1:] for mask in masks)


def test_a_killed_run_with_partial_rollouts_resumes_exactly(host, demo_policy, tmp_path, monkeypatch):
    """The checkpoint keeps the rollout in flight with each token's version: the resumed run
    trains on the samples the uninterrupted one did, and goes on like it."""
    monkeypatch.setattr(online, "RolloutsAhead", Lockstep)
    whole = train(host, tmp_path / "whole", 4, PARTIAL)
    state = killed_and_resumed(host, tmp_path, PARTIAL, whole)
    saved = [c["versions"] for c in state["pending_rollout"]["rollout"]["completions"]]
    assert all(v == [1] * min(len(v), 2) + [2] * (len(v) - 2) for v in saved) and max(map(len, saved)) > 2
