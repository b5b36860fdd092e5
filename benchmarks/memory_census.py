"""What holds GPU memory while W1 trains (one GPU): runs ``rlx train --algo grpo`` on W1 in
this process and, as each update after the first starts, sorts every live CUDA tensor by
owner (the policy's weights, its float32 masters, the optimizer's state, gradients, the
rollout engine's cache, anything else by shape) and reports what the allocator holds that no
Python object does (CUDA graph pools, the allocator's own). The trainer's own
``memory/*`` metrics give each step's rollout and update peaks beside it.

    python benchmarks/memory_census.py [--workload w1|w0] [--steps 3] [--out DIR] [-- extra rlx train args]
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_overhead import W0, w1_files  # noqa: E402

GIB = 2**30


def census(worker) -> dict:
    """Live CUDA tensors by owner, in GiB."""
    gc.collect()
    engine = worker.engine
    device = next(engine.model.parameters()).device
    seen: set[int] = set()
    owners: dict[str, float] = collections.Counter()

    def count(owner: str, tensors) -> None:
        for t in tensors:
            if t is None or t.device != device:
                continue
            key = t.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                owners[owner] += t.untyped_storage().nbytes() / GIB

    params = list(engine.model.parameters())
    count("weights", params)
    count("gradients", [p.grad for p in params])
    masters = getattr(engine, "_masters", [])
    count("float32 masters", masters)
    count("master gradients", [m.grad for m in masters])
    optimizer = getattr(engine, "optimizer", None)
    if optimizer is not None:
        count("optimizer state", [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)])
    rest: dict[tuple, list] = collections.defaultdict(lambda: [0, 0.0])
    for obj in gc.get_objects():
        try:  # compile's fake tensors live on too, with no storage to count
            if not torch.is_tensor(obj) or obj.device != device:
                continue
            key = obj.untyped_storage().data_ptr()
        except Exception:  # noqa: BLE001
            continue
        if key in seen:
            continue
        seen.add(key)
        group = rest[(str(obj.dtype), tuple(obj.shape))]
        group[0] += 1
        group[1] += obj.untyped_storage().nbytes() / GIB
    owners["other tensors"] = sum(g[1] for g in rest.values())
    allocated = torch.cuda.memory_allocated(device) / GIB if device.type == "cuda" else sum(owners.values())
    return {"allocated": allocated, **owners, "held by no Python tensor": allocated - sum(owners.values()),
            "largest other tensors": sorted(([*k, *v] for k, v in rest.items()), key=lambda r: -r[3])[:15]}


def profiled(fn, out: Path):
    """``fn()`` under the profiler: its wall time against the GPU's busy time, and the ops
    that take the most of each (written to ``update_trace.txt``)."""
    import time

    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        result = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - started
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events) / 1e6
    text = (f"update wall {wall:.3f} s, GPU kernels {busy:.3f} s\n\n"
            + events.table(sort_by="self_device_time_total" if busy else "self_cpu_time_total", row_limit=25)
            + "\n" + events.table(sort_by="self_cpu_time_total", row_limit=15))
    out.mkdir(parents=True, exist_ok=True)
    (out / "update_trace.txt").write_text(text)
    print(text.splitlines()[0], flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--profile-step", type=int, default=1, help="the update (from 0) to trace with the profiler")
    parser.add_argument("--workload", choices=["w0", "w1"], default="w1", help="w0: the CPU workload, to try the script")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    from rlx.workers.policy import PolicyWorker
    from rlx_cli import app

    found: list[dict] = []
    train_step = PolicyWorker.train_step

    def counted(self, *a, **k):
        found.append(census(self))
        print(json.dumps(found[-1]), flush=True)
        if len(found) != args.profile_step + 1:
            return train_step(self, *a, **k)
        return profiled(lambda: train_step(self, *a, **k), args.out)

    PolicyWorker.train_step = counted
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["RLX_CACHE"] = str(tmp / "cache")
        out = tmp / "run"
        workload = w1_files(tmp) + ["--set", "rollout.max_batch_size=512"] if args.workload == "w1" else W0
        argv = ["train", "--algo", "grpo", *workload, "--max-steps",
                str(args.steps), "--output", str(out), *extra]
        app(argv, standalone_mode=False)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    memory = [{k: v for k, v in r.items() if k.startswith("memory/") or k.startswith("time/")} for r in rows
              if "time/train" in r]
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"args": extra, "census_at_update_start": found, "metrics": memory}
    (args.out / "memory_census.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(memory, indent=1))


if __name__ == "__main__":
    main()
