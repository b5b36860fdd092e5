"""The W1 GRPO step of this tree against another's, in one call (one GPU): each round runs
one ``rlx train`` arm of ``benchmarks/single_gpu.py`` (``grpo_mb32_lean`` unless told) from
either tree in a fresh process, the two trees taking turns, and the end prints each tree's
median step, rollout and update (steps after the first, over all rounds) and this tree's
over the other's.

    python benchmarks/step_ab.py --against REV_OR_TAR [--arm grpo_mb32_lean] [--rounds 2] [--steps 5] [--out DIR]

``--against`` is a git revision or a tar of a tree, as for ``decode_ab.py``. Each tree's own
``single_gpu.py`` runs with that tree first on ``PYTHONPATH``; its results go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_ab import extract  # noqa: E402
from local_overhead import ROOT, current_tree  # noqa: E402


def step(tree: Path, arm: str, steps: int, out: Path) -> dict[str, list[float]]:
    """One run of ``arm`` from ``tree``: its step, rollout and update times after the first step."""
    result = subprocess.run([sys.executable, str(tree / "benchmarks" / "single_gpu.py"), "--parts", arm,
                             "--steps", str(steps), "--out", str(out)], env=current_tree(tree),
                            cwd=tempfile.gettempdir(), capture_output=True, text=True)
    (out / "log.txt").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise SystemExit(f"{tree}'s single_gpu.py failed (exit {result.returncode}); its output: {out / 'log.txt'}")
    found = json.loads((out / "single_gpu.json").read_text())[f"rlx_{arm}"]
    return {k: found[f"{k}_s"][1:] for k in ("step", "rollout", "train")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--against", required=True)
    parser.add_argument("--arm", default="grpo_mb32_lean")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("step_ab"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this": ROOT, "other": extract(args.against, Path(tmp))}
        times = {name: {"step": [], "rollout": [], "train": []} for name in trees}
        for round_ in range(args.rounds):
            for name, tree in trees.items():
                out = args.out / f"{name}_{round_}"
                out.mkdir(parents=True, exist_ok=True)
                for k, v in step(tree, args.arm, args.steps, out).items():
                    times[name][k] += v
                print(f"round {round_} {name}: steps {[round(s, 3) for s in times[name]['step'][-(args.steps - 1):]]}",
                      flush=True)
    median = {name: {k: statistics.median(v) for k, v in parts.items()} for name, parts in times.items()}
    summary = {"against": args.against, "arm": args.arm, "times_s": times, "median_s": median,
               "this_over_other": {k: median["this"][k] / median["other"][k] for k in median["this"]}}
    (args.out / "step_ab.json").write_text(json.dumps(summary, indent=1))
    for k in ("step", "rollout", "train"):
        print(f"{k}: this {median['this'][k]:.3f} s, other {median['other'][k]:.3f} s, "
              f"this/other {summary['this_over_other'][k]:.3f}")


if __name__ == "__main__":
    main()
