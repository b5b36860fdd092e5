"""Where W1's update spends its GPU time, as ``rlx train`` runs it on one GPU (shared
prompts, layers compiled): the kernels of one whole ``train_step`` over 64 prompts × 8
samples of 128 + 512 tokens, summed by kind, and the update's time and peak memory for
other micro-batch and ``training.compile_memory`` settings, each in a process of its own.

    python benchmarks/update_kernels.py [--out DIR] [--variants 32:0.5,64:0.3]

The first variant is profiled.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_overhead import w1_files  # noqa: E402
from shared_prompts import PEAK, PROMPT_LEN, PROMPTS, RESPONSE_LEN, SAMPLES, grouped_batch  # noqa: E402
from single_gpu import timed  # noqa: E402

# kernel name patterns, tried in order
KINDS = [
    ("attention", r"flash|fmha|cudnn|attention"),  # before gemm: flash kernels name cutlass types
    ("gemm", r"nvjet|gemm|cutlass|sm90_xmma|ampere_|cublas"),
    ("optimizer", r"multi_tensor|adam|foreach"),
    ("head softmax", r"logsumexp|arange_div_eq_exp|^_block_stats$|^_combine$|^_grad$"),  # compiled, then Triton
    ("compiled elementwise", r"^triton_"),
    ("copy / cast", r"copy|cast|to_copy|direct_copy"),
    ("reduce", r"reduce"),
]


def kind(name: str) -> str:
    for label, pattern in KINDS:
        if re.search(pattern, name, re.I):
            return label
    return "other"


def child(model_dir: str, micro: int, memory: float, profile: bool, out: Path) -> dict:
    from torch.profiler import ProfilerActivity

    from rlx.config import resolve
    from rlx.plugins import build_host
    from rlx.workers.policy import PolicyWorker

    host = build_host()
    rows = PROMPTS * SAMPLES
    config = resolve(host.algorithms.get("grpo"), {
        "model": {"path": model_dir},
        "training": {"batch_size": rows, "micro_batch_size": micro, "compile_memory": memory, "lr": 1e-6},
        "algorithm": {"rollout_batch_size": PROMPTS, "n_samples": SAMPLES}, "rollout": {"max_new_tokens": RESPONSE_LEN}})
    policy = PolicyWorker(config, host, total_steps=100, micro_steps=rows // micro)
    n_params = sum(p.numel() for p in policy.module().parameters())
    batch = grouped_batch(policy.module().config.vocab_size, PROMPTS, SAMPLES, PROMPT_LEN, RESPONSE_LEN, ragged=False)
    tokens, actions = batch.attention_mask.sum().item(), batch.action_mask.sum().item()

    def train():
        return policy.train_step(batch, token_count=actions, seq_count=rows, beta=0.0)

    timed(train)  # compiles
    runs = [timed(train) for _ in range(3)]
    update = statistics.median(t for _, t in runs)
    result = {"micro": micro, "memory": memory, "update_s": update, "update_times_s": [t for _, t in runs],
              "update_mfu": 6 * n_params * tokens / update / PEAK,
              "peak_alloc_gib": max(r[1]["memory/update_peak_gib"] for r, _ in runs)}
    if profile:
        with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
            train()
            torch.cuda.synchronize()
        kernels = defaultdict(lambda: [0.0, 0])
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                kernels[event.name][0] += event.device_time_total / 1e3
                kernels[event.name][1] += 1
        by_kind = defaultdict(float)
        for name, (ms, _) in kernels.items():
            by_kind[kind(name)] += ms
        total = sum(by_kind.values())
        lines = [f"GPU time of one train_step, micro-batch {micro}, compile_memory {memory}: {total:.1f} ms "
                 f"(wall {update * 1e3:.0f} ms)", ""]
        lines += [f"{k:22s} {ms:8.1f} ms {ms / total:6.1%}" for k, ms in sorted(by_kind.items(), key=lambda x: -x[1])]
        lines += ["", f"{'ms':>8s} {'calls':>6s}  kernel"]
        for name, (ms, calls) in sorted(kernels.items(), key=lambda x: -x[1][0])[:45]:
            lines.append(f"{ms:8.2f} {calls:6d}  [{kind(name)}] {name[:150]}")
        # where the GPU waited for the host: gaps between one kernel's end and the next's start
        spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                       if e.device_type == torch.autograd.DeviceType.CUDA)
        gaps, end, before = [], spans[0][1], spans[0][2]
        for start, stop, name in spans[1:]:
            if start - end > 20:
                gaps.append(((start - end) / 1e3, before, name))
            if stop > end:
                end, before = stop, name
        lines += ["", f"GPU idle between kernels (gaps over 20 us): {sum(g for g, _, _ in gaps):.1f} ms in "
                  f"{len(gaps)} gaps; the longest:"]
        for gap, before, after in sorted(gaps, reverse=True)[:25]:
            lines.append(f"{gap:8.2f} ms  after [{kind(before)}] {before[:60]}  before [{kind(after)}] {after[:60]}")
        result["gpu_idle_ms"] = sum(g for g, _, _ in gaps)
        (out / "update_kernels.txt").write_text("\n".join(lines) + "\n")
        print("\n".join(lines), file=sys.stderr, flush=True)
        result["gpu_ms_by_kind"] = dict(by_kind)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--variants", default="32:0.5,64:0.3,64:0.5")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # MODEL_DIR:MICRO:MEMORY:PROFILE
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        model_dir, micro, memory, profile = args.child.rsplit(":", 3)
        print(json.dumps(child(model_dir, int(micro), float(memory), profile == "1", args.out)))
        return
    results = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "variants": []}
    model_dir = w1_files(Path(tempfile.mkdtemp()))[1]
    for i, variant in enumerate(args.variants.split(",")):
        micro, memory = variant.split(":")
        done = subprocess.run([sys.executable, __file__, "--out", str(args.out), "--child",
                               f"{model_dir}:{micro}:{memory}:{int(i == 0)}"], capture_output=True, text=True)
        if done.returncode:
            print(f"variant {variant} failed:\n{done.stderr[-3000:]}", flush=True)
            continue
        if i == 0:
            print(done.stderr[-6000:], flush=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        results["variants"].append(r)
        print(f"micro-batch {r['micro']}, compile_memory {r['memory']}: update {r['update_s']:.3f} s "
              f"({', '.join(f'{t:.3f}' for t in r['update_times_s'])}), MFU {r['update_mfu']:.1%}, "
              f"peak allocated {r['peak_alloc_gib']:.1f} GiB", flush=True)
        (args.out / "update_kernels.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
