"""The plugin host: discovery through entry points, selection, and loud failures."""

import json
import os
import sys

import pytest

from fakedist import make_dist
from rlx.plugins import PluginError, build_host
from rlx.registry import RegistryError

EXAMPLE = '''
from rlx import AlgorithmSpec, hookimpl

@hookimpl
def register_algorithms(register):
    register("example_algo", AlgorithmSpec(name="example_algo", description="x", loop="offline"))
'''


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A directory on sys.path that fake distributions are written into."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("rlx_fake")]:
        del sys.modules[name]


def test_first_party_plugins_come_from_their_distributions():
    host = build_host()
    assert host.algorithms.providers["sft"] == "rlx-sft"
    assert host.algorithms.providers["rm"] == "rlx-rm"
    assert "arithmetic" in host.registry("register_tasks")
    assert "register_algorithms" in host.plugins["rlx-sft"].hooks
    assert host.plugins["rlx-rm"].components["preference_losses"] == ["bradley_terry", "log_exp"]


def test_plugin_found_only_through_its_entry_point(site):
    make_dist(site / "a", "rlx-fake-noentry", {"rlx_fake_a.py": EXAMPLE})
    sys.path.insert(0, str(site / "a"))
    assert "example_algo" not in build_host().algorithms  # importable, but no entry point
    make_dist(site / "b", "rlx-fake-example", {"rlx_fake_b.py": EXAMPLE}, {"example": "rlx_fake_b"})
    sys.path.insert(0, str(site / "b"))
    host = build_host()
    assert host.algorithms.providers["example_algo"] == "rlx-fake-example"
    assert host.plugins["rlx-fake-example"].version == "0.1.0"


def test_duplicate_name_is_unusable_and_names_both_distributions(site, monkeypatch):
    make_dist(site, "rlx-fake-one", {"rlx_fake_one.py": EXAMPLE}, {"one": "rlx_fake_one"})
    make_dist(site, "rlx-fake-two", {"rlx_fake_two.py": EXAMPLE}, {"two": "rlx_fake_two"})
    host = build_host()
    assert "sft" in host.algorithms and "example_algo" not in host.algorithms
    with pytest.raises(RegistryError) as err:
        host.algorithms.get("example_algo")
    assert "rlx-fake-one" in str(err.value) and "rlx-fake-two" in str(err.value)
    assert "RLX_DISABLE_PLUGINS" in str(err.value)
    assert "example_algo" in host.failures["rlx-fake-one"] and "example_algo" in host.failures["rlx-fake-two"]

    monkeypatch.setenv("RLX_DISABLE_PLUGINS", "rlx-fake-two")
    assert build_host().algorithms.providers["example_algo"] == "rlx-fake-one"


def test_broken_plugin_is_reported_and_others_load(site):
    make_dist(site, "rlx-fake-broken", {"rlx_fake_broken.py": "import not_a_module_anywhere\n"},
              {"broken": "rlx_fake_broken"})
    host = build_host()
    assert "rlx-fake-broken" in host.failures
    assert "not_a_module_anywhere" in host.failures["rlx-fake-broken"]
    assert "sft" in host.algorithms


