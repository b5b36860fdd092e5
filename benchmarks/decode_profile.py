"""Where a W1 decode step's time goes (one GPU): the static decoder's CUDA-graph step at
batch 512, timed at several cache spans, and the GPU kernels of one eager step ranked by
time.

    python benchmarks/decode_profile.py [--own-prompt]

``--own-prompt`` has every row read its own copy of its prompt's columns in the decode
kernel, without the prompt kernel that reads them once for a prompt's samples.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_overhead import w1_engine  # noqa: E402

def step_ms(dec, span: int, params) -> float:
    """Median over 5 rounds of 20 replays of one step at ``span`` columns."""
    position = torch.full_like(dec.position, 128)  # the rows' position, the same before every replay

    def reset():
        dec.column.fill_(span - 1)
        dec.step.fill_(1)
        dec.position.copy_(position)

    reset()
    dec._replay(512, span, params, dec.generator)  # captures
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            reset()
            dec._replay(512, span, params, dec.generator)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 20)
    return sorted(times)[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--own-prompt", action="store_true")
    args = parser.parse_args()
    if args.own_prompt:
        from rlx.engines import decode_attention
        decode_attention.samples_per_tile = lambda groups, head_dim: 1

    from torch.profiler import ProfilerActivity, profile

    engine, prompts, params = w1_engine()
    engine.generate(prompts, params)
    dec = engine.static
    results = {}
    for span in (128, 256, 384, 512, 640):
        results[f"span{span}_ms"] = step_ms(dec, span, params)
        print(f"span {span}: {results[f'span{span}_ms']:.3f} ms per step", flush=True)
    dec.column.fill_(639)
    dec.step.fill_(1)
    dec.position.fill_(128)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        dec._forward(512, 640, params, dec.generator)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=70))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    with torch.inference_mode():
        main()
