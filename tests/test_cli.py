"""The command line, run as a user runs it."""

import json
import subprocess
import sys

import pytest


def rlx(*args, **kw):
    return subprocess.run([sys.executable, "-m", "rlx.cli", *args], capture_output=True, text=True, timeout=120, **kw)


HEAVY = ("torch", "transformers", "ray", "vllm", "deepspeed", "datasets")


@pytest.mark.parametrize("argv", [[], ["--help"], ["plugins", "list"], ["algos", "list"]])
def test_light_commands_import_nothing_heavy(argv):
    code = (
        "import sys\n"
        f"sys.argv = ['rlx', *{argv!r}]\n"
        "import rlx, rlx.cli\n"
        "try:\n    rlx.cli.main()\nexcept SystemExit:\n    pass\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout + result.stderr


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

    from rlx.cli import unknown_algorithm

    message = unknown_algorithm("kto", SimpleNamespace(algorithms={"sft": None, "rm": None}))
    assert "'kto' is not installed" in message and "rlx-kto" in message and "sft" in message
    result = rlx("train", "--algo", "nope")
    assert result.returncode == 2
    assert "'nope' is not installed" in result.stderr and "sft" in result.stderr and "kto" in result.stderr


def test_bad_config_key_fails_before_any_model_loads(tmp_path):
    result = rlx("train", "--algo", "sft", "--set", "training.lrr=1", "--output", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "training.lrr" in result.stderr and "'training.lr'" in result.stderr
    assert not (tmp_path / "run").exists()
