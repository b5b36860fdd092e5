"""W1's GRPO step at other model sizes and generation lengths (one GPU): the Qwen2.5-0.5B,
1.5B and 7B shapes with random bf16 weights, 64 prompts x 8 samples, 128-token prompts, 512
or 2048 new tokens, through ``rlx train --algo grpo``, with the GPU memory nvidia-smi
reports every 0.5 s.

The 7B shape trains LoRA adapters (rank 16) with gradient checkpointing: full fine-tuning
keeps float32 master weights and AdamW's two states beside the bf16 weights and their
gradients, 16 bytes a parameter (122 GB), which leaves no room for the engine's cache. The
training micro-batch shrinks as responses grow so that activations stay near W1's.

    python benchmarks/scaling.py [--shapes 0.5b,1.5b,7b] [--lengths 512,2048] [--steps 3] [--out DIR]
                                 [--deadline SECONDS]

Writes ``scaling.json`` (every case's step times, rollout and update split, and memory) to
``--out`` and prints a table. ``--shapes tiny --lengths 16`` runs the same code on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_overhead import run  # noqa: E402
from single_gpu import GpuMemory  # noqa: E402

SHAPES = {
    "tiny": dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=128, tie_word_embeddings=True),
    "0.5b": dict(vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True),
    "1.5b": dict(vocab_size=151936, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, intermediate_size=8960, tie_word_embeddings=True),
    "7b": dict(vocab_size=152064, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, intermediate_size=18944, tie_word_embeddings=False),
}
PROMPTS, SAMPLES, PROMPT_LEN = 64, 8, 128


def model_files(shape: str, into: Path) -> tuple[Path, Path]:
    """A random bf16 model of ``shape`` with rlx's small byte-level tokenizer, and prompts
    that run past 128 tokens (cut to 128 by ``data.max_prompt_length``)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rlx.tiny import make_tokenizer

    model_dir = into / f"{shape}-model"
    tokenizer = make_tokenizer(model_dir)
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=4096, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(model_dir)
    rng = random.Random(0)
    data = into / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": " ".join(f"{rng.randrange(100)}+{rng.randrange(100)};"
                                                               for _ in range(60)), "label": "0"}) + "\n"
                            for _ in range(PROMPTS * 10)))
    return model_dir, data


def settings(shape: str, length: int) -> list[str]:
    micro = 1 << (16 * 640 // (PROMPT_LEN + length)).bit_length() - 1  # a power of two: it divides the batch
    options = {"algorithm.rollout_batch_size": PROMPTS, "algorithm.n_samples": SAMPLES,
               "rollout.max_new_tokens": length, "data.max_prompt_length": PROMPT_LEN,
               "data.max_length": PROMPT_LEN + length, "data.chat_template": "none",
               "training.batch_size": PROMPTS * SAMPLES, "training.micro_batch_size": micro,
               "rollout.max_batch_size": PROMPTS * SAMPLES, "algorithm.eval_size": 0, "logging.progress": "false",
               "logging.tensorboard": "false", "checkpoint.save_final": "false"}
    if shape == "7b":
        options.update({"model.lora.rank": 16, "model.gradient_checkpointing": "true", "training.lr": 1e-5})
    return [a for k, v in options.items() for a in ("--set", f"{k}={v}")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="0.5b,1.5b,7b")
    parser.add_argument("--lengths", default="512,2048")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--deadline", type=float, help="seconds a case may run: the steps logged by then stand")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cases = []
    for shape in args.shapes.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            model_dir, data = model_files(shape, tmp)
            for length in map(int, args.lengths.split(",")):
                out = tmp / f"run-{length}"
                command = [sys.executable, "-m", "rlx_cli"]
                workload = ["--model", str(model_dir), "--data", str(data), *settings(shape, length)]
                with GpuMemory() as memory:
                    rows = run(command, workload, dict(os.environ), out, args.steps, args.deadline)
                if not rows:
                    raise SystemExit(f"{shape}/{length}: no step finished within --deadline {args.deadline:g} s")
                later = rows[1:] or rows  # the first step compiles and captures
                step = [r["time/rollout"] + r["time/train"] + r["time/sync"] for r in later]
                generated = statistics.mean(r["response_length/mean"] for r in later) * PROMPTS * SAMPLES
                case = {"shape": shape, "new_tokens": length, "steps": len(rows),
                        "median_step_s": statistics.median(step),
                        "rollout_s": [r["time/rollout"] for r in rows], "train_s": [r["time/train"] for r in rows],
                        "generated_tokens_per_s": generated / statistics.median(r["time/rollout"] for r in later),
                        **memory.summary()}
                cases.append(case)
                print(json.dumps(case), flush=True)
                # after each case: a later one may outlast the call
                (args.out / "scaling.json").write_text(json.dumps(cases, indent=1))
    print("| shape | new tokens | step (s) | rollout tokens/s | peak GiB |\n|---|---|---|---|---|")
    for c in cases:
        print(f"| {c['shape']} | {c['new_tokens']} | {c['median_step_s']:.2f} | {c['generated_tokens_per_s']:,.0f} "
              f"| {c['peak_gib']:.1f} |")


if __name__ == "__main__":
    main()