BROKEN = {
    "unknown hook": ("from rlx import hookimpl\n@hookimpl\ndef register_algorithm(register):\n    pass\n",
                     "unknown hook 'register_algorithm'. Did you mean 'register_algorithms'?"),
    "misspelt argument": ("from rlx import hookimpl\n@hookimpl\ndef register_algorithms(registr):\n    pass\n",
                          "takes 'registr', which the hook does not pass; it passes (register). Did you mean 'register'?"),
    "no hookimpl": ("def register_algorithms(register):\n    pass\n",
                    "defines register_algorithms without @hookimpl"),
    "raises": (EXAMPLE + "\n@hookimpl\ndef register_policy_losses(register):\n    raise KeyError('cfg')\n",
               "register_policy_losses raised KeyError: 'cfg'"),
    "online spec without config": (EXAMPLE.replace('loop="offline"', 'loop="online", estimator="group_norm", '
                                                   'policy_loss="ppo_clip"'), "an online algorithm needs config="),
    "bad name": ("from rlx import hookimpl\n@hookimpl\ndef register_samplers(register):\n    register(3, None)\n",
                 "a component name must be a non-empty string, got 3"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_plugin_is_left_out_with_its_reason(site, monkeypatch, case):
    source, reason = BROKEN[case]
    make_dist(site, "rlx-fake-bad", {"rlx_fake_bad.py": source}, {"bad": "rlx_fake_bad"})
    host = build_host()
    assert reason in host.failures["rlx-fake-bad"]
    assert "rlx-fake-bad" not in host.plugins and "example_algo" not in host.algorithms  # nothing of it half-loaded
    assert "grpo" in host.algorithms and host.plugins["rlx-grpo"].components
    with pytest.raises(RegistryError, match="rlx-fake-bad .* failed to load"):
        host.algorithms.get("example_algo")
    monkeypatch.setenv("RLX_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match="rlx-fake-bad: "):
        build_host()


def test_cli_keeps_working_and_names_the_broken_package(site):
    from test_cli import rlx

    make_dist(site, "rlx-fake-algo", {"rlx_fake_algo.py": "import not_a_module_anywhere\n"},
              {"fake_algo": "rlx_fake_algo"})
    make_dist(site, "rlx-fake-cmd", {"rlx_fake_cmd.py": "from rlx import hookimpl\n@hookimpl\n"
                                                       "def register_commands(app):\n    raise OSError('no tty')\n"},
              {"cmd": "rlx_fake_cmd"})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    listed = rlx("plugins", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "plugin rlx-fake-cmd failed in register_commands: OSError: no tty" in listed.stderr
    assert listed.stderr.count("rlx-fake-algo") == 1 and "not_a_module_anywhere" in listed.stderr
    assert json.loads(listed.stdout)["failed"] == [{"name": "rlx-fake-algo", "error": "failed to import rlx_fake_algo: "
                                                    "ModuleNotFoundError: No module named 'not_a_module_anywhere'"}]
    assert rlx("algos", "show", "grpo", env=env).returncode == 0
    train = rlx("train", "--algo", "fake_algo", env=env)
    assert train.returncode == 2 and "rlx-fake-algo is installed but failed to load" in train.stderr
    strict = rlx("algos", "list", env={**env, "RLX_STRICT_PLUGINS": "1"})
    assert strict.returncode == 2 and "RLX_STRICT_PLUGINS" in strict.stderr


def test_load_and_disable_selection(monkeypatch):
    monkeypatch.setenv("RLX_LOAD_PLUGINS", "rlx-sft")
    host = build_host()
    assert "sft" in host.algorithms and "rm" not in host.algorithms
    monkeypatch.delenv("RLX_LOAD_PLUGINS")
    monkeypatch.setenv("RLX_DISABLE_PLUGINS", "rlx-sft")
    host = build_host()
    assert "sft" not in host.algorithms and "rm" in host.algorithms


def test_local_plugin_module_attr(site):
    (site / "rlx_fake_local.py").write_text(EXAMPLE.replace("example_algo", "local_algo")
                                            + "\nclass Plugin:\n    pass\n")
    host = build_host(["rlx_fake_local"])
    assert host.algorithms.providers["local_algo"] == "rlx_fake_local"
    with pytest.raises(PluginError, match="has no attribute"):
        build_host(["rlx_fake_local:missing"])
    with pytest.raises(PluginError, match="failed to import"):
        build_host(["rlx_fake_nowhere:plugin"])


def test_local_plugin_from_file(tmp_path):
    path = tmp_path / "myplugin.py"
    path.write_text(EXAMPLE.replace("example_algo", "file_algo"))
    host = build_host([f"{path}"])
    assert "file_algo" in host.algorithms
