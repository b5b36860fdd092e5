"""Where the GPU idles in one training step: a local plugin that runs torch's profiler over
the whole of step ``RLX_TIMELINE_STEP`` (default 3), marks its parts (the rollout worker's
``generate``, the policy's ``train_step``, the rest of the driver) and reports, for each
part, its wall time, the GPU's busy time and the gaps between kernels, and for the gaps
the rlx line the host was running while the GPU waited.

    PYTHONPATH=benchmarks rlx train ... --plugin step_timeline:plugin [RLX_TIMELINE_OUT=FILE]

The parts are marked by wrapping ``RolloutWorker.generate`` and ``PolicyWorker.train_step``
when the plugin loads. The profiler's Python stacks slow the host, so the gaps read long;
their ranking by line is what this is for.
"""

from __future__ import annotations

import bisect
import os
from collections import defaultdict

import pluggy
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from rlx.workers.policy import PolicyWorker
from rlx.workers.rollout import RolloutWorker

hookimpl = pluggy.HookimplMarker("rlx")
GAP_US = 20  # shorter gaps are launch latency, not waiting
LONG_US = 300  # gaps listed one by one


def _marked(cls, name: str, part: str) -> None:
    method = getattr(cls, name)

    def marked(self, *args, **kwargs):
        with record_function(f"part:{part}"):
            return method(self, *args, **kwargs)

    setattr(cls, name, marked)


_marked(RolloutWorker, "generate", "rollout")
_marked(PolicyWorker, "train_step", "update")


def _rlx_line(event) -> str:
    """The innermost rlx frame of a CPU op's Python stack, else its name."""
    for frame in event.stack or []:
        if "/rlx/" in frame or "/rlx_" in frame:
            return frame.split("site-packages/")[-1]
    return event.name


def report(prof) -> str:
    events = prof.events()
    wall_start_us = min(e.time_range.start for e in events)
    cpu = torch.autograd.DeviceType.CPU
    # the parts' marks show on the GPU's timeline too, as spans over all their kernels
    kernels = sorted((e.time_range.start, e.time_range.end) for e in events
                     if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith("part:"))
    parts = [(e.time_range.start, e.time_range.end, e.name[5:]) for e in events
             if e.name.startswith("part:") and e.device_type == cpu]
    ops = [e for e in events if e.device_type == cpu and not e.name.startswith("part:")]
    step_end = max([k[1] for k in kernels] + [e.time_range.end for e in events if e.device_type == cpu])
    # merged busy intervals, and the gaps between them
    busy, gaps = [], []
    for start, end in kernels:
        if busy and start <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], end)
        else:
            if busy and start - busy[-1][1] > GAP_US:
                gaps.append((busy[-1][1], start))
            busy.append([start, end])

    def part_of(t: float) -> str:
        for start, end, name in parts:
            if start <= t < end:
                return name
        return "driver"

    lines = [f"step wall {(step_end - wall_start_us) / 1e3:.1f} ms (profiled), GPU busy "
             f"{sum(e - s for s, e in busy) / 1e3:.1f} ms, idle in gaps over {GAP_US} us "
             f"{sum(e - s for s, e in gaps) / 1e3:.1f} ms", ""]
    # per part: wall, busy inside, idle inside
    walls = defaultdict(float)
    for start, end, name in parts:
        walls[name] += end - start
    walls["driver"] = (step_end - wall_start_us) - sum(walls.values())
    busy_in, idle_in = defaultdict(float), defaultdict(float)
    for s, e in busy:
        busy_in[part_of(s)] += e - s
    for s, e in gaps:
        idle_in[part_of(s)] += e - s
    lines.append(f"{'part':10s} {'wall ms':>9s} {'GPU busy':>9s} {'idle':>9s}")
    for name in sorted(walls, key=lambda n: -walls[n]):
        lines.append(f"{name:10s} {walls[name] / 1e3:9.1f} {busy_in[name] / 1e3:9.1f} {idle_in[name] / 1e3:9.1f}")
    # what the host ran while the GPU waited: the innermost op covering each gap's middle
    ops.sort(key=lambda e: e.time_range.start)
    starts = [e.time_range.start for e in ops]
    by_line = defaultdict(lambda: [0.0, 0])
    for s, e in gaps:
        mid = (s + e) / 2
        i = bisect.bisect_right(starts, mid)
        # the ops that began last before the gap's middle: the innermost covering one is among them
        covering = [op for op in ops[max(0, i - 200):i] if op.time_range.end >= mid]
        covering.sort(key=lambda op: op.time_range.end - op.time_range.start)
        where = next((line for line in map(_rlx_line, covering) if "/" in line), None) if covering else None
        where = where or (covering[0].name if covering else "(no op: Python between ops)")
        if covering and where != covering[0].name:
            where += f" in {covering[0].name}"
        by_line[f"[{part_of(s)}] {where}"][0] += e - s
        by_line[f"[{part_of(s)}] {where}"][1] += 1
    lines += ["", "GPU idle by what the host ran (ms, gaps):"]
    for where, (us, count) in sorted(by_line.items(), key=lambda x: -x[1][0])[:40]:
        lines.append(f"{us / 1e3:9.1f} {count:6d}  {where}")
    # the long gaps in order, with the rlx line the host was last in before each
    lines += ["", f"gaps over {LONG_US / 1e3:.1f} ms ({4 * LONG_US / 1e3:.1f} ms in the update) in order (ms from the step's start, ms idle, the last rlx line "
                  "the host ran before the gap ended):"]
    with_stack = [op for op in ops if any("/rlx" in f for f in op.stack or [])]
    stack_starts = [op.time_range.start for op in with_stack]
    for s, e in gaps:
        if e - s >= (LONG_US if part_of(s) != "update" else 4 * LONG_US):
            i = bisect.bisect_right(stack_starts, e) - 1
            where = _rlx_line(with_stack[i]) + f" ({with_stack[i].name})" if i >= 0 else "?"
            lines.append(f"{(s - wall_start_us) / 1e3:9.1f} {(e - s) / 1e3:7.2f}  [{part_of(s)}] {where}")
    return "\n".join(lines)


class StepTimeline:
    def __init__(self):
        self.step = int(os.environ.get("RLX_TIMELINE_STEP", "3"))
        self.prof = None

    @hookimpl
    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        if step == self.step - 1:
            self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True)
            self.prof.__enter__()
        elif step == self.step and self.prof is not None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.prof.__exit__(None, None, None)
            text = report(self.prof)
            print(text, flush=True)
            if os.environ.get("RLX_TIMELINE_OUT"):
                with open(os.environ["RLX_TIMELINE_OUT"], "w") as f:
                    f.write(text + "\n")
            self.prof = None


plugin = StepTimeline()
