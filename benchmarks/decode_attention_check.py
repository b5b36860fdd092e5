"""The Triton decode-attention kernels (``rlx.engines.decode_attention``) against SDPA (with
the cache write the kernel does itself) on one GPU: the largest difference from a float32
reference, and the time per call (from a CUDA graph, as the engine replays them) of these,
which also turn the query and key by the rotary embedding,

- ``shared``: the prompt kernel reading each prompt's columns once for its 8 samples, then
  the decode kernel over the columns each row decoded (what the engine runs with n > 1);
- ``own``: the decode kernel alone, each row reading its own copy of its prompt;
- SDPA over the same columns, with the query and key turned before;

for W1's shape (512 rows, 2 KV heads of 7 query heads, head size 64, 8 samples a 128-column
prompt) at spans of 128/384/640 columns, and for the 1.5B/7B head size of 128, with prompt
padding masking whole leading blocks of some rows. Then a sweep of both kernels' settings at
W1's shape.

    python benchmarks/decode_attention_check.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from rlx.engines.decode_attention import decode_attention
from rlx.engines.static_decode import prompt_members

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_timing import graph_us  # noqa: E402

SAMPLES, PROMPT = 8, 128


def inputs(rows: int, kv_heads: int, groups: int, d: int, length: int, span: int) -> dict:
    g = torch.Generator("cuda").manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(rows, kv_heads, groups, d, generator=g, **bf)
    k, v = (torch.randn(rows, kv_heads, 1, d, generator=g, **bf) for _ in range(2))  # this step's key and value
    # each row's rotary embedding at its position, as the model's rotary embedding makes it
    angles = torch.randint(0, 640, (rows, 1), generator=g, device="cuda") * 1e6 ** (
        -torch.arange(0, d, 2, device="cuda") / d)
    angles = torch.cat([angles, angles], 1)
    keys = torch.randn(rows, kv_heads, length, d, generator=g, **bf)
    values = torch.randn(rows, kv_heads, length, d, generator=g, **bf)
    # 8 samples a prompt of 128 columns (left padding up to 99 of them), as W1's
    first = torch.arange(rows, device="cuda") // SAMPLES * SAMPLES
    keys[:, :, :PROMPT], values[:, :, :PROMPT] = keys[first, :, :PROMPT], values[first, :, :PROMPT]
    pad = torch.randint(0, 100, (rows,), generator=g, device="cuda")[first]
    members = torch.from_numpy(prompt_members(np.arange(rows), SAMPLES, SAMPLES, rows)).cuda()
    return dict(q=q, k=k, v=v, cos=angles.cos().bfloat16(), sin=angles.sin().bfloat16(), keys=keys, values=values,
                valid=torch.arange(length, device="cuda")[None] >= pad[:, None],
                column=torch.full((rows,), span - 3, device="cuda"),  # the span's last two columns not written yet
                span=span, scale=d ** -0.5, width=torch.full((rows,), PROMPT, device="cuda"), members=members)


def turned(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Heads [rows, heads, n, d] turned by each row's rotary embedding, in float32."""
    half = x.shape[-1] // 2
    x, cos, sin = x.float(), cos.float()[:, None, None], sin.float()[:, None, None]
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def case(rows: int, kv_heads: int, groups: int, d: int, length: int, span: int) -> dict:
    x = inputs(rows, kv_heads, groups, d, length, span)
    keys, values, column, span = x["keys"], x["values"], x["column"], x["span"]
    mask = (x["valid"][:, :span] & (torch.arange(span, device="cuda") <= column[:, None]))[:, None, None, :]
    q, k = (turned(x[name], x["cos"], x["sin"]) for name in ("q", "k"))

    def sdpa():  # with the cache write it needs beside it, the heads turned before
        keys.index_copy_(2, column[:1], k_bf16)
        values.index_copy_(2, column[:1], x["v"])
        return F.scaled_dot_product_attention(q_bf16, keys[:, :, :span], values[:, :, :span], attn_mask=mask,
                                              scale=x["scale"])

    def shared():
        return decode_attention(**x)

    def own():
        return decode_attention(**{**x, "members": None})

    q_bf16, k_bf16 = q.bfloat16(), k.bfloat16()
    shared()  # writes k and v into the cache for the reference
    reference = F.scaled_dot_product_attention(q, keys[:, :, :span].float(), values[:, :, :span].float(),
                                               attn_mask=mask, scale=x["scale"])
    result = {"shape": [rows, kv_heads, groups, d], "span": span}
    for name, fn in (("shared", shared), ("own", own), ("sdpa", sdpa)):
        result[f"{name}_max_diff"] = (fn().float() - reference).abs().max().item()
        result[f"{name}_us"] = graph_us(fn)
    result["own_over_shared"] = result["own_us"] / result["shared_us"]
    result["sdpa_over_shared"] = result["sdpa_us"] / result["shared_us"]
    # bytes of keys and values each row would read by itself, over the time
    result["own_tb_per_s"] = 2 * rows * kv_heads * span * d * 2 / result["own_us"] / 1e6
    return result


def sweep(span: int) -> dict:
    """Both kernels' time at W1's shape for other settings: the decode kernel's block, warps
    and stages with the prompt kernel at its defaults, then the prompt kernel's block and
    warps with the decode kernel at its defaults."""
    x = inputs(512, 2, 7, 64, 640, span)
    times = {}
    settings = [dict(block=b, warps=w, stages=s) for b in (32, 64) for w in (2, 4) for s in (2, 3, 4)]
    settings += [dict(prompt_block=b, prompt_warps=w) for b in (32, 64, 128) for w in (2, 4, 8)]
    for setting in settings:
        name = "/".join(f"{k}={v}" for k, v in setting.items())
        try:
            times[name] = round(graph_us(lambda: decode_attention(**x, **setting)), 2)
        except Exception as e:  # a setting that needs more shared memory than the SM has
            times[name] = repr(e)[:80]
    return times


def main() -> None:
    results = [case(512, 2, 7, 64, 640, span) for span in (128, 384, 640)]
    results += [case(64, 2, 7, 64, 640, 640), case(256, 2, 6, 128, 640, 640), case(256, 4, 7, 128, 2560, 2560)]
    for r in results:
        print(json.dumps(r), flush=True)
    for span in (131, 640):
        print(json.dumps({f"settings_us_at_512x{span}": sweep(span)}), flush=True)
    worst = max(r[f"{name}_max_diff"] for r in results for name in ("shared", "own"))
    assert worst < 0.02, f"a kernel differs from the float32 reference by {worst}"


if __name__ == "__main__":
    main()
