"""Overlapped rollouts against the synchronous loop: the same GRPO run with and without
``rollout.overlap`` (both with the tis correction, so that only the overlap differs), in
alternating rounds in one call; prints each one's median step time and their ratio.

    python benchmarks/overlap.py [--workload w0|w1] [--rounds 2] [--steps 6] [--out DIR]

A step's time is what the driver waits for: the rollout (with overlap, only the part not
hidden behind the last step's training), the update and the weight sync. The first step
is warm-up and left out. W0 runs on the CPU (the engine and the trainer each take one of
the cores), W1 on one GPU (see local_overhead.py for both workloads).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from local_overhead import W0, run, w1_files  # noqa: E402

CORRECTION = ["--set", "algorithm.off_policy_correction=tis"]
OVERLAP = ["--set", "rollout.overlap=true"]


def step_times(rows: list[dict]) -> list[float]:
    return [r["time/rollout_wait"] + r["time/train"] + r["time/sync"] for r in rows[1:]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", choices=["w0", "w1"], default="w0")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = parser.parse_args()
    times: dict[str, list[float]] = {"sync": [], "overlap": []}
    staleness: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "RLX_CACHE": str(tmp / "cache")}
        workload = (W0 if args.workload == "w0" else w1_files(tmp)) + CORRECTION
        for i in range(args.rounds):
            for name, extra in (("sync", []), ("overlap", OVERLAP)):
                rows = run([sys.executable, "-m", "rlx_cli"], workload + extra, env, tmp / f"{name}{i}", args.steps)
                times[name] += step_times(rows)
                if name == "overlap":
                    staleness += [r["rollout/staleness"] for r in rows]
    sync, overlap = statistics.median(times["sync"]), statistics.median(times["overlap"])
    result = {"workload": args.workload, "cpus": os.cpu_count(), "sync_step_s": times["sync"],
              "overlap_step_s": times["overlap"], "median_sync_s": sync, "median_overlap_s": overlap,
              "ratio": sync / overlap, "max_staleness_seen": max(staleness)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"overlap_{args.workload}.json").write_text(json.dumps(result, indent=1))
    print(f"{args.workload} GRPO step, median of {len(times['sync'])} steps each: synchronous {sync:.3f} s, "
          f"overlapped {overlap:.3f} s; synchronous/overlapped {sync / overlap:.2f}x "
          f"(largest staleness {max(staleness):.0f})")
    print(f"ranges: synchronous {min(times['sync']):.3f}-{max(times['sync']):.3f} s, "
          f"overlapped {min(times['overlap']):.3f}-{max(times['overlap']):.3f} s")


if __name__ == "__main__":
    main()
