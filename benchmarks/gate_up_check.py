"""The decode step's MLP at 512 rows with its gate and up projections as two matmuls or
one (a stacked weight), for W1 (hidden 896) and the 1.5B and 7B shapes: the GEMMs alone and
the whole MLP run eagerly, each the median of 7 replays of a CUDA graph of 24 calls.

    python benchmarks/gate_up_check.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def graph_us(fn, calls: int = 24) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the graph
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return sorted(times)[3]


def main() -> None:
    bf = dict(device="cuda", dtype=torch.bfloat16)
    for rows, hidden, inner in ((512, 896, 4864), (256, 896, 4864), (512, 1536, 8960), (512, 3584, 18944)):
        x = torch.randn(rows, hidden, **bf)
        gate, up = torch.randn(inner, hidden, **bf) / 30, torch.randn(inner, hidden, **bf) / 30
        down = torch.randn(hidden, inner, **bf) / 60
        gate_up = torch.cat([gate, up])

        def stacked():
            both = F.linear(x, gate_up)
            return F.linear(F.silu(both[:, :inner]) * both[:, inner:], down)

        mlp_two = graph_us(lambda: F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down))
        mlp_one = graph_us(stacked)
        gemms_two = graph_us(lambda: (F.linear(x, gate), F.linear(x, up)))
        gemm_one = graph_us(lambda: F.linear(x, gate_up))
        print(f"M{rows} H{hidden} I{inner}: mlp separate {mlp_two:.1f} us, stacked {mlp_one:.1f} us; "
              f"gate+up GEMMs {gemms_two:.1f} vs one {gemm_one:.1f} us", flush=True)


if __name__ == "__main__":
    main()
