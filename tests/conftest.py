import pytest

import rlx.testing  # noqa: F401  (points RLX_CACHE at a temporary folder: keep built models out of ~/.cache)


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The built-in tiny Qwen2 model, built once per session in the test cache."""
    from rlx.tiny import builtin_model

    return builtin_model("builtin:tiny")


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    """The native engine on the tiny model (CPU, float32), and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlx.rollout import NativeEngine

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return NativeEngine(model, tokenizer, device=torch.device("cpu")), tokenizer


@pytest.fixture(scope="session")
def demo_policy():
    """builtin:tiny-arithmetic, the demo policy rlx makes with a short SFT (once per session)."""
    from rlx.tiny import builtin_model

    return builtin_model("builtin:tiny-arithmetic")
