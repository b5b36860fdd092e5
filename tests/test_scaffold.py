"""`rlx plugins new`: names and bad input. tests/test_plugin_guide.py installs one
distribution of each kind it writes and runs its generated tests."""

import pytest

from rlx.scaffold import names, new_plugin
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
    made = rlx("plugins", "new", "rlx-my_reward", "--kind", "reward", "--dir", str(tmp_path))
    assert made.returncode == 0 and "pip install -e" in made.stdout
    assert (tmp_path / "rlx-my-reward" / "src" / "rlx_my_reward" / "__init__.py").is_file()
