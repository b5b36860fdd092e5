"""TRL's GRPOTrainer on the workload rlx's benchmarks run (the baseline of single_gpu.py):
one optimizer step per rollout of ``--prompts`` prompts x ``--samples`` completions,
every completion ``--new-tokens`` long (min_new_tokens; with ``--eos`` at most that long, ending at
EOS as rlx's do), temperature 1, no KL term
(rlx's GRPO default), lr 1e-6, the model in its own dtype (bf16 for W1) and no gradient
checkpointing: TRL's faster configuration. Writes the wall time of each optimizer step
(generation included) and the peak allocated GPU memory as JSON. ``--chat`` gives TRL each
prompt as one user message, which it renders with the tokenizer's chat template as rlx's
``data.chat_template=auto`` does; without it the prompt is plain text.

    python benchmarks/trl_grpo.py --model DIR --data PROMPTS.jsonl --steps 4 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--chat", action="store_true")
    parser.add_argument("--eos", action="store_true")
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    rows = [json.loads(line) for line in args.data.read_text().splitlines()]
    # prompts cut to --prompt-tokens tokens, as rlx's data.max_prompt_length does
    prompts = [tokenizer.decode(tokenizer(r["prompt"])["input_ids"][:args.prompt_tokens]) for r in rows]
    if args.chat:
        prompts = [[{"role": "user", "content": p}] for p in prompts]
    dataset = Dataset.from_list([{"prompt": p} for p in prompts])
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype="auto", attn_implementation="sdpa")
    on_gpu = torch.cuda.is_available()
    completions = args.prompts * args.samples

    def reward(completions, **_):  # cheap and varied, so advantages are not all zero
        return [len(c) % 7 / 7 for c in completions]

    config = GRPOConfig(
        output_dir=str(args.json.parent / "trl-out"), max_steps=args.steps, learning_rate=1e-6, beta=0.0,
        per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=completions // args.micro_batch,
        num_generations=args.samples, max_completion_length=args.new_tokens, temperature=1.0, top_p=1.0,
        generation_kwargs={} if args.eos else {"min_new_tokens": args.new_tokens}, num_iterations=1, bf16=on_gpu and
        model.dtype == torch.bfloat16, gradient_checkpointing=False, save_strategy="no", report_to=[],
        logging_steps=1, use_cpu=not on_gpu, seed=0, dataloader_num_workers=0)
    times: list[float] = []
    lengths: list[float] = []

    class StepTimes(TrainerCallback):
        def on_train_begin(self, *a, **k):
            self.last = time.perf_counter()

        def on_step_end(self, *a, **k):
            if on_gpu:
                torch.cuda.synchronize()
            now = time.perf_counter()
            times.append(now - self.last)
            self.last = now

        def on_log(self, args, state, control, logs=None, **k):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StepTimes()])
    trainer.train()
    peak = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None
    result = {"step_s": times, "peak_allocated_gib": peak, "mean_length": lengths}
    args.json.write_text(json.dumps(result))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
