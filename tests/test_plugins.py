"""The plugin host: discovery through entry points, selection, and loud failures."""

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


def test_duplicate_names_fail_naming_both_distributions(site):
    make_dist(site, "rlx-fake-one", {"rlx_fake_one.py": EXAMPLE}, {"one": "rlx_fake_one"})
    make_dist(site, "rlx-fake-two", {"rlx_fake_two.py": EXAMPLE}, {"two": "rlx_fake_two"})
    with pytest.raises(RegistryError) as err:
        build_host()
    assert "rlx-fake-one" in str(err.value) and "rlx-fake-two" in str(err.value)
    assert "example_algo" in str(err.value)


def test_broken_plugin_is_reported_and_others_load(site):
    make_dist(site, "rlx-fake-broken", {"rlx_fake_broken.py": "import not_a_module_anywhere\n"},
              {"broken": "rlx_fake_broken"})
    host = build_host()
    assert "rlx-fake-broken" in host.failures
    assert "not_a_module_anywhere" in host.failures["rlx-fake-broken"]
    assert "sft" in host.algorithms


def test_misspelt_hook_fails_loudly(site):
    source = "from rlx import hookimpl\n@hookimpl\ndef register_algorithm(register):\n    pass\n"
    make_dist(site, "rlx-fake-typo", {"rlx_fake_typo.py": source}, {"typo": "rlx_fake_typo"})
    with pytest.raises(PluginError, match="rlx-fake-typo"):
        build_host()


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
