"""W1's update under ``training.compile_memory`` (one GPU): the policy worker's
``train_step`` over 512 samples of 128 prompt + 512 response tokens with the decoder layers
compiled, for each memory fraction and micro-batch size, in one call: time, MFU and the
peak memory allocated (the optimizer's state included, as in a run's later steps).

    python benchmarks/compile_memory.py [--fractions 1,0.8,0.6] [--micro 16,32] [--out DIR]

On the CPU (``--cpu``) it runs the tests' tiny model instead, to try the script.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_overhead import w1_files  # noqa: E402
from update_profile import PEAK, ROWS, timed, w1_batch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fractions", default="1,0.8,0.6")
    parser.add_argument("--micro", default="16,32")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = parser.parse_args()
    import torch._dynamo
    import torch._functorch.config

    from rlx.config import resolve
    from rlx.plugins import build_host
    from rlx.workers.policy import PolicyWorker

    model_dir = w1_files(Path(tempfile.mkdtemp()))[1]
    host = build_host()
    config = resolve(host.algorithms.get("grpo"), {
        "model": {"path": model_dir}, "training": {"batch_size": ROWS, "micro_batch_size": 16, "lr": 1e-6},
        "algorithm": {"rollout_batch_size": 64, "n_samples": 8}, "rollout": {"max_new_tokens": 512}})
    policy = PolicyWorker(config, host, total_steps=100, micro_steps=ROWS // 16)
    n_params = sum(p.numel() for p in policy.module().parameters())
    batch = w1_batch(policy.module().config.vocab_size)
    tokens = batch.attention_mask.sum().item()
    actions = batch.action_mask.sum().item()
    results: dict = {"params": n_params, "tokens": tokens, "torch": torch.__version__, "runs": []}

    def train():
        return policy.train_step(batch, token_count=actions, seq_count=ROWS, beta=0.0)

    for fraction in [float(f) for f in args.fractions.split(",")]:
        torch._functorch.config.activation_memory_budget = fraction
        torch._dynamo.reset()  # the layers compile again under the new fraction
        for micro in [int(m) for m in args.micro.split(",")]:
            policy.t.micro_batch_size = micro
            started = time.perf_counter()
            train()
            compile_s = time.perf_counter() - started
            seconds, (_, update) = timed(train)
            # the worker measures each update's own peak (and resets the counter after it)
            held, peak = update["memory/before_update_gib"], update["memory/update_peak_gib"]
            row = {"fraction": fraction, "micro": micro, "s": seconds, "tokens_per_s": tokens / seconds,
                   "mfu": 6 * n_params * tokens / seconds / PEAK, "held_gib": held, "peak_alloc_gib": peak,
                   "first_call_s": compile_s}
            results["runs"].append(row)
            print(f"compile_memory {fraction} micro {micro}: {seconds:.3f} s, MFU {row['mfu']:.1%}, "
                  f"peak {row['peak_alloc_gib']:.1f} GiB (held {held:.1f})", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compile_memory.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
