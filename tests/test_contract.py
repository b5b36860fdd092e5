"""The plugin contract suite (rlx.contract): every first-party distribution passes it, and
each check catches the breach it is there for."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fakedist import make_dist
from rlx.contract import checks, run_checks
from rlx.plugins import build_host
from rlx.testing import one_thread  # noqa: F401  (autouse)

ROOT = Path(__file__).parent.parent


def first_party() -> list[str]:
    import tomllib

    return ["rlx"] + sorted(tomllib.loads(p.read_text())["project"]["name"]
                            for p in ROOT.glob("plugins/*/*/pyproject.toml"))


HOST = build_host()
CASES = [(dist, check) for dist in first_party() for check in checks(dist, host=HOST)]


@pytest.mark.parametrize("dist, check", CASES, ids=[f"{d}-{c.id}" for d, c in CASES])
def test_first_party_plugins_keep_the_contract(dist, check, tiny_model_dir):
    check.run()


def test_every_algorithm_trains_in_the_suite():
    trained = {c.id.split(":")[1] for _, c in CASES if c.id.endswith(":trains")}
    assert trained == set(HOST.algorithms)


BAD_PARTS = '''
import torch  # a heavy import at module level
from dataclasses import dataclass, field

from rlx import AlgorithmSpec, hookimpl
from rlx.config import OnlineConfig


@dataclass
class BadConfig(OnlineConfig):
    clip_max: float = 5.0  # no help text


def by_position(rewards, mask, *, n_samples, **_):
    grouped = rewards.view(-1, n_samples)  # assumes each group's samples are adjacent
    adv = (grouped - grouped.mean(1, keepdim=True)).view(-1)
    return adv[:, None] * mask, adv[:, None] * mask


def leaky(logp, old_logp, advantages, mask, *, config):
    ratio = (logp - old_logp).exp()
    return -ratio * advantages, {"ratio": ratio}


def detached(logp, old_logp, advantages, mask, *, config):
    return -advantages * logp.detach(), {}


class Lenient:
    max_rounds = 0

    def keep(self, groups):
        return [True for _ in groups]


@hookimpl
def register_algorithms(register):
    register("bad_algo", AlgorithmSpec(name="bad_algo", description="x", loop="online", config=BadConfig,
                                       data="prompts", estimator="group_norm", policy_loss="leaky"))


@hookimpl
def register_advantage_estimators(register):
    register("by_position", by_position)


@hookimpl
def register_policy_losses(register):
    register("leaky", leaky)
    register("detached", detached)


@hookimpl
def register_samplers(register):
    register("lenient", lambda options: Lenient())
'''


def test_the_suite_catches_each_breach(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    make_dist(tmp_path, "rlx-fake-parts", {"rlx_fake_parts.py": BAD_PARTS}, {"parts": "rlx_fake_parts"})
    try:
        failures = dict(run_checks("rlx-fake-parts", train=False))
    finally:
        sys.modules.pop("rlx_fake_parts", None)
    assert failures["loads"] is None and failures["unique-names"] is None
    assert "imports ['torch']" in failures["light-import"]
    assert ("names estimator 'group_norm' of rlx-grpo, which rlx-fake-parts does not depend on"
            in failures["dependencies"])
    assert "config field 'clip_max' has no help text" in failures["algorithm:bad_algo:config"]
    assert "group by group_ids, not by position" in failures["estimator:by_position"]
    assert "returned metric 'ratio' of shape (6, 5)" in failures["policy-loss:leaky"]
    assert "no finite, non-zero gradient" in failures["policy-loss:detached"]
    assert "accepted the unknown option" in failures["sampler:lenient"]


def test_a_declared_dependency_satisfies_the_dependency_check(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    source = BAD_PARTS.replace("import torch  # a heavy import at module level\n", "")
    make_dist(tmp_path, "rlx-fake-deps", {"rlx_fake_deps.py": source}, {"deps": "rlx_fake_deps"})
    metadata = next(tmp_path.glob("rlx_fake_deps-*.dist-info")) / "METADATA"
    metadata.write_text(metadata.read_text() + "Requires-Dist: rlx\nRequires-Dist: rlx_grpo>=0.1\n")
    try:
        failures = dict(run_checks("rlx-fake-deps", train=False))
    finally:
        sys.modules.pop("rlx_fake_deps", None)
    assert failures["dependencies"] is None and failures["light-import"] is None


def test_a_broken_distribution_fails_its_load_check(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    make_dist(tmp_path, "rlx-fake-gone", {"rlx_fake_gone.py": "import not_a_module_anywhere\n"},
              {"gone": "rlx_fake_gone"})
    failures = dict(run_checks("rlx-fake-gone"))
    assert "rlx-fake-gone failed to load: failed to import rlx_fake_gone" in failures["loads"]
    assert "is not installed" in dict(run_checks("rlx-not-there"))["loads"]


def test_the_suite_runs_under_pytest_by_distribution_name(tmp_path):
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "rlx.contract"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300,
                         env={**os.environ, "RLX_CONTRACT": "rlx-reward-match"})
    assert run.returncode == 0 and "5 passed" in run.stdout, run.stdout[-2000:]
    cli = subprocess.run([sys.executable, "-m", "rlx_cli", "plugins", "check", "rlx-fake-nothing"],
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 1 and "FAIL  loads" in cli.stdout and "is not installed" in cli.stdout


def test_a_conflict_fails_unique_names_and_a_half_broken_distribution_fails_loads(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    dupe = ("from rlx import hookimpl\n@hookimpl\n"
            "def register_samplers(register):\n    register('dynamic_filter', None)\n")
    make_dist(tmp_path, "rlx-fake-dupe", {"rlx_fake_dupe.py": dupe}, {"dupe": "rlx_fake_dupe"})
    make_dist(tmp_path, "rlx-fake-half", {"rlx_fake_ok.py": "x = 1\n", "rlx_fake_bad.py": "import nope_nothing\n"},
              {"ok": "rlx_fake_ok", "bad": "rlx_fake_bad"})
    host = build_host()
    dupe_checks = {c.id: c for c in checks("rlx-fake-dupe", host=host)}
    dupe_checks["loads"].run()
    twice = "sampler 'dynamic_filter' is registered twice: by rlx-fake-dupe and by rlx-sampler-dynamic"
    with pytest.raises(AssertionError, match=twice):
        dupe_checks["unique-names"].run()
    half = {c.id: c for c in checks("rlx-fake-half", host=host)}
    with pytest.raises(AssertionError, match="rlx-fake-half failed to load: failed to import rlx_fake_bad"):
        half["loads"].run()
