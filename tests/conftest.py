import os
import tempfile

import pytest

# Built-in models are made on first use into RLX_CACHE: keep them out of ~/.cache.
os.environ.setdefault("RLX_CACHE", tempfile.mkdtemp(prefix="rlx-test-cache-"))


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The built-in tiny Qwen2 model, built once per session in the test cache."""
    from rlx.tiny import builtin_model

    return builtin_model("builtin:tiny")


@pytest.fixture(scope="session")
def demo_policy():
    """builtin:tiny-arithmetic, the demo policy rlx makes with a short SFT (once per session)."""
    from rlx.tiny import builtin_model

    return builtin_model("builtin:tiny-arithmetic")
