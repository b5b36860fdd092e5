"""The demo policy ``builtin:tiny-arithmetic``: the tiny model after a short, flawed SFT.

Online RL needs a policy that is sometimes right and has something to unlearn. rlx
makes one the first time it is asked for: its own SFT algorithm trains ``builtin:tiny``
on ``builtin:arithmetic_small`` demonstrations of which ``HEDGED`` end in a question
mark ("17?"), a systematic habit as in sloppy human data, which the exact-answer
reward counts as wrong. Greedy decoding then mostly hedges while sampling often gives
a clean answer: RL with an exact reward has a clear signal to learn from. The model is cached; the SFT run that made it, with its
data file, stays beside it (``.../tiny-arithmetic-run``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

TASK = "arithmetic_small"
HEDGED = 0.6
SFT_SETTINGS = {
    "model": {"path": "builtin:tiny"},
    "data": {"eval_size": 0, "chat_template": "none"},
    "training": {"max_steps": 800, "batch_size": 64, "micro_batch_size": 64, "lr": 3e-3, "warmup_steps": 30},
    "logging": {"tensorboard": False, "progress": False},
}


def sft_rows(n: int = 8000, seed: int = 0) -> list[dict]:
    from rlx.tasks import HEDGE, TASKS, sft_rows

    rng = random.Random(seed)
    rows = sft_rows(TASKS[TASK], n, seed=seed)
    for row in rows:
        if rng.random() < HEDGED:
            row["response"] += HEDGE
    return rows


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
    work.mkdir(parents=True)
    data = work / "sft.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in sft_rows()))
    print(f"making the demo policy {target} (a one-off SFT of builtin:tiny on {data})")
    settings = {**SFT_SETTINGS, "output": str(work / "run")}
    settings["data"] = {**settings["data"], "path": str(data)}
    import torch

    # one thread: the same demo policy on every machine (float sums depend on the thread
    # count), and no slowdown when something else runs on the same cores
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run(resolve(host.algorithms.get("sft"), settings), host)
    finally:
        torch.set_num_threads(threads)
    try:
        os.rename(work / "run" / "final", target)
    except OSError:
        if not (target / "config.json").is_file():  # a real failure, not a lost race
            raise
    shutil.rmtree(target.parent / f"{target.name}-run", ignore_errors=True)
    os.rename(work, target.parent / f"{target.name}-run")
    return target
