"""The command line, run as a user runs it."""

import json
import subprocess
import sys

import pytest
import yaml


def rlx(*args, timeout=120, **kw):
    return subprocess.run([sys.executable, "-m", "rlx_cli", *args], capture_output=True, text=True, timeout=timeout, **kw)


HEAVY = ("torch", "transformers", "ray", "vllm", "deepspeed", "datasets", "matplotlib", "wandb")


@pytest.mark.parametrize("argv", [[], ["--help"], ["plugins", "list"], ["algos", "list"]])
def test_light_commands_import_nothing_heavy(argv):
    code = (
        "import sys\n"
        f"sys.argv = ['rlx', *{argv!r}]\n"
        "import rlx, rlx_cli\n"
        "try:\n    rlx_cli.main()\nexcept SystemExit:\n    pass\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout + result.stderr


@pytest.mark.parametrize("args,error", [
    (["--model", "builtin:tiny", "--data", "missing.jsonl"], "data.path: data file 'missing.jsonl' does not exist"),
    (["--set", "data.eval_path=./held-out"], "data.eval_path: data file './held-out' does not exist"),
    (["--model", "./no-model"], "model folder './no-model' does not exist"),
    (["--model", "empty"], "model folder 'empty' holds no config.json"),
    (["--set", "reward.model=/no/reward-model"], "model folder '/no/reward-model' does not exist"),
    (["--reward", "rewards.py:brevity"], "reward.functions: reward function 'rewards.py:brevity': file 'rewards.py' does not exist"),
    (["--reward", "exact_matsh"], "reward.functions: unknown reward function 'exact_matsh'"),
])
def test_a_wrong_path_or_reward_fails_before_the_model_libraries_load(tmp_path, args, error):
    (tmp_path / "empty").mkdir()
    code = (
        "import sys\n"
        f"sys.argv = ['rlx', 'train', '--algo', 'grpo', '--output', 'run', *{args!r}]\n"
        "import rlx_cli\n"
        "try:\n    rlx_cli.main()\nexcept SystemExit as e:\n    print('exit', e.code)\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert f"Error: {error}" in result.stderr, result.stderr
    assert result.stdout.strip().splitlines()[-2:] == ["exit 1", "[]"], result.stdout + result.stderr
    assert not (tmp_path / "run").exists()


def test_plugins_list_json():
    result = rlx("plugins", "list", "--json")
    assert result.returncode == 0, result.stderr
    plugins = {p["name"]: p for p in json.loads(result.stdout)["plugins"]}
    assert plugins["rlx-sft"]["components"]["algorithms"] == ["sft"]
    assert "register_algorithms" in plugins["rlx-rm"]["hooks"]
    assert plugins["rlx"]["version"]


def test_algos_show_lists_every_key():
    result = rlx("algos", "show", "rm")
    assert result.returncode == 0, result.stderr
    assert "algorithm.preference_loss (str) = 'bradley_terry'" in result.stdout
    assert "training.lr (float) = 0.0005" in result.stdout  # the algorithm's own default
    assert "data.chosen_key" in result.stdout


def test_unknown_algorithm_names_installed_and_package():
    # every first-party algorithm is installed here: a host without kto stands in for a
    # machine that lacks rlx-kto
    from types import SimpleNamespace

    from rlx_cli import unknown_algorithm

    message = unknown_algorithm("kto", SimpleNamespace(algorithms={"sft": None, "rm": None}))
    assert "'kto' is not installed" in message and "rlx-kto" in message and "sft" in message
    result = rlx("train", "--algo", "nope")
    assert result.returncode == 2
    assert "'nope' is not installed" in result.stderr and "sft" in result.stderr and "kto" in result.stderr


def test_algos_show_marks_demo_settings():
    result = rlx("algos", "show", "dpo")
    assert result.returncode == 0, result.stderr
    assert "algorithm.beta (float) = 0.5 (demo; otherwise 0.1)" in result.stdout
    assert "builtin:arithmetic_small" in result.stdout


def test_train_prints_the_demo_settings_it_takes(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    result = rlx("train", "--algo", "dpo", "--model", tiny_model_dir, "--max-steps", "1", "--output", str(out),
                 "--set", "data.builtin_size=64", "--set", "data.eval_size=8", "--set", "training.batch_size=8",
                 "--set", "training.micro_batch_size=8", "--set", "logging.progress=false",
                 "--set", "logging.tensorboard=false", "--set", "checkpoint.save_final=false", timeout=300)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("demo settings"))
    assert line.startswith("demo settings (from dpo's defaults; set them to override): ")
    for setting in ("data.path=builtin:arithmetic_small", "data.chat_template=none", "training.lr=5e-05",
                    "training.scheduler=constant", "algorithm.beta=0.5"):
        assert setting in line, line
    for given in ("model.path", "training.max_steps", "training.batch_size"):  # the user's, not the demo's
        assert given not in line, line
    written = yaml.safe_load((out / "config.yaml").read_text())
    assert written["algorithm"]["beta"] == 0.5 and written["training"]["batch_size"] == 8


def test_own_data_without_a_model_asks_for_one(tmp_path):
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "3"}) + "\n")
    result = rlx("train", "--algo", "dpo", "--data", str(tmp_path / "pairs.jsonl"), "--output", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "your own data" in result.stderr and "--model" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_first_party_table_names_every_first_party_algorithm():
    # rlx_cli.FIRST_PARTY names the package of an algorithm that is not installed; here
    # every first-party plugin is installed, so the table must match the registry
    from pathlib import Path

    from rlx_cli import FIRST_PARTY
    from rlx.plugins import get_host

    root = Path(__file__).parent.parent
    first_party = {line.split('"')[1] for p in root.glob("plugins/*/*/pyproject.toml")
                   for line in p.read_text().splitlines() if line.startswith("name = ")}
    algorithms = get_host().algorithms
    installed = {name: algorithms.providers[name] for name in algorithms if algorithms.providers[name] in first_party}
    assert FIRST_PARTY == installed


def test_bad_config_key_fails_before_any_model_loads(tmp_path):
    result = rlx("train", "--algo", "sft", "--set", "training.lrr=1", "--output", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "training.lrr" in result.stderr and "'training.lr'" in result.stderr
    assert not (tmp_path / "run").exists()
