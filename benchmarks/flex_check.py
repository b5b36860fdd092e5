"""Where a shared-prompt row's time goes on one GPU: building its flex-attention block mask,
and the attention itself (forward and backward) against SDPA over the same samples padded.

    python benchmarks/flex_check.py [--out DIR]

Shapes are W1's: 14 query heads, 2 key heads of 64; a micro-batch of 32 samples, 4 prompts
of 128 tokens with 8 responses of 512 each (a row of 16,896 tokens; padded, 32 × 640), and
the log-prob pass's 128 samples (a row of 67,584).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

HEADS, KV_HEADS, DIM = 14, 2, 64


def layout(prompts: int, samples: int, prompt_len: int, response_len: int):
    """doc, group and prompt flags of a row laid out as rlx.workers.forward lays it."""
    doc, group, prompt = [], [], []
    for g in range(prompts):
        doc += [2 * g * samples] * prompt_len
        group += [g] * prompt_len
        prompt += [True] * prompt_len
        for s in range(samples):
            doc += [2 * (g * samples + s) + 1] * response_len
            group += [g] * response_len
            prompt += [False] * response_len
    as_tensor = lambda x: torch.tensor(x, device="cuda")  # noqa: E731
    return as_tensor(doc), as_tensor(group), as_tensor(prompt)


def timed(fn, repeat: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention)
    results = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    for name, prompts in (("micro32", 4), ("logprob128", 16)):
        doc, group, prompt = layout(prompts, 8, 128, 512)
        length = len(doc)

        def make():
            d, g, p = doc.clone(), group.clone(), prompt.clone()  # new closures each time, as per micro-batch

            def attends(b, h, q, kv):
                return ((d[q] == d[kv]) & (kv <= q)) | ((g[q] == g[kv]) & p[kv] & ~p[q])
            return create_block_mask(attends, None, None, length, length, device="cuda", _compile=True)

        start = time.perf_counter()
        mask = make()
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        mask_s = timed(make)
        q = torch.randn(1, HEADS, length, DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(1, KV_HEADS, length, DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(1, KV_HEADS, length, DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        rows = prompts * 8
        pq = torch.randn(rows, HEADS, 640, DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        pk = torch.randn(rows, KV_HEADS, 640, DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        pv = torch.randn(rows, KV_HEADS, 640, DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def flex_fwd():
            with torch.no_grad():
                flex(q, k, v, block_mask=mask, enable_gqa=True)

        def flex_both():
            flex(q, k, v, block_mask=mask, enable_gqa=True).sum().backward()

        def sdpa_fwd():
            with torch.no_grad():
                sdpa(pq, pk, pv, is_causal=True, enable_gqa=True)

        def sdpa_both():
            sdpa(pq, pk, pv, is_causal=True, enable_gqa=True).sum().backward()

        r = {"length": length, "mask_first_s": first, "mask_s": mask_s, "sparsity": mask.sparsity(),
             "flex_fwd_s": timed(flex_fwd), "flex_fwd_bwd_s": timed(flex_both),
             "sdpa_fwd_s": timed(sdpa_fwd), "sdpa_fwd_bwd_s": timed(sdpa_both)}
        results[name] = r
        print(name, json.dumps(r), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "flex_check.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
