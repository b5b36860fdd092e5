"""The learning tests' metrics over several seeds, beside the thresholds the tests assert.

Each learning test runs one configuration on the default seed (``training.seed`` 42) and
asserts a margin; this script runs the same configurations on other seeds too, so that
a threshold can sit below the worst seed seen rather than below one lucky run. One torch
thread, as in the tests. Results go to stdout and, as JSON lines, to ``--out``.

    python benchmarks/learning_seeds.py --out benchmarks/results/learning_seeds.jsonl
    python benchmarks/learning_seeds.py --summarize benchmarks/results/learning_seeds.jsonl
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


EXTRA: dict = {}  # --set overrides, to try other settings on every seed


def _run(algo: str, out: Path, settings: dict) -> list[dict]:
    from rlx.config import resolve, set_dotted
    from rlx.plugins import get_host
    from rlx.run import run
    from rlx.testing import QUIET

    tree: dict = {"output": str(out)}
    for key, value in {**QUIET, **settings, **EXTRA}.items():
        set_dotted(tree, key, value)
    host = get_host()
    run(resolve(host.algorithms.get(algo), tree), host)
    return _rows(out)


def grpo_demo(out, seed):
    """tests/test_online.py::test_grpo_demo_raises_greedy_accuracy (after − before ≥ 0.25)."""
    rows = _run("grpo", out, {"training.max_steps": 30, "training.seed": seed})
    return {"greedy_gain": rows[-1]["eval/greedy_accuracy"] - rows[0]["eval/greedy_accuracy"]}


def reward_gain(algo):
    def measure(out, seed):
        """tests/test_online.py::test_algorithm_improves_reward (mean reward of the last 8 of
        32 steps − of the first 4)."""
        rows = [r for r in _run(algo, out, {"training.max_steps": 32, "algorithm.eval_size": 16,
                                            "training.seed": seed}) if r["step"] > 0]
        first = sum(r["reward/mean"] for r in rows[:4]) / 4
        last = sum(r["reward/mean"] for r in rows[-8:]) / 8
        return {"reward_gain": last - first}
    return measure


def preference(algo):
    def measure(out, seed):
        """plugins/algorithms/<algo>/tests/test_<algo>_train.py: held-out preference accuracy,
        greedy exact-match, and the drop of number accuracy (hedge ignored)."""
        from rlx.tasks import HEDGE
        from rlx.testing import greedy_accuracy

        rows = _run(algo, out, {"data.eval_size": 128, "training.seed": seed})
        final = str(out / "final")
        start = greedy_accuracy("builtin:tiny-arithmetic", ignore=HEDGE)
        return {"eval_accuracy": [r["eval/accuracy"] for r in rows if "eval/accuracy" in r][-1],
                "greedy": greedy_accuracy(final),
                "number_drop": start - greedy_accuracy(final, ignore=HEDGE)}
    return measure


def sft(out, seed):
    """plugins/algorithms/sft/tests/test_sft.py::test_loss_falls_on_builtin_arithmetic
    (last/first loss < 0.6, last/first eval loss < 0.8)."""
    rows = _run("sft", out, {"model.path": "builtin:tiny", "data.path": "builtin:arithmetic",
                             "data.builtin_size": 400, "data.eval_size": 32, "training.max_steps": 16,
                             "training.eval_every": 4, "training.lr": 2e-3, "training.seed": seed})
    evals = [r["eval/loss"] for r in rows if "eval/loss" in r]
    return {"loss_ratio": rows[-1]["loss"] / rows[0]["loss"], "eval_loss_ratio": evals[-1] / evals[0]}


RUNS = {
    "grpo_demo": grpo_demo,
    **{f"reward/{a}": reward_gain(a) for a in ("ppo", "dr_grpo", "gspo", "reinforce_pp", "reinforce_pp_baseline",
                                               "reinforce_pp_baseline_no_std", "rloo")},
    **{a: preference(a) for a in ("dpo", "kto", "simpo", "orpo", "ipo", "hinge", "robust_dpo", "fdpo", "cpo_simpo",
                                  "kto_vanilla", "apo_zero_unpaired")},
    "sft": sft,
}


def summarize(path: Path) -> None:
    """min / median / max of every metric over the seeds, per run (and --set)."""
    groups: dict[tuple, list[dict]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        groups.setdefault((record["run"], " ".join(record.get("set", []))), []).append(record)
    for (name, overrides), records in groups.items():
        metrics = [k for k in records[0] if k not in ("run", "seed", "set", "seconds")]
        parts = []
        for key in metrics:
            values = sorted(r[key] for r in records)
            parts.append(f"{key} {values[0]:.3f} / {values[len(values) // 2]:.3f} / {values[-1]:.3f}")
        label = f"{name} ({overrides})" if overrides else name
        print(f"{label:32s} {len(records):2d} seeds  min / median / max: " + "; ".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    parser.add_argument("--only", nargs="*", default=None, help="names of RUNS to measure (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a setting in every run (to compare settings over the same seeds)")
    parser.add_argument("--summarize", type=Path, default=None, metavar="JSONL",
                        help="print min / median / max per run of a results file, and run nothing")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize)
        return
    from rlx.config import parse_override

    for item in args.overrides:
        key, value = parse_override(item)
        EXTRA[key] = value

    import torch

    torch.set_num_threads(1)
    names = args.only or list(RUNS)
    for name in names:
        for seed in args.seeds:
            started = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                values = RUNS[name](Path(tmp) / "run", seed)
            record = {"run": name, "seed": seed, **({"set": args.overrides} if args.overrides else {}), **values, "seconds": round(time.perf_counter() - started, 1)}
            print(json.dumps(record), flush=True)
            if args.out:
                with args.out.open("a") as f:
                    f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
