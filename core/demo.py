"""The demo policy ``builtin:tiny-arithmetic``: the tiny model after a short SFT.

Online RL needs a policy that is sometimes right. rlx makes one the first time it is
asked for, with its own SFT algorithm on ``builtin:arithmetic``, and caches it; the run
that made it stays beside it (``.../tiny-arithmetic-run``) for anyone who wants to see
how.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# Sized so the model lands part-way (greedy accuracy well under its pass@k), leaving
# room for RL to show a gain within minutes on two CPU cores.
SFT_SETTINGS = {
    "model": {"path": "builtin:tiny"},
    "data": {"path": "builtin:arithmetic", "builtin_size": 20000, "eval_size": 256},
    "training": {"max_steps": 600, "batch_size": 64, "micro_batch_size": 64, "lr": 3e-3, "warmup_steps": 30,
                 "packing": True},
    "logging": {"tensorboard": False},
}


def tiny_arithmetic(target: Path) -> Path:
    """Build the demo policy into ``target`` (atomically) unless it is there already."""
    if (target / "config.json").is_file():
        return target
    from rlx.config import resolve
    from rlx.plugins import get_host
    from rlx.run import RunError, run

    host = get_host()
    if "sft" not in host.algorithms:
        raise RunError("builtin:tiny-arithmetic is made by SFT, which is not installed: "
                       "pip install -e plugins/algorithms/sft")
    work = target.parent / f".{target.name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    print(f"making the demo policy {target} (a one-off SFT of builtin:tiny on builtin:arithmetic)")
    run(resolve(host.algorithms.get("sft"), {**SFT_SETTINGS, "output": str(work)}), host)
    try:
        os.rename(work / "final", target)
    except OSError:
        if not (target / "config.json").is_file():  # a real failure, not a lost race
            raise
    shutil.rmtree(target.parent / f"{target.name}-run", ignore_errors=True)
    os.rename(work, target.parent / f"{target.name}-run")
    return target
