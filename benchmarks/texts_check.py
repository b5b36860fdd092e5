"""What the native engine's completions cost on the host after a W1 rollout (512 rows of
512 tokens, ids drawn as W1's random model draws them, over its 151,936-token vocabulary):
the texts (``rlx.rollout.texts``: the Rust tokenizer's ``decode_batch`` on every core, and
row by row for comparison), the host lists of tokens and log-probs, and the whole
``_completions``; then the texts again in fresh processes with the Rust side's thread pool
set to 1, 2, 4 and 8 threads (``RAYON_NUM_THREADS``). Prints the cores this process may use.

    python benchmarks/texts_check.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def median_time(fn, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(tokenizer_dir: str, whole: bool) -> dict:
    import torch
    from transformers import AutoTokenizer

    from rlx.rollout import Ends, NativeEngine, SamplingParams, texts

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 151936, (512, 512), generator=generator)
    logprobs = -torch.rand(512, 512, generator=generator) * 12
    rows, lps = ids.tolist(), logprobs.tolist()
    out = {"texts_s": median_time(lambda: texts(tokenizer, rows))}
    if whole:
        out["texts_row_by_row_s"] = median_time(lambda: [tokenizer.decode(r, skip_special_tokens=True) for r in rows], 3)
        out["host_lists_s"] = median_time(lambda: (ids.tolist(), logprobs.tolist()))
        engine = NativeEngine.__new__(NativeEngine)  # only what _completions reads
        engine.tokenizer, engine.eos_ids = tokenizer, {tokenizer.eos_token_id}
        params = SamplingParams(n=8, max_new_tokens=512)
        finished = Ends(engine.eos_ids, params.stop, tokenizer.decode)
        out["completions_s"] = median_time(lambda: engine._completions(0, rows, lps, finished, params))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--tokenizer")  # in a child process: the texts alone
    args = parser.parse_args()
    if args.tokenizer:
        print(json.dumps(measure(args.tokenizer, whole=False)))
        return
    from rlx.tiny import make_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        make_tokenizer(tmp)
        result = {"cpu_count": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
                  "cgroup_cpu_max": Path("/sys/fs/cgroup/cpu.max").read_text().strip()
                  if Path("/sys/fs/cgroup/cpu.max").exists() else None,
                  "in_process": measure(tmp, whole=True), "rayon_threads": {}}
        for threads in (1, 2, 4, 8):
            env = {**os.environ, "RAYON_NUM_THREADS": str(threads)}
            line = subprocess.run([sys.executable, __file__, "--tokenizer", tmp], env=env, check=True,
                                  capture_output=True, text=True).stdout.strip().splitlines()[-1]
            result["rayon_threads"][threads] = json.loads(line)["texts_s"]
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
