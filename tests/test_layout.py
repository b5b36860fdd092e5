"""The repository layout the design fixes."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).parent.parent
PLUGINS = sorted(p.parent for p in ROOT.glob("plugins/*/*/pyproject.toml"))


def test_requirements_install_every_plugin():
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    editable = {line.split(None, 1)[1] for line in lines if line.startswith("-e ") and line != "-e ."}
    dirs = {str(p.relative_to(ROOT)) for p in ROOT.glob("plugins/*/*") if p.is_dir()}
    assert editable == dirs
    assert "-e ." in lines


def test_each_plugin_is_its_own_distribution():
    assert PLUGINS
    for plugin in PLUGINS:
        meta = tomllib.loads((plugin / "pyproject.toml").read_text())
        project = meta["project"]
        assert project["name"].startswith("rlx-"), plugin
        assert "rlx" in project["dependencies"], plugin
        assert meta["project"]["entry-points"]["rlx"], plugin
        assert list((plugin / "src").glob("rlx_*/__init__.py")), plugin


def test_plugins_do_not_reach_into_siblings():
    for plugin in PLUGINS:
        own = {p.name for p in (plugin / "src").glob("rlx_*")}
        for source in plugin.rglob("*.py"):
            imported = set(re.findall(r"^\s*(?:from|import)\s+(rlx_\w+)", source.read_text(), re.M))
            assert imported <= own, f"{source} imports a sibling plugin: {imported - own}"


def test_readme_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    commands = re.findall(r"```(?:\w+)?\n(.*?)```", text, re.S)[0].strip().splitlines()
    assert commands == ["pip install -r requirements.txt && rlx train --algo grpo",
                        "pip install -r requirements-dev.txt && pip uninstall -y torchvision torchaudio torchcodec && python -m pytest"]
    assert "pip install -r requirements-dev.txt && pip uninstall -y torchvision torchaudio torchcodec && python -m pytest" in (ROOT / ".ci" / "run").read_text()


def test_folders_are_named_as_their_imports():
    # core/rlx/ is `import rlx`, cli/rlx_cli/ is `import rlx_cli`: no package-dir remapping
    import rlx
    import rlx_cli

    assert Path(rlx.__file__).parent == ROOT / "core" / "rlx"
    assert Path(rlx_cli.__file__).parent == ROOT / "cli" / "rlx_cli"
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text()).get("tool", {}).get("setuptools", {})
    assert "package-dir" not in setuptools


def test_the_loops_and_loaders_do_not_import_the_demo_or_the_run():
    # run -> loops -> engine -> models must not lead back to run (through tiny -> demo)
    import subprocess
    import sys

    code = ("import sys, rlx.online, rlx.offline, rlx.engine, rlx.models, rlx.rollout\n"
            "print(sorted(m for m in ('rlx.run', 'rlx.tiny', 'rlx.demo') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
