"""Timing a CUDA call by itself: captured ``calls`` times in one CUDA graph, so that the
figure is the kernels' own time, without Python's launch cost."""

from __future__ import annotations

import torch


def graph_us(fn, calls: int = 20, replays: int = 5, generator: torch.Generator | None = None) -> float:
    """Microseconds per call of ``fn`` (run once first: compilation, autotuning); a
    ``generator`` that ``fn`` draws from is registered with the graph."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    if generator is not None:
        graph.register_generator_state(generator)
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (replays * calls) * 1000
