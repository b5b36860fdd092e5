"""Packed training against padded training on one GPU: the policy worker's update and
log-prob pass over W1's 512 samples (the Qwen2.5-0.5B shape, 128-token prompts) whose
responses end at lengths drawn uniformly from 32 to 512 tokens, as GRPO's responses do once
EOS is allowed, with ``training.packing`` off and on.

    python benchmarks/packing.py [--out DIR]

Packed rows attend through ``rlx_varlen`` (torch's variable-length flash kernel) unless
flash-attn is installed. Prints each pass's time, real tokens per second and MFU (6·N per
real token for the update, 2·N for the log-prob pass, against the measured 790 TFLOP/s),
and how far the packed log-probs are from the padded ones. Without a GPU it runs builtin:tiny
(``--rows 16`` for a quick check).
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
PROMPT_LEN, MAX_RESPONSE = 128, 512


def batch_with_lengths(rows: int, vocab: int, device: str):
    from rlx.online import batch_of_completions
    from rlx.rollout import Completion

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, vocab, (rows, PROMPT_LEN), generator=g).tolist()
    lengths = torch.randint(32, MAX_RESPONSE + 1, (rows,), generator=g).tolist()
    completions = [Completion(i // 8, torch.randint(10, vocab, (n,), generator=g).tolist(), [-12.0] * n, "", "stop")
                   for i, n in enumerate(lengths)]
    batch = batch_of_completions(prompts, completions, 0, [0.0] * rows, [i // 8 for i in range(rows)], device)
    batch.advantages = torch.randn(batch.action_mask.shape, generator=g).to(device) * batch.action_mask
    return batch


def timed(fn, repeat: int = 2) -> float:
    """The fastest of ``repeat`` calls after two warm-up calls (compilation, then the
    dynamic-shape recompile that packed rows of a new length bring)."""
    fn(), fn()
    best = float("inf")
    for _ in range(repeat):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    from rlx.config import resolve
    from rlx.plugins import build_host
    from rlx.workers.policy import PolicyWorker

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model_dir = w1_files(Path(tempfile.mkdtemp()))[1] if device == "cuda" else None
    if model_dir is None:
        from rlx.tiny import builtin_model
        model_dir = str(builtin_model("tiny"))
    host = build_host()
    results: dict = {"torch": torch.__version__, "rows": args.rows, "micro": args.micro}
    logps = {}
    for packing in (False, True):
        config = resolve(host.algorithms.get("grpo"), {
            "model": {"path": model_dir},
            "training": {"batch_size": args.rows, "micro_batch_size": args.micro, "lr": 1e-6, "packing": packing},
            "algorithm": {"rollout_batch_size": args.rows // 8, "n_samples": 8},
            "rollout": {"max_new_tokens": MAX_RESPONSE}})
        policy = PolicyWorker(config, host, total_steps=100, micro_steps=args.rows // args.micro)
        module = policy.module()
        n_params = sum(p.numel() for p in module.parameters())
        batch = batch_with_lengths(args.rows, module.config.vocab_size, device)
        tokens = batch.attention_mask.sum().item()
        actions = batch.action_mask.sum().item()
        name = "packed" if packing else "padded"
        results["attention_" + name] = module.config._attn_implementation
        results["real_tokens"], results["padded_tokens"] = tokens, batch.attention_mask.numel()
        logps[name] = policy.logprobs(batch).float()
        for part, fn, flops in (
                ("logprobs", lambda: policy.logprobs(batch), 2),
                ("update", lambda: policy.train_step(batch, token_count=actions, seq_count=args.rows, beta=0.0), 6)):
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            seconds = timed(fn)
            rate = tokens / seconds
            results[f"{part}_{name}"] = {
                "s": seconds, "real_tokens_per_s": rate, "mfu": flops * n_params * rate / PEAK,
                "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None}
            print(f"{part} {name} ({results['attention_' + name]}): {seconds:.3f} s, {rate:,.0f} real tokens/s, "
                  f"MFU {results[f'{part}_{name}']['mfu']:.1%}", flush=True)
        del policy, module
        if device == "cuda":
            torch.cuda.empty_cache()
    mask = batch.action_mask.bool()
    diff = (logps["packed"] - logps["padded"]).abs()[mask]
    results["logp_diff_mean"], results["logp_diff_max"] = diff.mean().item(), diff.max().item()
    for part in ("logprobs", "update"):
        results[f"{part}_speedup"] = results[f"{part}_padded"]["s"] / results[f"{part}_packed"]["s"]
    print(f"real tokens {results['real_tokens']:,} of {results['padded_tokens']:,} padded; "
          f"packed/padded log-probs: mean |diff| {results['logp_diff_mean']:.4f}, largest {results['logp_diff_max']:.4f}")
    print(f"speed-up from packing: log-prob pass {results['logprobs_speedup']:.2f}x, update {results['update_speedup']:.2f}x")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "packing.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
