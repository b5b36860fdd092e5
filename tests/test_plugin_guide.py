"""Plugins written from the docs alone: docs/plugin-guide.md's examples, built from the
guide's own code blocks (fenced blocks tagged ``file=PATH``), and one distribution of each
kind as `rlx plugins new` writes it, installed with pip (one call for all) and run: their
own tests (the contract suite, which trains each algorithm two steps), `rlx plugins list`
and the commands the guide shows."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlx.scaffold import KINDS as TEMPLATE_KINDS, names, new_plugin
from test_cli import rlx

GUIDE = Path(__file__).parent.parent / "docs" / "plugin-guide.md"
BLOCK = re.compile(r"^```\w+ file=(\S+)\n(.*?)^```$", re.M | re.S)
HOOKS = ["register_algorithms", "register_advantage_estimators", "register_policy_losses",
         "register_preference_losses", "register_reward_functions", "register_reward_models", "register_samplers",
         "register_vlm_processors"]


def examples() -> dict[str, dict[str, str]]:
    """Distribution folder -> {path inside it: text}."""
    found: dict[str, dict[str, str]] = {}
    for path, text in BLOCK.findall(GUIDE.read_text()):
        folder, _, inner = path.partition("/")
        found.setdefault(folder, {})[inner] = text
    return found


def test_every_kind_has_a_complete_example():
    found = examples()
    sources = "".join(text for files in found.values() for text in files.values())
    for hook in HOOKS:
        assert f"def {hook}(register)" in sources, hook
    assert any('loop="online"' in text for files in found.values() for text in files.values())
    assert any('loop="offline"' in text for files in found.values() for text in files.values())
    for folder, files in found.items():
        package = folder.replace("-", "_")
        assert {"pyproject.toml", f"src/{package}/__init__.py", f"tests/test_{package}.py"} <= set(files), folder


@pytest.fixture(scope="module")
def installed(tmp_path_factory, tiny_model_dir):
    """(the environment with every plugin installed, the verbose output of their tests)."""
    root = tmp_path_factory.mktemp("authors")
    for folder, files in examples().items():
        for inner, text in files.items():
            path = root / "src" / folder / inner
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for kind in TEMPLATE_KINDS:
        new_plugin(f"new_{kind}", kind, root / "src")
    folders = sorted((root / "src").iterdir())
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(root / "site"), *map(str, folders)], check=True, capture_output=True)
    env = {**os.environ, "RLX_STRICT_PLUGINS": "1",
           "PYTHONPATH": os.pathsep.join([str(root / "site"), os.environ.get("PYTHONPATH", "")])}
    tests = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                            *[str(f / "tests") for f in folders]],
                           capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert tests.returncode == 0, tests.stdout[-4000:]
    return env, tests.stdout


def test_the_guides_examples_pass_their_own_tests(installed):
    _, output = installed
    for check in ["algorithm:cispo:trains", "algorithm:slic:trains", "dependencies", "estimator:loo_whiten",
                  "policy-loss:ppo_dual_clip", "preference-loss:slic", "reward-function:boxed", "sampler:spread"]:
        assert f"test_contract[{check}] PASSED" in output, check
    assert "test_scores_through_the_host PASSED" in output
    assert "test_boxed_answers_score_highest PASSED" in output
    assert "test_encodes_a_prompt_with_two_images PASSED" in output


def test_templates_of_every_kind_pass_their_own_tests_and_are_listed(installed):
    env, output = installed
    for check in ["algorithm:new_algorithm:trains", "estimator:new_estimator", "policy-loss:new_policy_loss",
                  "reward-function:new_reward", "sampler:new_sampler", "reward-model:new_reward_model",
                  "vlm-processor:new_vlm_processor"]:
        assert f"test_contract[{check}] PASSED" in output, check
    listed = json.loads(rlx("plugins", "list", "--json", env=env).stdout)
    plugins = {p["name"]: p for p in listed["plugins"]}
    assert listed["failed"] == []
    assert plugins["rlx-new-algorithm"]["components"] == {
        "algorithms": ["new_algorithm"], "advantage_estimators": ["new_algorithm_advantages"],
        "policy_losses": ["new_algorithm_loss"]}
    for kind in TEMPLATE_KINDS:
        assert plugins[names(f"new_{kind}")[1]]["version"] == "0.1.0"
    for dist in ["rlx-cispo", "rlx-slic", "rlx-boxed", "rlx-keyword-rm", "rlx-spread", "rlx-toy-vlm"]:
        assert plugins[dist]["version"] == "0.1.0"


def test_the_online_example_runs_as_the_guide_shows(installed, tiny_model_dir, tmp_path):
    env, _ = installed
    shown = rlx("algos", "show", "cispo", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "algorithm.weight_clip (float) = 4.0" in shown.stdout and "algorithm.n_samples" in shown.stdout

    typo = rlx("train", "--algo", "cispo", "--set", "algorithm.weight_clp=2", env=env)
    assert typo.returncode == 2 and "Did you mean 'algorithm.weight_clip'" in typo.stderr

    out = tmp_path / "run"
    small = ["algorithm.rollout_batch_size=2", "algorithm.n_samples=2", "algorithm.eval_size=2", "algorithm.eval_k=2",
             "training.batch_size=4", "training.micro_batch_size=4", "rollout.max_new_tokens=4",
             "logging.progress=false", "logging.tensorboard=false", "algorithm.weight_clip=2"]
    trained = rlx("train", "--algo", "cispo", "--model", tiny_model_dir, "--max-steps", "1", "--output", str(out),
                  *[arg for s in small for arg in ("--set", s)], env=env)
    assert trained.returncode == 0, trained.stderr
    assert '"clip_frac"' in (out / "metrics.jsonl").read_text()
