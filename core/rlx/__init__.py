"""rlx: a plugin-based RLHF research platform.

Importing rlx is cheap: torch, transformers, ray, vllm and deepspeed load only in the
modules that train or generate.
"""

from rlx.algorithm import AlgorithmSpec
from rlx.hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["AlgorithmSpec", "hookimpl", "__version__"]
