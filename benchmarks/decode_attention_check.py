"""The Triton decode-attention kernel (``rlx.engines.decode_attention``) against SDPA (with
the cache write the kernel does itself) on one GPU: the largest difference from a float32
reference, and the time per call of both (and of the kernel with each row reading its own
copy of its prompt), for W1's shape (512 rows, 2 KV heads of 7 query heads, head size 64) and for the 1.5B/7B
head size of 128, with prompt padding masking whole leading blocks of some rows.

    python benchmarks/decode_attention_check.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from rlx.engines.decode_attention import decode_attention

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_timing import graph_us  # noqa: E402


def case(rows: int, kv_heads: int, groups: int, d: int, length: int, span: int) -> dict:
    g = torch.Generator("cuda").manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(rows, kv_heads, groups, d, generator=g, **bf)
    k, v = (torch.randn(rows, kv_heads, 1, d, generator=g, **bf) for _ in range(2))  # this step's key and value
    keys = torch.randn(rows, kv_heads, length, d, generator=g, **bf)
    values = torch.randn(rows, kv_heads, length, d, generator=g, **bf)
    # 8 samples a prompt of 128 columns (left padding up to 99 of them), as W1's
    own = torch.arange(rows, device="cuda")
    shared = own // 8 * 8
    width = torch.full((rows,), 128, device="cuda")
    keys[:, :, :128], values[:, :, :128] = keys[shared, :, :128], values[shared, :, :128]
    pad = torch.randint(0, 100, (rows,), generator=g, device="cuda")[shared]
    valid = torch.arange(length, device="cuda")[None] >= pad[:, None]
    column = torch.full((rows,), span - 3, device="cuda")  # the span's last two columns are not written yet
    scale = d ** -0.5
    mask = (valid[:, :span] & (torch.arange(span, device="cuda") <= column[:, None]))[:, None, None, :]

    def sdpa():  # with the cache write it needs beside it
        keys.index_copy_(2, column[:1], k)
        values.index_copy_(2, column[:1], v)
        return F.scaled_dot_product_attention(q, keys[:, :, :span], values[:, :, :span], attn_mask=mask, scale=scale)

    def kernel():  # the samples of a prompt read one copy of it
        return decode_attention(q, k, v, keys, values, valid, column, span, scale, shared, width)

    def kernel_own():  # each row its own copy
        return decode_attention(q, k, v, keys, values, valid, column, span, scale, own, width)

    kernel()  # writes k and v into the cache for the reference
    reference = F.scaled_dot_product_attention(q.float(), keys[:, :, :span].float(), values[:, :, :span].float(),
                                               attn_mask=mask, scale=scale)
    result = {"shape": [rows, kv_heads, groups, d], "span": span,
              "kernel_max_diff": (kernel().float() - reference).abs().max().item(),
              "sdpa_max_diff": (sdpa().float() - reference).abs().max().item()}
    for name, fn in (("kernel", kernel), ("kernel_own_prompt", kernel_own), ("sdpa", sdpa)):
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            fn()
        end.record()
        torch.cuda.synchronize()
        result[f"{name}_us"] = start.elapsed_time(end) / 50 * 1000
    result["sdpa_over_kernel"] = result["sdpa_us"] / result["kernel_us"]
    result["own_prompt_over_shared"] = result["kernel_own_prompt_us"] / result["kernel_us"]
    # bytes of keys and values read, over the kernel's time
    result["kernel_tb_per_s"] = 2 * rows * kv_heads * span * d * 2 / result["kernel_us"] / 1e6
    return result


def sweep() -> dict:
    """The kernel's time on W1's shape at a 640-column span for other block, warp and stage settings."""
    g = torch.Generator("cuda").manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(512, 2, 7, 64, generator=g, **bf)
    k, v = (torch.randn(512, 2, 1, 64, generator=g, **bf) for _ in range(2))
    keys, values = (torch.randn(512, 2, 640, 64, generator=g, **bf) for _ in range(2))
    valid = torch.ones(512, 640, dtype=torch.bool, device="cuda")
    column = torch.full((512,), 639, device="cuda")
    shared, width = torch.arange(512, device="cuda") // 8 * 8, torch.full((512,), 128, device="cuda")
    times = {}
    for block in (32, 64, 128):
        for warps in (2, 4, 8):
            for stages in (1, 2, 3, 4):
                def fn():
                    return decode_attention(q, k, v, keys, values, valid, column, 640, 0.125, shared, width,
                                            block=block, warps=warps, stages=stages)
                try:
                    fn()
                except Exception as e:  # a setting that needs more shared memory than the SM has
                    times[f"{block}/{warps}/{stages}"] = repr(e)[:80]
                    continue
                times[f"{block}/{warps}/{stages}"] = round(graph_us(fn), 2)
    return times


def main() -> None:
    results = [case(512, 2, 7, 64, 640, span) for span in (128, 384, 640)]
    results += [case(64, 2, 7, 64, 640, 640), case(256, 2, 6, 128, 640, 640), case(256, 4, 7, 128, 2560, 2560)]
    for r in results:
        print(json.dumps(r))
    print(json.dumps({"settings_us_at_512x640": sweep()}))
    worst = max(r["kernel_max_diff"] for r in results)
    assert worst < 0.02, f"kernel differs from the float32 reference by {worst}"


if __name__ == "__main__":
    main()
