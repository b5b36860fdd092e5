"""The time each role worker's coarse methods take in an ``rlx train`` run on the local
launcher: per method, the median of its calls after the first (evaluation's rollouts count
too: set ``algorithm.eval_size=0`` to time the steps' alone).

    python benchmarks/worker_times.py train --algo ppo [rlx train's options...]

Runs ``rlx`` in this process with the workers' methods wrapped in timers; the run's own
output and files are as without them.
"""

from __future__ import annotations

import collections
import statistics
import sys

from rlx.host_memory import huge_pages_for_large_tensors
from timing import time_method

TIMES: dict[str, list[float]] = collections.defaultdict(list)


if __name__ == "__main__":
    huge_pages_for_large_tensors()  # as the rlx command does, before torch is imported
    from rlx.workers.critic import CriticWorker
    from rlx.workers.policy import PolicyWorker
    from rlx.workers.reference import ReferenceWorker
    from rlx.workers.reward import RewardWorker
    from rlx.workers.rollout import RolloutWorker

    for cls in (CriticWorker, PolicyWorker, ReferenceWorker, RewardWorker, RolloutWorker):
        for name in ("generate", "logprobs", "values", "train_step", "score"):
            if name in vars(cls):
                time_method(cls, name, TIMES[f"{cls.__name__}.{name}"].append)
    from rlx_cli import main

    sys.argv = ["rlx", *sys.argv[1:]]
    try:
        main()
    finally:
        for key, times in TIMES.items():
            if times:  # a method the run never called has none
                print(f"{key}: {statistics.median(times[1:] or times):.3f} s (median of {len(times[1:] or times)})")
