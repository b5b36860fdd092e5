"""Prompts run once for their samples, on one GPU: W1's update and log-prob pass with
``training.share_prompts`` on and off, and the shared row's log-probs and gradients against
the padded forward's.

    python benchmarks/shared_prompts.py [--out DIR] [--micro 32 --memory 0.5]
        [--prompt-len 128 --response-len 512] [--no-check]

W1's batch here is what a GRPO step trains on: 64 prompts of 128 tokens, 8 samples each, 512
response tokens. With sharing, a micro-batch of 32 runs 4 prompts and 32 responses (16,896
tokens) instead of 32 prompts and 32 responses (20,480). Each setting runs in a process of
its own, so that the compiled layers see one kind of row; the check runs a smaller float32
model in float32 and bfloat16, with the layers eager and compiled.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_overhead import w1_files  # noqa: E402
from single_gpu import timed  # noqa: E402

PEAK = 790e12
PROMPTS, SAMPLES, PROMPT_LEN, RESPONSE_LEN = 64, 8, 128, 512


def grouped_batch(vocab: int, prompts: int, samples: int, prompt_len: int, response_len: int, ragged: bool,
                  device: str = "cuda"):
    """``samples`` responses to each of ``prompts`` prompts; with ``ragged`` the prompts are
    left-padded and the responses end at lengths of their own."""
    from rlx.online import batch_of_completions
    from rlx.rollout import Completion

    g = torch.Generator().manual_seed(0)
    prompt_ids = []
    for _ in range(prompts):
        n = int(torch.randint(prompt_len // 2, prompt_len + 1, (), generator=g)) if ragged else prompt_len
        prompt_ids.append(torch.randint(10, vocab, (n,), generator=g).tolist())
    completions = []
    for i in range(prompts * samples):
        n = int(torch.randint(1, response_len + 1, (), generator=g)) if ragged else response_len
        completions.append(Completion(i // samples, torch.randint(10, vocab, (n,), generator=g).tolist(),
                                      [-12.0] * n, "", "length"))
    rows = prompts * samples
    batch = batch_of_completions([prompt_ids[i // samples] for i in range(rows)], completions, 0, [0.0] * rows,
                                 [i // samples for i in range(rows)], device)
    batch.advantages = torch.randn(batch.action_mask.shape, generator=g).to(device) * batch.action_mask
    return batch


def check() -> dict:
    """The shared row's log-probs and gradients against the padded forward's: in float32
    (its attention segment by segment through SDPA) and in bfloat16 (the flash kernel), with
    the layers eager and compiled."""
    import transformers

    from rlx import varlen
    from rlx.workers import forward

    varlen.register()
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        config = transformers.Qwen2Config(vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=512, tie_word_embeddings=True,
                                          attn_implementation=varlen.NAME)
        model = transformers.Qwen2ForCausalLM(config).to("cuda", dtype)
        batch = grouped_batch(1000, 4, 4, 40, 60, ragged=True)
        batch = batch.select(torch.randperm(len(batch)).tolist())  # a prompt's samples apart
        weights = torch.randn(batch.action_mask.shape, device="cuda")

        def run(share):
            model.zero_grad()
            logp, _ = forward.response_logprobs(model, batch, 0.7, share=share)
            (logp * weights).sum().backward()
            return logp.detach(), {n: p.grad.float().clone() for n, p in model.named_parameters()}

        want, want_grads = run(False)
        for layers in ("eager", "compiled"):
            if layers == "compiled":
                for layer in model.model.layers:
                    layer.compile()
            got, grads = run(True)
            worst = max(((grads[n] - want_grads[n]).norm() / want_grads[n].norm()).item() for n in grads)
            name = f"{str(dtype).split('.')[1]}_{layers}"
            results[name] = {"logp_diff_max": (got - want).abs().max().item(), "grad_rel_diff_max": worst}
            print(f"check, {name}: log-probs within {results[name]['logp_diff_max']:.2e}, "
                  f"gradients within {worst:.2e} (relative)", flush=True)
    return results


def case(model_dir: str, share: bool, micro: int, memory: float, steps: int, prompt_len: int = PROMPT_LEN,
         response_len: int = RESPONSE_LEN) -> dict:
    """The policy worker's ``train_step`` and ``logprobs`` over W1's batch, as ``rlx train``
    runs them on one GPU."""
    from rlx.config import resolve
    from rlx.plugins import build_host
    from rlx.workers.policy import PolicyWorker

    host = build_host()
    rows = PROMPTS * SAMPLES
    config = resolve(host.algorithms.get("grpo"), {
        "model": {"path": model_dir},
        "training": {"batch_size": rows, "micro_batch_size": micro, "compile_memory": memory, "lr": 1e-6,
                     "share_prompts": share},
        "algorithm": {"rollout_batch_size": PROMPTS, "n_samples": SAMPLES}, "rollout": {"max_new_tokens": response_len}})
    policy = PolicyWorker(config, host, total_steps=100, micro_steps=rows // micro)
    module = policy.module()
    n_params = sum(p.numel() for p in module.parameters())
    batch = grouped_batch(module.config.vocab_size, PROMPTS, SAMPLES, prompt_len, response_len, ragged=False)
    tokens, actions = batch.attention_mask.sum().item(), batch.action_mask.sum().item()

    logp, _ = timed(lambda: policy.logprobs(batch))  # compiles
    logp, logp_s = timed(lambda: policy.logprobs(batch))
    def train():
        return policy.train_step(batch, token_count=actions, seq_count=rows, beta=0.0)

    _, first = timed(train)  # compiles
    runs = [timed(train) for _ in range(steps)]
    times = [t for _, t in runs]
    update = statistics.median(times)
    return {"share": share, "micro": micro, "memory": memory, "tokens": tokens,
            "update_s": update, "update_times_s": times, "first_update_s": first,
            "update_mfu": 6 * n_params * tokens / update / PEAK,
            "peak_alloc_gib": max(r[1]["memory/update_peak_gib"] for r, _ in runs),
            "logprobs_s": logp_s, "logprobs_tokens_per_s": tokens / logp_s,
            "logp_sum": logp.double().sum().item(), "logp": logp.float().cpu().tolist()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--micro", type=int, default=32)
    parser.add_argument("--memory", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=PROMPT_LEN)
    parser.add_argument("--response-len", type=int, default=RESPONSE_LEN)
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # a child: MODEL_DIR:SHARE
    args = parser.parse_args()
    if args.case:
        model_dir, share = args.case.rsplit(":", 1)
        print(json.dumps(case(model_dir, share == "1", args.micro, args.memory, args.steps, args.prompt_len,
                              args.response_len)))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
               "prompt_len": args.prompt_len, "response_len": args.response_len}
    if not args.no_check:
        results["check"] = check()
    model_dir = w1_files(Path(tempfile.mkdtemp()))[1]
    for share in (False, True):
        done = subprocess.run([sys.executable, __file__, "--case", f"{model_dir}:{int(share)}", "--micro",
                               str(args.micro), "--memory", str(args.memory), "--steps", str(args.steps),
                               "--prompt-len", str(args.prompt_len), "--response-len", str(args.response_len)],
                              capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"case share={share} failed:\n{done.stderr[-4000:]}")
        results["shared" if share else "padded"] = json.loads(done.stdout.strip().splitlines()[-1])
    padded, shared = results["padded"], results["shared"]
    diff = (torch.tensor(padded.pop("logp")) - torch.tensor(shared.pop("logp"))).abs()
    results["logp_diff"] = {"mean": diff.mean().item(), "max": diff.max().item()}
    results["update_ratio"] = padded["update_s"] / shared["update_s"]
    results["logprobs_ratio"] = padded["logprobs_s"] / shared["logprobs_s"]
    print(f"W1's model, {PROMPTS} prompts of {args.prompt_len} tokens x {SAMPLES} responses of {args.response_len}, "
          f"micro-batch {args.micro}, compile_memory {args.memory} ({results['device']}, torch {torch.__version__}):")
    print("| | update | MFU | peak allocated | log-prob pass | log-prob tokens/s |")
    print("|---|---|---|---|---|---|")
    for name in ("padded", "shared"):
        r = results[name]
        print(f"| {name} | {r['update_s']:.3f} s | {r['update_mfu']:.1%} | {r['peak_alloc_gib']:.1f} GiB | "
              f"{r['logprobs_s']:.3f} s | {r['logprobs_tokens_per_s']:,.0f} |")
    print(f"shared / padded: update {results['update_ratio']:.2f}x, log-prob pass {results['logprobs_ratio']:.2f}x; "
          f"log-probs differ by {diff.mean():.4f} on average, {diff.max():.4f} at most (bf16)")
    name = f"shared_prompts_p{args.prompt_len}_r{args.response_len}_micro{args.micro}.json"
    (out / name).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
