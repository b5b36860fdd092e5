"""Overlapped rollouts against the synchronous loop: the same GRPO run with and without
``rollout.overlap`` (both with the tis correction, so that only the overlap differs), in
alternating rounds in one call; prints each one's median step time and their ratio.

    python benchmarks/overlap.py [--workload w0|w1] [--launcher local|ray] [--partial-tokens N]
                                 [--rounds 2] [--steps 6] [--out DIR]

A step's time is what the driver waits for: the rollout (with overlap, only the part not
hidden behind the last step's training), the update and the weight sync. The first step
is warm-up and left out. W0 runs on the CPU, W1 on one GPU (see local_overhead.py for both
workloads). Locally the engine runs in a thread of the trainer's process; under
``--launcher ray`` the engine and the trainer are separate actors, each given one torch
thread (on W0's two cores: one core each), in both arms. ``--partial-tokens N`` adds a third
arm, overlapped with partial rollouts in segments of N tokens.
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
    parser.add_argument("--launcher", choices=["local", "ray"], default="local")
    parser.add_argument("--partial-tokens", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = parser.parse_args()
    arms = {"sync": [], "overlap": OVERLAP}
    if args.partial_tokens:
        arms["partial"] = OVERLAP + ["--set", f"rollout.partial_tokens={args.partial_tokens}"]
    launcher = ["--launcher", "ray", "--set", "training.threads=1"] if args.launcher == "ray" else []
    times: dict[str, list[float]] = {name: [] for name in arms}
    staleness: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "RLX_CACHE": str(tmp / "cache")}
        workload = (W0 if args.workload == "w0" else w1_files(tmp)) + CORRECTION + launcher
        for i in range(args.rounds):
            for name, extra in arms.items():
                rows = run([sys.executable, "-m", "rlx_cli"], workload + extra, env, tmp / f"{name}{i}", args.steps)
                times[name] += step_times(rows)
                staleness[name] = max([staleness.get(name, 0.0)] + [r.get("rollout/staleness", 0.0) for r in rows])
    medians = {name: statistics.median(t) for name, t in times.items()}
    result = {"workload": args.workload, "launcher": args.launcher, "cpus": os.cpu_count(),
              "partial_tokens": args.partial_tokens, "step_s": times, "median_step_s": medians,
              "sync_over": {name: medians["sync"] / m for name, m in medians.items() if name != "sync"},
              "max_staleness_seen": staleness}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"overlap_{args.workload}_{args.launcher}.json").write_text(json.dumps(result, indent=1))
    print(f"{args.workload} GRPO step ({args.launcher} launcher), median of {len(times['sync'])} steps each:")
    for name, t in times.items():
        ratio = f", synchronous/{name} {medians['sync'] / medians[name]:.2f}x" if name != "sync" else ""
        print(f"  {name}: {medians[name]:.3f} s (range {min(t):.3f}-{max(t):.3f} s, largest staleness "
              f"{staleness[name]:.2f}){ratio}")


if __name__ == "__main__":
    main()
