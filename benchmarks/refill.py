"""Prompts joining as rows finish, against batches decoded one after another, in one process:
the native engine generates 64 prompts × 8 samples with room for ``--slots`` rows, once in
one call (prompts join the decode as rows finish) and once a batch of ``--slots`` rows at a
time (each batch decoded until its longest row ends, as the engine did before). Completions
end at any of ``--eos-ids`` token ids, about one step in ``--mean-length`` for a model with
random weights, so their lengths spread from a few tokens to ``--max-new-tokens``.

    python benchmarks/refill.py                    # W1's model on a GPU
    python benchmarks/refill.py --model tiny       # builtin:tiny on the CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_overhead import w1_files  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="w1", choices=["w1", "tiny"])
    parser.add_argument("--slots", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--mean-length", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlx.rollout import NativeEngine, SamplingParams
    from rlx.tiny import builtin_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        if args.model == "w1":
            model_dir = w1_files(Path(tmp))[1]
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
        else:
            model_dir = builtin_model("tiny")
            model = AutoModelForCausalLM.from_pretrained(model_dir).to(device)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab = model.config.vocab_size
    # a block of ids, none of them special, that ends a completion: one in mean-length draws
    ends = max(1, vocab // args.mean_length)
    model.generation_config.eos_token_id = list(range(vocab - ends, vocab))
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, vocab - ends, (int(torch.randint(32, 129, (1,), generator=generator)),),
                             generator=generator).tolist() for _ in range(64)]
    engine = NativeEngine(model, tokenizer, max_batch_size=args.slots)
    per_batch = args.slots // 8

    def joined(seed):
        return engine.generate(prompts, SamplingParams(n=8, max_new_tokens=args.max_new_tokens, seed=seed))

    def one_after_another(seed):
        return [c for i in range(0, len(prompts), per_batch)
                for c in engine.generate(prompts[i:i + per_batch],
                                         SamplingParams(n=8, max_new_tokens=args.max_new_tokens, seed=seed + i))]

    results = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "model": args.model,
               "slots": args.slots, "rows": 8 * len(prompts)}
    for name, fn in (("joined", joined), ("one_after_another", one_after_another)):
        fn(100)  # warm-up (on CUDA: graph captures)
    rates = {"joined": [], "one_after_another": []}
    for r in range(args.rounds):  # alternating, so that drift in the machine's speed hits both
        for name, fn in (("joined", joined), ("one_after_another", one_after_another)):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = fn(r)
            if device == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            lengths = [len(c.token_ids) for c in out]
            rates[name].append(sum(lengths) / seconds)
            results[f"{name}_lengths"] = {"mean": statistics.mean(lengths), "min": min(lengths), "max": max(lengths)}
    for name, values in rates.items():
        results[f"{name}_tokens_per_s"] = statistics.median(values)
    results["joined_over_one_after_another"] = results["joined_tokens_per_s"] / results["one_after_another_tokens_per_s"]
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
