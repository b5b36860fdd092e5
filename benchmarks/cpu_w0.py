"""W0 on the CPU: a GRPO step of ``rlx train`` against TRL's GRPOTrainer on the same model
(builtin:tiny, a 2-layer, hidden-128 Qwen2), 32 prompts x 8 samples, at most 64 new tokens,
each completion ending at EOS in both (the mean response length is printed), the same
prompt tokens in both. Each runs in its own process, rounds alternating; the first step of a
run is warm-up and left out.

    python benchmarks/cpu_w0.py [--rounds 2] [--steps 5] [--trl-python PYTHON] [--prompts chat|text]
                                [--trl-kept-memory]

``--prompts chat`` (the default) renders each prompt with the tokenizer's chat template in
both, as rlx does by default for a model that has one (23 tokens a prompt); ``text`` gives
both the plain text (``data.chat_template=none``; 6 tokens).

``--trl-kept-memory`` also runs TRL with memory handed out as rlx sets it for itself
(``rlx.host_memory``: glibc's freed blocks of up to 32 MiB kept for reuse, through its
environment variables, and large tensors on huge pages), and reports that as a third figure.

``--trl-python`` is an interpreter that has trl installed (it is not one of rlx's
requirements), e.g. a venv made with ``--system-site-packages`` and ``pip install trl``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rlx.host_memory import KEEP, TRIM

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from local_overhead import W0, run, step_times  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--trl-python", default=sys.executable)
    parser.add_argument("--prompts", choices=["chat", "text"], default="chat")
    parser.add_argument("--trl-kept-memory", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "RLX_CACHE": str(tmp / "cache")}
        env.pop("THP_MEM_ALLOC_ENABLE", None)  # each side as it sets itself
        model = subprocess.run([sys.executable, "-c", "from rlx.tiny import builtin_model; print(builtin_model('tiny'))"],
                               env=env, capture_output=True, text=True, check=True).stdout.split()[-1]
        # the prompts rlx's W0 run trains on, as text
        data = tmp / "w0.jsonl"
        code = ("import json; from rlx.tasks import TASKS, prompt_rows; rows = prompt_rows(TASKS['arithmetic'], 64); "
                f"open({str(data)!r}, 'w').write(''.join(json.dumps({{'prompt': r['prompt']}}) + '\\n' for r in rows))")
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        kept = {"MALLOC_MMAP_THRESHOLD_": str(KEEP), "MALLOC_TRIM_THRESHOLD_": str(TRIM), "THP_MEM_ALLOC_ENABLE": "1"}
        rlx_times, trl_times, trl_kept_times, lengths, trl_lengths = [], [], [], [], []

        def trl(name: str, env: dict) -> list[float]:
            result = tmp / f"{name}.json"
            subprocess.run([args.trl_python, str(HERE / "trl_grpo.py"), "--model", model, "--data", str(data),
                            "--steps", str(args.steps), "--prompts", "32", "--samples", "8", "--new-tokens", "64",
                            "--micro-batch", "64", "--prompt-tokens", "64", "--json", str(result), "--eos",
                            *(["--chat"] if args.prompts == "chat" else [])],
                           env=env, check=True, capture_output=True)
            out = json.loads(result.read_text())
            trl_lengths.extend(out["mean_length"])
            return out["step_s"][1:]

        workload = W0 + (["--set", "data.chat_template=none"] if args.prompts == "text" else [])
        for i in range(args.rounds):
            rows = run([sys.executable, "-m", "rlx_cli"], workload, env, tmp / f"rlx{i}", args.steps)
            rlx_times += step_times(rows)
            lengths += [r["response_length/mean"] for r in rows]
            trl_times += trl(f"trl{i}", env)
            if args.trl_kept_memory:
                trl_kept_times += trl(f"trl_kept{i}", {**env, **kept})
    rlx, trl = statistics.median(rlx_times), statistics.median(trl_times)
    print(f"W0 GRPO step on {os.cpu_count()} CPU cores, median of {len(rlx_times)} steps: rlx {rlx:.3f} s "
          f"(mean response {statistics.mean(lengths):.1f} tokens), TRL {trl:.3f} s (mean response "
          f"{statistics.mean(trl_lengths):.1f} tokens); TRL/rlx {trl / rlx:.2f}x "
          f"({args.prompts} prompts)")
    print(f"ranges: rlx {min(rlx_times):.3f}-{max(rlx_times):.3f} s, TRL {min(trl_times):.3f}-{max(trl_times):.3f} s")
    if trl_kept_times:
        kept_trl = statistics.median(trl_kept_times)
        print(f"TRL with memory handed out as rlx sets it: {kept_trl:.3f} s ({min(trl_kept_times):.3f}-"
              f"{max(trl_kept_times):.3f} s); TRL/rlx {kept_trl / rlx:.2f}x")


if __name__ == "__main__":
    main()
