"""docs/plugin-guide.md's examples, built from the guide's own code blocks (fenced blocks
tagged ``file=PATH``), installed with pip and run: their own tests (the contract suite,
which trains each algorithm two steps) and the commands the guide shows."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli import rlx

GUIDE = Path(__file__).parent.parent / "docs" / "plugin-guide.md"
BLOCK = re.compile(r"^```\w+ file=(\S+)\n(.*?)^```$", re.M | re.S)
KINDS = ["register_algorithms", "register_advantage_estimators", "register_policy_losses",
         "register_preference_losses", "register_reward_functions", "register_reward_models", "register_samplers"]


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
    for hook in KINDS:
        assert f"def {hook}(register)" in sources, hook
    assert any('loop="online"' in text for files in found.values() for text in files.values())
    assert any('loop="offline"' in text for files in found.values() for text in files.values())
    for folder, files in found.items():
        package = folder.replace("-", "_")
        assert {"pyproject.toml", f"src/{package}/__init__.py", f"tests/test_{package}.py"} <= set(files), folder


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("guide")
    for folder, files in examples().items():
        for inner, text in files.items():
            path = root / "src" / folder / inner
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    folders = sorted((root / "src").iterdir())
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(root / "site"), *map(str, folders)], check=True, capture_output=True)
    env = {**os.environ, "RLX_STRICT_PLUGINS": "1",
           "PYTHONPATH": os.pathsep.join([str(root / "site"), os.environ.get("PYTHONPATH", "")])}
    return root, folders, env


def test_examples_pass_their_own_tests(installed):
    root, folders, env = installed
    result = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                             *[str(f / "tests") for f in folders]],
                            capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
    for check in ["algorithm:cispo:trains", "algorithm:slic:trains", "dependencies", "estimator:loo_whiten",
                  "policy-loss:ppo_dual_clip", "preference-loss:slic", "reward-function:boxed", "sampler:spread"]:
        assert f"test_contract[{check}] PASSED" in result.stdout, check
    assert "test_scores_through_the_host PASSED" in result.stdout


def test_the_online_example_runs_as_the_guide_shows(installed, tiny_model_dir, tmp_path):
    _, _, env = installed
    shown = rlx("algos", "show", "cispo", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "algorithm.weight_clip (float) = 4.0" in shown.stdout and "algorithm.n_samples" in shown.stdout

    typo = rlx("train", "--algo", "cispo", "--set", "algorithm.weight_clp=2", env=env)
    assert typo.returncode == 2 and "Did you mean 'algorithm.weight_clip'" in typo.stderr
    bad = rlx("train", "--algo", "cispo", "--set", "algorithm.weight_clip=0", env=env)
    assert bad.returncode == 2 and "algorithm.weight_clip must be positive" in bad.stderr

    out = tmp_path / "run"
    small = ["algorithm.rollout_batch_size=2", "algorithm.n_samples=2", "algorithm.eval_size=2", "algorithm.eval_k=2",
             "training.batch_size=4", "training.micro_batch_size=4", "rollout.max_new_tokens=4",
             "logging.progress=false", "logging.tensorboard=false", "algorithm.weight_clip=2"]
    trained = rlx("train", "--algo", "cispo", "--model", tiny_model_dir, "--max-steps", "1", "--output", str(out),
                  *[arg for s in small for arg in ("--set", s)], env=env)
    assert trained.returncode == 0, trained.stderr
    assert '"clip_frac"' in (out / "metrics.jsonl").read_text()
