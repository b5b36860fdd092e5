import os

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The built-in tiny Qwen2 model, built once per session in a private cache."""
    os.environ["RLX_CACHE"] = str(tmp_path_factory.mktemp("rlx-cache"))
    from rlx.tiny import builtin_model

    return builtin_model("builtin:tiny")
