"""The output head's Triton kernels (``rlx.logprob_kernels``) against torch.compile of the
same arithmetic (what the update ran before), on one GPU: W1's chunk of 883 tokens × 151,936
bf16 logits, the time per call of each, the largest differences, and the kernels' time for
other block and warp settings.

    python benchmarks/head_kernels_check.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from rlx import logprob_kernels

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_timing import graph_us  # noqa: E402

ROWS, VOCAB = 883, 151936


def compiled_stats(logits, labels, temperature: float, with_entropy: bool):
    scaled = logits.float() / temperature
    lse = scaled.logsumexp(-1)
    logp = scaled.gather(-1, labels[:, None]).squeeze(-1) - lse
    if not with_entropy:
        return logp, lse, lse.new_zeros(0)
    full = logits.float()
    full_lse = full.logsumexp(-1)
    return logp, lse, full_lse - (torch.exp(full - full_lse[:, None]) * full).sum(-1)


def compiled_grad(logits, lse, labels, grad_logp, temperature: float):
    g = grad_logp[:, None].float()
    onehot = torch.arange(logits.shape[-1], device=logits.device) == labels[:, None]
    return ((onehot.float() - torch.exp(logits.float() / temperature - lse[:, None])) * (g / temperature)).to(logits.dtype)


def main() -> None:
    g = torch.Generator("cuda").manual_seed(0)
    logits = (torch.randn(ROWS, VOCAB, device="cuda", generator=g) * 3).bfloat16()
    labels = torch.randint(0, VOCAB, (ROWS,), device="cuda", generator=g)
    grad_logp = torch.randn(ROWS, device="cuda", generator=g)
    stats_c = torch.compile(compiled_stats, dynamic=True)
    grad_c = torch.compile(compiled_grad, dynamic=True)
    gbytes = logits.numel() * 2 / 1e9
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": [ROWS, VOCAB]}
    for temperature, entropy in ((1.0, True), (0.7, True), (1.0, False)):
        name = f"T{temperature}_entropy{int(entropy)}"
        want = stats_c(logits, labels, temperature, entropy)
        got = logprob_kernels.stats(logits, labels, temperature, entropy)
        r = {"diff_" + k: (a - b).abs().max().item() for k, a, b in zip(("logp", "lse", "entropy"), got, want)
             if a.numel()}
        r["compiled_us"] = graph_us(lambda: stats_c(logits, labels, temperature, entropy))
        r["kernels_us"] = graph_us(lambda: logprob_kernels.stats(logits, labels, temperature, entropy))
        r["kernels_tb_per_s"] = gbytes / r["kernels_us"] * 1e6 / 1e3
        lse = want[1]
        want_grad = grad_c(logits, lse, labels, grad_logp, temperature)
        got_grad = logprob_kernels.logits_grad(logits, lse, labels, grad_logp, temperature)
        r["diff_grad"] = (got_grad.float() - want_grad.float()).abs().max().item()
        r["grad_compiled_us"] = graph_us(lambda: grad_c(logits, lse, labels, grad_logp, temperature))
        out = torch.empty_like(logits)
        r["grad_kernel_us"] = graph_us(lambda: logprob_kernels.logits_grad(logits, lse, labels, grad_logp, temperature,
                                                                          out=out))
        r["grad_kernel_tb_per_s"] = 2 * gbytes / r["grad_kernel_us"] * 1e6 / 1e3
        results[name] = r
        print(name, json.dumps(r), flush=True)
    sweep = {}
    lse = stats_c(logits, labels, 1.0, False)[1]
    out = torch.empty_like(logits)
    for block in (1024, 2048, 4096, 8192):
        for warps in (4, 8, 16):
            sweep[f"stats {block}/{warps}"] = round(graph_us(
                lambda: logprob_kernels.stats(logits, labels, 1.0, True, block=block, warps=warps)), 1)
            sweep[f"grad {block}/{warps}"] = round(graph_us(
                lambda: logprob_kernels.logits_grad(logits, lse, labels, grad_logp, 1.0, out=out, block=block,
                                                    warps=warps)), 1)
    results["sweep_us"] = sweep
    print(json.dumps(sweep), flush=True)
    worst = max(v for k, r in results.items() if k.startswith("T") for kk, v in r.items() if kk.startswith("diff"))
    assert worst < 0.05, f"kernels differ from the compiled arithmetic by {worst}"


if __name__ == "__main__":
    main()
