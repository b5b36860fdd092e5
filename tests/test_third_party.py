"""A third-party plugin, installed the way pip would leave it, trains through the CLI.

The example distribution lives in tests/fixtures/rlx-example/ (its own pyproject.toml
with an ``[project.entry-points.rlx]`` table and a src/ package). "Installing" it here
writes its package and a dist-info folder (METADATA, entry_points.txt) into a temporary
folder on PYTHONPATH: exactly what importlib.metadata reads for an installed wheel.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from e2e import metrics, one_thread, rlx  # noqa: F401 (one_thread: autouse)
from fakedist import make_dist

FIXTURE = Path(__file__).parent / "fixtures" / "rlx-example"
QUIET = ["--set", "logging.progress=false", "--set", "logging.tensorboard=false"]


def _project() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((FIXTURE / "pyproject.toml").read_text())["project"]


def _env(*paths: Path) -> dict:
    return {"PYTHONPATH": os.pathsep.join(filter(None, [*map(str, paths), os.environ.get("PYTHONPATH")]))}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The example plugin with its dist-info, as ``pip install tests/fixtures/rlx-example`` leaves it."""
    project = _project()
    package = FIXTURE / "src" / "rlx_example"
    modules = {f"rlx_example/{p.name}": p.read_text() for p in package.glob("*.py")}
    return make_dist(tmp_path_factory.mktemp("site"), project["name"], modules,
                     project["entry-points"]["rlx"], version=project["version"])


@pytest.fixture(scope="module")
def source_only(tmp_path_factory) -> Path:
    """The same package importable from PYTHONPATH but with no distribution metadata."""
    root = tmp_path_factory.mktemp("bare")
    shutil.copytree(FIXTURE / "src" / "rlx_example", root / "rlx_example")
    return root


def test_the_fixture_is_a_real_plugin_project():
    project = _project()
    assert project["name"] == "rlx-example" and "rlx" in project["dependencies"]
    assert project["entry-points"]["rlx"] == {"example": "rlx_example"}
    assert (FIXTURE / "src" / "rlx_example" / "__init__.py").is_file()


def test_algos_list_shows_it_only_through_its_entry_point(installed, source_only):
    listed = rlx("algos", "list", env=_env(installed))
    assert listed.returncode == 0, listed.stderr
    line = next(line for line in listed.stdout.splitlines() if line.startswith("sft_short"))
    assert "offline" in line and "[rlx-example]" in line
    assert "sft " in listed.stdout  # the first-party algorithms are still there

    bare = rlx("algos", "list", env=_env(source_only))
    assert bare.returncode == 0, bare.stderr
    assert "import rlx_example" not in bare.stderr
    assert "sft_short" not in bare.stdout and "sft " in bare.stdout

    plugins = rlx("plugins", "list", "--json", env=_env(installed))
    example = {p["name"]: p for p in json.loads(plugins.stdout)["plugins"]}["rlx-example"]
    assert example["version"] == "0.3.0"
    assert example["components"] == {"algorithms": ["sft_short"], "tasks": ["reverse"]}


def test_installed_plugin_trains_through_the_cli(installed, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    result = rlx("train", "--algo", "sft_short", "--model", tiny_model_dir, "--max-steps", "2",
                 "--output", str(out), *QUIET, env=_env(installed))
    assert result.returncode == 0, result.stderr
    assert [r["step"] for r in metrics(out)] == [1, 2]
    written = yaml.safe_load((out / "config.yaml").read_text())
    assert written["algo"] == "sft_short"
    assert written["data"]["path"] == "builtin:reverse"  # the plugin's task, through its defaults
    assert written["training"]["batch_size"] == 4 and written["training"]["scheduler"] == "constant"
    assert (out / "final" / "model.safetensors").is_file() and (out / "final" / "tokenizer.json").is_file()

    # without the distribution the algorithm is unknown, and the message says how plugins come in
    missing = rlx("train", "--algo", "sft_short", "--output", str(tmp_path / "other"))
    assert missing.returncode == 2 and "'sft_short' is not installed" in missing.stderr
    assert "entry points" in missing.stderr


LOCAL = '''
from rlx import AlgorithmSpec, hookimpl


class LocalAlgorithms:
    @hookimpl
    def register_algorithms(self, register):
        register("sft_local", AlgorithmSpec(
            name="sft_local", description="a lab's own SFT variant", loop="offline", data="sft",
            defaults={"training.batch_size": 4, "training.micro_batch_size": 4, "data.builtin_size": 48,
                      "data.eval_size": 4}))


plugin = LocalAlgorithms()
'''


def test_local_plugin_module_attr_trains(tiny_model_dir, tmp_path):
    (tmp_path / "lab_plugins.py").write_text(LOCAL)
    out = tmp_path / "run"

    def train(output, *more):
        return rlx("train", "--algo", "sft_local", "--model", tiny_model_dir, "--max-steps", "2",
                   "--output", str(output), *QUIET, *more, cwd=tmp_path)

    unknown = train(out)
    assert unknown.returncode == 2 and "'sft_local' is not installed" in unknown.stderr
    assert not out.exists()

    result = train(out, "--plugin", "lab_plugins:plugin")
    assert result.returncode == 0, result.stderr
    assert [r["step"] for r in metrics(out)] == [1, 2]
    written = yaml.safe_load((out / "config.yaml").read_text())
    assert written["plugins"] == ["lab_plugins:plugin"] and written["training"]["batch_size"] == 4
    assert (out / "final" / "config.json").is_file()

    bad = train(tmp_path / "bad", "--plugin", "lab_plugins:nothing")
    assert bad.returncode == 2 and "lab_plugins:nothing" in bad.stderr and "has no attribute" in bad.stderr
