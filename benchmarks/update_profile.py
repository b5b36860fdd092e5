"""Where W1's update and log-prob pass spend their time (one GPU): the policy worker's
``train_step`` over 512 samples of 128 prompt + 512 response tokens and its no-grad
``logprobs``, timed with the output head's softmax arithmetic eager and in its Triton kernels
(``rlx.logprob_kernels``; torch.compile's kernels before 2026-12-06), with and
without the decoder layers compiled, and the GPU kernels of one training micro-batch.

    python benchmarks/update_profile.py [--out DIR]

MFU counts 6·N·tokens for the update and 2·N·tokens for the log-prob pass (N: every
parameter, the tied head counted once) against the 790 TFLOP/s bf16 matmul rate measured on
the H200.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_overhead import w1_files  # noqa: E402

PEAK = 790e12
ROWS, PROMPT_LEN, RESPONSE_LEN = 512, 128, 512


def w1_batch(vocab: int):
    from rlx.online import batch_of_completions
    from rlx.rollout import Completion

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, vocab, (ROWS, PROMPT_LEN), generator=g).tolist()
    responses = torch.randint(10, vocab, (ROWS, RESPONSE_LEN), generator=g).tolist()
    completions = [Completion(i // 8, r, [-12.0] * len(r), "", "length") for i, r in enumerate(responses)]
    batch = batch_of_completions(prompts, completions, 0, [0.0] * ROWS, [i // 8 for i in range(ROWS)], "cuda")
    batch.advantages = torch.randn(batch.action_mask.shape, generator=g).cuda() * batch.action_mask
    return batch


def timed(fn, repeat: int = 2) -> tuple[float, object]:
    """The fastest of ``repeat`` calls after one warm-up call."""
    result = fn()
    best = float("inf")
    for _ in range(repeat):
        torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    from torch.profiler import ProfilerActivity, profile

    from rlx.config import resolve
    from rlx.plugins import build_host
    from rlx.workers import forward
    from rlx.workers.policy import PolicyWorker

    fused = forward.logprob_kernels.supported
    eager = lambda device: False  # noqa: E731
    tmp = tempfile.mkdtemp()
    model_dir = w1_files(Path(tmp))[1]
    host = build_host()
    config = resolve(host.algorithms.get("grpo"), {
        "model": {"path": model_dir}, "training": {"batch_size": ROWS, "micro_batch_size": 16, "lr": 1e-6, "compile": False},
        "algorithm": {"rollout_batch_size": 64, "n_samples": 8}, "rollout": {"max_new_tokens": RESPONSE_LEN}})
    policy = PolicyWorker(config, host, total_steps=100, micro_steps=ROWS // 16)
    n_params = sum(p.numel() for p in policy.module().parameters())
    batch = w1_batch(policy.module().config.vocab_size)
    tokens = batch.attention_mask.sum().item()
    actions = batch.action_mask.sum().item()
    results: dict = {"params": n_params, "tokens": tokens, "torch": torch.__version__}

    def train():
        return policy.train_step(batch, token_count=actions, seq_count=ROWS, beta=0.0)

    def record(name, seconds, flops_per_token):
        rate = tokens / seconds
        results[name] = {"s": seconds, "tokens_per_s": rate, "mfu": flops_per_token * n_params * rate / PEAK,
                         "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30}
        print(f"{name}: {seconds:.3f} s, {rate:,.0f} tokens/s, MFU {results[name]['mfu']:.1%}, "
              f"peak {results[name]['peak_alloc_gib']:.1f} GiB", flush=True)
        torch.cuda.reset_peak_memory_stats()

    for micro in (16, 64):
        policy.t.forward_micro_batch_size = micro
        for name, fn in (("eager", eager), ("fused", fused)):
            forward.logprob_kernels.supported = fn
            record(f"logprobs_{name}_micro{micro}", timed(lambda: policy.logprobs(batch))[0], 2)
    policy.t.micro_batch_size = 16
    for name, fn in (("eager", eager), ("fused", fused)):
        forward.logprob_kernels.supported = fn
        record(f"train_{name}_micro16", timed(train)[0], 6)
    policy.t.micro_batch_size = 32
    record("train_fused_micro32", timed(train)[0], 6)

    # the decoder layers compiled one by one (regional compilation: one graph for 24 layers)
    for layer in policy.module().model.layers:
        layer.compile()
    start = time.perf_counter()
    policy.t.micro_batch_size = 16
    train()
    results["compile_s"] = time.perf_counter() - start
    record("train_fused_layers_compiled_micro16", timed(train)[0], 6)
    record("logprobs_fused_layers_compiled_micro64", timed(lambda: policy.logprobs(batch))[0], 2)
    policy.t.micro_batch_size = 32
    record("train_fused_layers_compiled_micro32", timed(train)[0], 6)
    # 4x larger head chunks: more rows per softmax reduction (Inductor splits a reduction
    # over few rows into passes that cannot use an online softmax)
    policy.t.micro_batch_size = 16
    chunk = forward._CHUNK_ELEMENTS
    forward._CHUNK_ELEMENTS = chunk * 4
    record("train_fused_layers_compiled_micro16_chunk4x", timed(train)[0], 6)
    forward._CHUNK_ELEMENTS = chunk

    policy.t.micro_batch_size = 16
    micro = batch.select(list(range(16)))
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        policy.train_step(micro, token_count=micro.action_mask.sum().item(), seq_count=16, beta=0.0)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=60)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "update_profile.json").write_text(json.dumps(results, indent=1))
    (out / "update_profile_kernels.txt").write_text(table)


if __name__ == "__main__":
    main()
