"""The W1 decode step of this tree against another's, in one call (one GPU): each round runs
``benchmarks/decode_profile.py`` of either tree in a fresh process, the two trees taking
turns, and the end prints each span's step time (the median over rounds) and this tree's
over the other's.

    python benchmarks/decode_ab.py --against REV_OR_TAR [--rounds 2] [--out FILE]

``--against`` is a git revision of this repository or a tar of a tree with its ``core``,
``cli``, ``plugins`` and ``benchmarks`` (``git archive -o other.tar REV core cli plugins
benchmarks``: the device machine has no git history). Each tree's own ``decode_profile.py``
runs with that tree first on ``PYTHONPATH``; the profiles' kernel tables are kept in
``--out``'s folder.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_overhead import ROOT, archive, current_tree  # noqa: E402

SPAN = re.compile(r"^span (\d+): ([\d.]+) ms per step$", re.M)


def extract(against: str, into: Path) -> Path:
    """The other tree: ``against``'s tar extracted, or its revision's files."""
    tree = into / "other"
    if not Path(against).is_file():
        return archive(against, tree, "core", "cli", "plugins", "benchmarks")
    tree.mkdir()
    with tarfile.open(against) as tar:
        tar.extractall(tree, filter="data")
    return tree


def profile(tree: Path, log: Path) -> dict[int, float]:
    """One run of ``tree``'s decode_profile.py: its step time at each span, in ms."""
    result = subprocess.run([sys.executable, str(tree / "benchmarks" / "decode_profile.py")], env=current_tree(tree),
                            cwd=tempfile.gettempdir(), capture_output=True, text=True)
    log.write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise SystemExit(f"{tree}'s decode_profile.py failed (exit {result.returncode}); its output: {log}")
    return {int(span): float(ms) for span, ms in SPAN.findall(result.stdout)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--against", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("decode_ab.json"))
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this": ROOT, "other": extract(args.against, Path(tmp))}
        times: dict[str, list[dict[int, float]]] = {name: [] for name in trees}
        for round_ in range(args.rounds):
            for name, tree in trees.items():
                times[name].append(profile(tree, args.out.parent / f"decode_ab_{name}_{round_}.txt"))
                print(f"round {round_} {name}: {times[name][-1]}", flush=True)
    spans = sorted(times["this"][0])
    median = {name: {s: statistics.median(run[s] for run in runs) for s in spans} for name, runs in times.items()}
    summary = {"against": args.against, "rounds": times, "median_ms": median,
               "this_over_other": {s: median["this"][s] / median["other"][s] for s in spans}}
    args.out.write_text(json.dumps(summary, indent=1))
    for s in spans:
        print(f"span {s}: this {median['this'][s]:.3f} ms, other {median['other'][s]:.3f} ms, "
              f"this/other {summary['this_over_other'][s]:.3f}")


if __name__ == "__main__":
    main()
