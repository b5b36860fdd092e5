"""The same run under the local and the Ray launcher: same metrics on the same seed, local
plugins visible to the workers, a cluster joined with --ray-address, a clear error
without Ray."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlx.config import ConfigError, resolve
from rlx.plugins import build_host

pytest.importorskip("ray", reason="the Ray launcher needs ray (installed by requirements-dev.txt)")

QUIET = ["--set", "logging.progress=false", "--set", "logging.tensorboard=false", "--set", "checkpoint.save_final=false"]
SETTINGS = ["--max-steps", "2", *QUIET, "--set", "algorithm.eval_size=8"]
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def rlx(*args, cwd=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "rlx_cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=ENV, timeout=timeout)


def metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "tokens_per_s"))} for r in rows]


def assert_same(rows: list[dict], expected: list[dict], abs: float = 1e-6) -> None:
    """The same metrics at every step, but for the engine-vs-trainer gap, which is rounding."""
    def kept(r):
        return {k: v for k, v in r.items() if not k.startswith("rollout/logp_diff")}

    assert len(rows) == len(expected)
    for row, want in zip(rows, expected):
        assert kept(row) == pytest.approx(kept(want), rel=1e-5, abs=abs)


def test_ppo_under_ray_gives_the_local_metrics(demo_policy, tmp_path):
    # ppo places every role: policy, critic, reference (KL in the reward), reward, rollout;
    # under Ray policy and reference share a slot, and critic and reward another
    runs = {}
    colocate = ["--set", 'launcher.colocate=["policy,reference", "critic,reward"]']
    for launcher in ("local", "ray"):
        result = rlx("train", "--algo", "ppo", "--launcher", launcher, *(colocate if launcher == "ray" else []),
                     "--output", str(tmp_path / launcher), *SETTINGS)
        assert result.returncode == 0, result.stdout + result.stderr
        runs[launcher] = metrics(tmp_path / launcher)
    # the k1 estimate of KL has either sign: not 0 says that a reference model was compared
    assert len(runs["ray"]) == 3 and "loss/value" in runs["ray"][-1] and runs["ray"][-1]["kl"] != 0
    assert [sorted(r) for r in runs["ray"]] == [sorted(r) for r in runs["local"]]
    assert_same(runs["ray"], runs["local"])
    assert (tmp_path / "ray" / "checkpoints" / "step_00000002" / "COMPLETE").is_file()


def test_overlapped_rollouts_under_ray_give_the_local_metrics(demo_policy, tmp_path):
    # the rollout actor generates step k+1 while the policy actor trains step k; locally a
    # thread does, with an engine copy: the same samples and updates either way
    runs = {}
    overlap = ["--set", "rollout.overlap=true", "--set", "algorithm.off_policy_correction=tis", "--max-steps", "3"]
    for launcher in ("local", "ray"):
        result = rlx("train", "--algo", "grpo", "--launcher", launcher, "--output", str(tmp_path / launcher),
                     *SETTINGS, *overlap)
        assert result.returncode == 0, result.stdout + result.stderr
        runs[launcher] = metrics(tmp_path / launcher)
    assert [r.get("rollout/staleness") for r in runs["ray"]] == [None, 0, 1, 1]
    assert_same(runs["ray"], runs["local"])


def test_partial_rollouts_run_under_ray(demo_policy, tmp_path):
    # the driver's thread makes the rollout in segments on the rollout actor; between two, the
    # actor loads the weights of an update the policy actor has finished (when one has)
    partial = ["--set", "rollout.overlap=true", "--set", "rollout.partial_tokens=2", "--set",
               "algorithm.off_policy_correction=tis", "--max-steps", "3"]
    result = rlx("train", "--algo", "grpo", "--launcher", "ray", "--output", str(tmp_path / "ray"), *SETTINGS, *partial)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [r for r in metrics(tmp_path / "ray") if "reward/mean" in r]
    assert len(rows) == 3 and rows[0]["rollout/staleness_max"] == 0
    assert all(0 <= r["rollout/staleness"] <= r["rollout/staleness_max"] <= 1 for r in rows)


PLUGIN = '''
from rlx import hookimpl


def always_half(prompts, completions, labels, **columns):
    return [0.5 for _ in completions]


@hookimpl
def register_reward_functions(register):
    register("always_half", always_half)
'''


def test_a_local_plugin_file_reaches_the_ray_workers(demo_policy, tmp_path):
    (tmp_path / "half.py").write_text(PLUGIN)
    result = rlx("train", "--algo", "grpo", "--launcher", "ray", "--plugin", "half.py", "--reward", "always_half",
                 "--output", "run", *SETTINGS, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert all(r["reward/mean"] == 0.5 for r in metrics(tmp_path / "run") if "reward/mean" in r)


def test_joins_a_cluster_started_with_ray_start(demo_policy, tmp_path):
    ray = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    port = "6391"
    started = subprocess.run([ray, "start", "--head", "--port", port, "--num-cpus", "8", "--include-dashboard",
                              "false", "--disable-usage-stats"], capture_output=True, text=True, env=ENV,
                             timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        result = rlx("train", "--algo", "grpo", "--launcher", "ray", "--ray-address", f"127.0.0.1:{port}",
                     "--output", str(tmp_path / "run"), *SETTINGS)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Connected to Ray cluster" in result.stderr or "Connecting to existing Ray cluster" in result.stderr
        assert len(metrics(tmp_path / "run")) == 3
    finally:
        subprocess.run([ray, "stop", "--force"], capture_output=True, env=ENV, timeout=120)


def test_missing_ray_is_named_before_anything_loads(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    host = build_host()
    with pytest.raises(ConfigError, match=r"Ray is not installed: pip install 'rlx\[ray\]'"):
        resolve(host.algorithms.get("grpo"), {"launcher": {"name": "ray"}})


DYING = '''
import os
import signal
from pathlib import Path

from rlx import hookimpl

CALLS = Path(__file__).with_suffix(".calls")


def dies_on_fifth_call(prompts, completions, labels, **columns):
    calls = int(CALLS.read_text()) + 1 if CALLS.exists() else 1
    CALLS.write_text(str(calls))
    if calls == 5:  # two evaluation calls, then steps 1 and 2; the third step's scoring kills the worker
        os.kill(os.getpid(), signal.SIGKILL)
    return [float(c.strip() == str(l)) for c, l in zip(completions, labels)]


@hookimpl
def register_reward_functions(register):
    register("dies_on_fifth_call", dies_on_fifth_call)
'''


def test_a_worker_that_dies_stops_the_run_and_resume_continues(demo_policy, tmp_path):
    import time

    (tmp_path / "dying.py").write_text(DYING)
    steps = ["--set", "checkpoint.every=1", "--max-steps", "4"]
    started = time.monotonic()
    result = rlx("train", "--algo", "grpo", "--launcher", "ray", "--plugin", "dying.py", "--reward",
                 "dies_on_fifth_call", "--output", "run", *SETTINGS, *steps, cwd=tmp_path)
    assert result.returncode != 0
    assert "the reward worker (rank 0) died during score()" in result.stdout + result.stderr
    assert time.monotonic() - started < 120  # Ray start and model loading included; the death itself is seen at once
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*"))
    assert checkpoints[-1] == "step_00000002" and (tmp_path / "run" / "checkpoints" / checkpoints[-1] / "COMPLETE").is_file()
    resumed = rlx("train", "--algo", "grpo", "--launcher", "ray", "--output", "run", "--resume", *SETTINGS, *steps,
                  cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from" in resumed.stdout
    assert [r["step"] for r in metrics(tmp_path / "run") if "reward/mean" in r] == [1, 2, 3, 4]


ZERO3 = ["--algo", "grpo", "--set", "training.backend=deepspeed", "--set", "training.zero_stage=3",
         "--set", "algorithm.kl_coef=0.01", "--set", "training.micro_batch_size=16"]


def test_a_worker_that_cannot_start_is_named_with_its_own_error(demo_policy, tmp_path):
    # a causal LM is no reward model: the reward worker finds that as it loads it
    result = rlx("train", "--algo", "grpo", "--launcher", "ray", "--set", f"reward.model={demo_policy}",
                 "--output", "run", *SETTINGS, cwd=tmp_path)
    assert result.returncode != 0
    assert (f"the reward worker (rank 0) failed to start: rlx.errors.RewardError: reward.model: 'model' could not "
            f"load '{demo_policy}'") in result.stdout + result.stderr
    assert "is not a reward model" in result.stdout + result.stderr


def test_two_zero3_policy_ranks_give_the_one_rank_update_and_resume(demo_policy, tmp_path):
    # the policy on 2 ZeRO-3 ranks (gloo) under Ray, a reference, a reward and a rollout actor,
    # against one ZeRO-3 rank in one process: the same global batch, the same updates
    one = rlx("train", *ZERO3, "--output", str(tmp_path / "one"), *SETTINGS)
    assert one.returncode == 0, one.stdout + one.stderr
    two = rlx("train", *ZERO3, "--launcher", "ray", "--set", "launcher.policy_ranks=2", "--set", "checkpoint.every=1",
              "--output", str(tmp_path / "two"), *SETTINGS)
    assert two.returncode == 0, two.stdout + two.stderr
    rows_one, rows_two = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert len(rows_two) == 3 and rows_two[-1]["kl"] > 0
    assert_same(rows_two, rows_one)
    assert (tmp_path / "two" / "checkpoints" / "step_00000002" / "COMPLETE").is_file()
    resumed = rlx("train", *ZERO3, "--launcher", "ray", "--set", "launcher.policy_ranks=2", "--resume",
                  "--output", str(tmp_path / "two"), *SETTINGS, "--max-steps", "3")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [r["step"] for r in metrics(tmp_path / "two") if "reward/mean" in r] == [1, 2, 3]


def test_rank_settings_are_checked_before_anything_loads():
    host = build_host()
    grpo = host.algorithms.get("grpo")
    with pytest.raises(ConfigError, match="needs launcher.name=ray"):
        resolve(grpo, {"launcher": {"policy_ranks": 2}, "training": {"backend": "deepspeed"}})
    with pytest.raises(ConfigError, match="needs training.backend=deepspeed"):
        resolve(grpo, {"launcher": {"name": "ray", "policy_ranks": 2}})
    with pytest.raises(ConfigError, match="split evenly over launcher.policy_ranks=3"):
        resolve(grpo, {"launcher": {"name": "ray", "policy_ranks": 3}, "training": {"backend": "deepspeed"}})
    with pytest.raises(ConfigError, match="launcher.colocate needs launcher.name=ray"):
        resolve(grpo, {"launcher": {"colocate": ["policy,reference"]}})
    with pytest.raises(ConfigError, match="unknown role 'actor'"):
        resolve(grpo, {"launcher": {"name": "ray", "colocate": ["actor,reference"]}})


@pytest.mark.parametrize("algo", ["sft", "rm", "dpo", "kto"])
def test_offline_algorithms_on_two_ray_ranks_give_the_one_rank_updates(algo, tmp_path):
    # the same global batch on one ZeRO-2 rank here and on two under Ray: the same updates
    args = ["train", "--algo", algo, "--set", "training.backend=deepspeed", "--set", "training.zero_stage=2",
            *QUIET, "--max-steps", "3"]
    one = rlx(*args, "--output", str(tmp_path / "one"))
    assert one.returncode == 0, one.stdout + one.stderr
    two = rlx(*args, "--launcher", "ray", "--set", "launcher.policy_ranks=2", "--output", str(tmp_path / "two"))
    assert two.returncode == 0, two.stdout + two.stderr
    rows_one, rows_two = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert len(rows_two) == 3 and any(k.startswith("eval/") for k in rows_two[-1])
    # float rounding of a two-rank gradient sum: Adam's first steps turn it into rewards of
    # the reward model's fresh head about 2e-5 apart, and KTO's KL estimate 1.3e-6 apart
    assert_same(rows_two, rows_one, abs=1e-4 if algo in ("rm", "kto") else 1e-6)


def test_ppo_with_a_critic_group_of_two_ranks_gives_the_one_rank_updates(demo_policy, tmp_path):
    args = ["train", "--algo", "ppo", "--set", "training.backend=deepspeed", "--set", "training.zero_stage=2",
            "--set", "training.micro_batch_size=16", *SETTINGS]
    one = rlx(*args, "--output", str(tmp_path / "one"))
    assert one.returncode == 0, one.stdout + one.stderr
    two = rlx(*args, "--launcher", "ray", "--set", "launcher.critic_ranks=2", "--output", str(tmp_path / "two"))
    assert two.returncode == 0, two.stdout + two.stderr
    rows_one, rows_two = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert "loss/value" in rows_two[-1]
    # the clipped fraction counts tokens past a threshold: rounding moves one token across it
    def unclipped(rows):
        return [{k: v for k, v in r.items() if not k.endswith("clip_frac")} for r in rows]

    assert_same(unclipped(rows_two), unclipped(rows_one))
