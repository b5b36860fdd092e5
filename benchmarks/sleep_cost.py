"""What ``rollout.sleep`` costs a W1 rollout (one GPU): the native engine's ``generate``
over W1's 64 prompts × 8 samples × 512 tokens, awake (cache and graphs kept from the call
before) against after ``sleep`` and ``wake``, calls alternating; and, in the asleep calls,
the time of the parts around the decode steps, each timed with the device synchronized
around it. Asleep, the cache's memory goes back to the device; where its addresses can be
kept (``rlx.engines.remap``) the decode graph stays, else the cache is allocated and the
graph captured again, as ``--no-remap`` makes it.

    python benchmarks/sleep_cost.py [--calls 4] [--no-remap] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_overhead import w1_engine  # noqa: E402
from timing import time_method  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--no-remap", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    from rlx.engines.remap import Remappable
    from rlx.engines.static_decode import StaticDecoder
    from rlx.rollout import NativeEngine

    engine, prompts, params = w1_engine()
    engine.static.remappable &= not args.no_remap

    parts: dict[str, list[float]] = defaultdict(list)
    timing = [False]

    def timed(cls, name, label):
        time_method(cls, name, parts[label].append, sync=torch.cuda.synchronize, when=lambda: timing[0])

    timed(NativeEngine, "_prefill", "prefill")
    timed(NativeEngine, "_completions", "completions (texts)")
    timed(StaticDecoder, "_allocate", "allocate cache")
    timed(StaticDecoder, "_refresh_projections", "stack projections")
    timed(StaticDecoder, "_capture", "warm-up and capture")
    timed(Remappable, "map", "memory mapped again (remap)")
    timed(Remappable, "unmap", "memory handed back (remap)")

    samples = []

    def call() -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        samples.append([c.token_ids for c in engine.generate(prompts, params)])
        torch.cuda.synchronize()
        return time.perf_counter() - start

    def churn():  # what an update leaves behind: blocks allocated and freed, then handed back
        blocks = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(16)]
        del blocks

    call()  # compiles and captures
    awake, asleep, timed_asleep = [], [], []
    for _ in range(args.calls):
        awake.append(call())
        engine.sleep()
        churn()
        engine.wake()
        asleep.append(call())
    timing[0] = True
    for _ in range(2):
        engine.sleep()
        churn()
        engine.wake()
        timed_asleep.append(call())
    result = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "graphs_kept_asleep": engine.static.remappable,
        "same_samples_every_call": all(s == samples[0] for s in samples),  # one seed throughout
        "awake_s": awake, "asleep_s": asleep, "asleep_parts_timed_s": timed_asleep,
        "awake_median_s": statistics.median(awake), "asleep_median_s": statistics.median(asleep),
        "parts_median_ms": {k: 1000 * statistics.median(v) for k, v in parts.items()},
    }
    print(f"awake {result['awake_median_s']:.3f} s, asleep {result['asleep_median_s']:.3f} s "
          f"(difference {1000 * (result['asleep_median_s'] - result['awake_median_s']):.1f} ms); graphs kept "
          f"asleep: {result['graphs_kept_asleep']}; the same samples every call: {result['same_samples_every_call']}")
    for k, v in result["parts_median_ms"].items():
        print(f"  {k}: {v:.1f} ms")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
