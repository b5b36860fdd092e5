"""`rlx plugins new` writes a distribution of each kind that installs, passes its own
generated tests (the contract suite) and shows in `rlx plugins list`."""

import json
import os
import subprocess
import sys

import pytest

from rlx.scaffold import KINDS, names, new_plugin
from test_cli import rlx


def test_names_and_bad_input(tmp_path):
    assert names("CISPO") == ("cispo", "rlx-cispo", "rlx_cispo")
    assert names("rlx-my-algo") == ("my_algo", "rlx-my-algo", "rlx_my_algo")
    with pytest.raises(ValueError, match="must start with a letter"):
        names("9lives")
    new_plugin("twice", "reward", tmp_path)
    with pytest.raises(FileExistsError, match="rlx-twice"):
        new_plugin("twice", "reward", tmp_path)
    bad = rlx("plugins", "new", "x", "--kind", "loss", "--dir", str(tmp_path))
    assert bad.returncode == 2 and "unknown plugin kind 'loss'; choose one of algorithm" in bad.stderr


def test_every_kind_installs_passes_its_tests_and_is_listed(tmp_path, tiny_model_dir):
    made = []
    for kind in KINDS:
        result = rlx("plugins", "new", f"new_{kind}", "--kind", kind, "--dir", str(tmp_path / "src"))
        assert result.returncode == 0, result.stderr
        made.append(tmp_path / "src" / names(f"new_{kind}")[1])
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(site), *map(str, made)], check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}

    tests = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                            *[str(folder / "tests") for folder in made]],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert tests.returncode == 0, tests.stdout[-3000:]
    assert "test_contract[algorithm:new_algorithm:trains] PASSED" in tests.stdout
    assert "test_contract[reward-function:new_reward] PASSED" in tests.stdout

    listed = json.loads(rlx("plugins", "list", "--json", env=env).stdout)
    plugins = {p["name"]: p for p in listed["plugins"]}
    assert listed["failed"] == []
    assert plugins["rlx-new-algorithm"]["components"] == {
        "algorithms": ["new_algorithm"], "advantage_estimators": ["new_algorithm_advantages"],
        "policy_losses": ["new_algorithm_loss"]}
    for kind in KINDS:
        assert plugins[names(f"new_{kind}")[1]]["version"] == "0.1.0"
