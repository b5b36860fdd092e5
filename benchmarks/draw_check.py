"""The sampling kernels (``rlx.engines.draw``) against the exponential race drawn in PyTorch
(a float32 uniform per row and token from ``torch.rand``, then the compiled arg-max pass the
decoder used before it) on one GPU, at W1's shape (512 rows × 151,936 bf16 logits): time
per call from a CUDA graph of 20 calls, a sweep of the kernels' block and warp settings, and
checks that their draws follow softmax(z / T) and their log-probs match log_softmax.

    python benchmarks/draw_check.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from rlx.engines.draw import draw

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_timing import graph_us  # noqa: E402


def torch_race(logits, uniform, temperature: float):
    scaled = logits.float() / temperature
    token = (scaled - torch.log(-torch.log(uniform))).argmax(-1)
    return token, scaled.gather(-1, token[:, None]).squeeze(-1) - scaled.logsumexp(-1)


def main() -> None:
    generator = torch.Generator("cuda").manual_seed(0)
    logits = torch.randn(512, 151_936, device="cuda", generator=generator).mul_(3).bfloat16()
    compiled = torch.compile(torch_race)
    uniform = torch.empty(logits.shape, device="cuda")

    def baseline():
        uniform.uniform_(generator=generator)
        return compiled(logits, uniform, 0.9)

    results = {"baseline_us": graph_us(baseline, generator=generator),
               "kernel_us": graph_us(lambda: draw(logits, 0.9, generator), generator=generator)}
    results["baseline_over_kernel"] = results["baseline_us"] / results["kernel_us"]
    results["kernel_tb_per_s"] = logits.numel() * 2 / results["kernel_us"] / 1e6
    token, logprob = draw(logits, 0.9, generator)
    want = (logits.float() / 0.9).log_softmax(-1)
    results["logprob_max_diff"] = (logprob - want.gather(-1, token[:, None]).squeeze(-1)).abs().max().item()
    # frequencies over 2^20 rows of a 6-token softmax, against its probabilities
    small = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, -3.0], device="cuda").repeat(1 << 20, 1)
    drawn = torch.bincount(draw(small, 1.3, generator)[0], minlength=6).float() / len(small)
    results["frequency_max_diff"] = (drawn - (small[0] / 1.3).softmax(-1)).abs().max().item()
    sweep = {}
    for block in (1024, 2048, 4096, 8192):
        for warps in (2, 4, 8):
            sweep[f"{block}/{warps}"] = round(graph_us(lambda: draw(logits, 0.9, generator, block=block, warps=warps),
                                                      generator=generator), 2)
    results["settings_us"] = sweep
    print(json.dumps(results))
    assert results["logprob_max_diff"] < 1e-3 and results["frequency_max_diff"] < 0.005, results


if __name__ == "__main__":
    main()
