"""Single-GPU speed on W1 (the Qwen2.5-0.5B shape with random bf16 weights, 64 prompts x 8
samples, 128-token prompts, 512 new tokens), every figure a ratio against a baseline run in
the same call:

- rollout: rlx's native engine against ``model.generate`` (same model, prompts and sampling
  settings), in generated tokens/s, and the engine's log-probs against a forward pass;
- log-prob pass: the policy worker's no-grad log-probs over the rollout's batch, tokens/s,
  against a plain pass in transformers over a batch of the same shape (``plain``);
- update: the update inside each GRPO run's step, tokens/s, against a plain bf16 training
  loop over that batch (``plain``: forward, backward, fused AdamW);
- GRPO step: ``rlx train --algo grpo`` against TRL's ``GRPOTrainer`` (bf16 weights, no
  gradient checkpointing), each in its own process, with the GPU memory nvidia-smi reports
  sampled every 0.5 s, and the same run in other settings (``ARMS``);
- PPO step (``ppo_mb32_lean``): ``rlx train --algo ppo`` on the same workload, its step time
  and memory alone.

A step's time is the trainer's ``time/step``: everything from taking a rollout (with
overlap, only the part not hidden behind the last update) to logging the step, as TRL's is
from one step's end to the next.

    python benchmarks/single_gpu.py [--parts rollout,plain,grpo,grpo_awake,grpo_sleep,grpo_lean,grpo_mb32,grpo_mb32_lean,
                                             grpo_overlap,grpo_overlap_lean,ppo_mb32_lean,trl]
                                    [--steps 4] [--trl-steps N] [--out DIR] [--profile | --timeline]
                                    [--arm grpo_NAME=key=value,key=value ...]

``--trl-steps`` runs TRL for more steps than rlx (its step moves by up to half from one step
to the next on some hosts, so the median of a few is a rough baseline); by default as many.

``--arm`` adds an arm of its own settings to the call (its name, before the ``=``, starts with
the algorithm), as ``ARMS`` holds the named ones: ``--arm grpo_mb64=rollout.sleep=true,training.micro_batch_size=64``.

The update's tokens/s and MFU are those inside each GRPO run's step (its ``time/train``), the
log-prob pass's those of the rollout part; tokens/s count every sample's prompt and response
tokens (what the batch holds), and again only the tokens the passes run (each prompt once per
micro-batch holding its samples); MFU counts the FLOPs the card computes (``flops.py``)
against the bf16 matmul rate measured at the start of the call, and against the 790 TFLOP/s
measured on the H200.

Prints a Markdown table (``table``) and writes ``single_gpu.json`` to ``--out``; with ``--profile`` each rlx run
is profiled on the host after its first step (``step_profile.py``), into
``<arm>_profile.txt`` there; with ``--timeline`` its third step's GPU idle time is traced
(``step_timeline.py``) into ``<arm>_timeline.txt``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from flops import matmul_rate, pass_flops  # noqa: E402
from local_overhead import w1_files  # noqa: E402

PROMPTS, SAMPLES, PROMPT_LEN, NEW_TOKENS = 64, 8, 128, 512


class GpuMemory:
    """nvidia-smi's used memory, sampled every 0.5 s while the block runs (GiB)."""

    def __enter__(self):
        self.samples: list[float] = []
        self.proc = None
        if shutil.which("nvidia-smi") is None:  # a CPU machine: nothing to sample
            return self
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                      "-lms", "500"], stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        return self

    def _read(self):
        for line in self.proc.stdout:
            if line.strip().isdigit():
                self.samples.append(int(line) / 1024)

    def __exit__(self, *exc):
        if self.proc is None:
            return
        self.proc.terminate()
        self.thread.join(timeout=5)

    def summary(self) -> dict:
        s = self.samples or [0.0]
        return {"peak_gib": max(s), "median_gib": statistics.median(s)}


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, time.perf_counter() - start


def own_process(fn, *args):
    """``fn(*args)`` in a fresh process, so that the GPU memory it held leaves with it before
    the runs whose nvidia-smi peaks would count it."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def prompt_runs(micro: int) -> int:
    """How often a prompt is run in a pass of micro-batches of ``micro`` samples, a prompt's
    samples side by side: once per micro-batch that holds some of them (shared prompts)."""
    return -(-SAMPLES // micro)


def computed_tokens(micro: int) -> int:
    """The tokens such a pass runs: each prompt ``prompt_runs`` times, every response."""
    return PROMPTS * prompt_runs(micro) * PROMPT_LEN + PROMPTS * SAMPLES * NEW_TOKENS


def prompt_ids(tokenizer, data: Path) -> list[list[int]]:
    rows = [json.loads(line) for line in data.read_text().splitlines()[:PROMPTS]]
    return [tokenizer(r["prompt"])["input_ids"][:PROMPT_LEN] for r in rows]


def rollout_part(model_dir: str, data: Path, results: dict) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlx.online import batch_of_completions
    from rlx.rollout import NativeEngine, SamplingParams
    from rlx.config import TrainingConfig
    from rlx.models import compile_layers
    from rlx.workers.forward import batched, forward_micro_batch, response_logprobs

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    model.eval()
    prompts = prompt_ids(tokenizer, data)
    ids = torch.tensor(prompts, device="cuda")

    def hf_generate(new_tokens: int):
        with torch.inference_mode():
            return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                  top_p=1.0, top_k=0, num_return_sequences=SAMPLES, max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, pad_token_id=tokenizer.pad_token_id)

    hf_generate(NEW_TOKENS)  # warm-up (its first long run was 4x slower than the next)
    hf_times = [timed(lambda: hf_generate(NEW_TOKENS))[1] for _ in range(3)]
    hf_rate = PROMPTS * SAMPLES * NEW_TOKENS / statistics.median(hf_times)

    engine = NativeEngine(model, tokenizer, max_batch_size=PROMPTS * SAMPLES)
    params = SamplingParams(n=SAMPLES, max_new_tokens=NEW_TOKENS, seed=0)
    _, first = timed(lambda: engine.generate(prompts, params))  # captures the decode graphs
    runs = [timed(lambda: engine.generate(prompts, params)) for _ in range(3)]
    completions = runs[-1][0]
    generated = sum(len(c.token_ids) for c in completions)
    rlx_rate = generated / statistics.median(t for _, t in runs)
    same_seed = all(a.token_ids == b.token_ids for a, b in zip(runs[0][0], runs[1][0]))

    # the engine's log-probs against the trainer's forward over the same tokens
    batch = batch_of_completions([p for p in prompts for _ in range(SAMPLES)], completions, tokenizer.pad_token_id,
                                 [0.0] * len(completions), [i // SAMPLES for i in range(len(completions))], "cuda")
    # as the policy worker runs it by default: layers compiled, 4x the training micro-batch
    compile_layers(model, "auto")
    micro = forward_micro_batch(TrainingConfig(micro_batch_size=16))
    with torch.inference_mode():
        logp, _ = timed(lambda: batched(lambda part: response_logprobs(model, part, 1.0)[0], batch, micro))  # compiles
        logp, logp_time = timed(lambda: batched(lambda part: response_logprobs(model, part, 1.0)[0], batch, micro))
    mask = batch.action_mask
    diff = ((logp - batch.rollout_logp).abs() * mask)
    results["rollout"] = {
        "hf_generate_tokens_per_s": hf_rate, "hf_times_s": hf_times,
        "rlx_tokens_per_s": rlx_rate, "rlx_times_s": [t for _, t in runs], "rlx_first_call_s": first,
        "ratio_rlx_over_hf": rlx_rate / hf_rate, "generated_tokens": generated,
        "same_samples_for_same_seed": same_seed,
        "logp_diff_mean": (diff.sum() / mask.sum()).item(), "logp_diff_max": diff.max().item(),
    }
    tokens = batch.attention_mask.sum().item()
    flops = pass_flops(model.config, PROMPTS, SAMPLES, PROMPT_LEN, NEW_TOKENS, prompt_runs(micro), backward=False)
    results["logprobs"] = {"tokens": tokens, "time_s": logp_time, "tokens_per_s": tokens / logp_time,
                           "computed_tokens_per_s": computed_tokens(micro) / logp_time, "flops": flops}
    del model, engine
    torch.cuda.empty_cache()


def plain_part(model_dir: str) -> dict:
    """The plain baselines of the same batch (512 rows of 128 + 512 tokens), in transformers
    and torch alone: a no-grad log-prob pass (logits at the response positions, a float32
    log-softmax, each token's picked, micro-batches of 64 as rlx's pass) and a bf16 training
    loop (the same log-probs' mean as the loss, backward, fused AdamW, micro-batches of 16).
    Run in a process of its own (``own_process``)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    ids = torch.randint(10, 1000, (PROMPTS * SAMPLES, PROMPT_LEN + NEW_TOKENS), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(0))

    def logp(part):
        logits = model(input_ids=part, logits_to_keep=NEW_TOKENS + 1).logits[:, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, part[:, -NEW_TOKENS:, None]).squeeze(-1)

    def logprob_pass():
        with torch.inference_mode():
            for part in ids.split(64):
                logp(part)

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)

    def train_step():
        for part in ids.split(16):
            (-logp(part).mean() * 16 / len(ids)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    tokens, results = ids.numel(), {}
    for name, fn in (("plain_logprobs", logprob_pass), ("plain_update", train_step)):
        timed(fn)  # warm-up
        times = [timed(fn)[1] for _ in range(3)]
        results[name] = {"tokens": tokens, "times_s": times, "tokens_per_s": tokens / statistics.median(times)}
    return results


def rlx_run(algo: str, args: list[str], out: Path, steps: int, profile: Path | None = None,
            plugin: str = "step_profile", log: Path | None = None) -> dict:
    cmd = [sys.executable, "-m", "rlx_cli", "train", "--algo", algo, *args, "--set", "rollout.max_batch_size=512",
           "--max-steps", str(steps), "--output", str(out)]
    env = os.environ
    if profile is not None:
        cmd += ["--plugin", f"{plugin}:plugin"]
        env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))}
    with GpuMemory() as memory:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"rlx train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    if profile is not None:
        profile.write_text(proc.stdout)
    if log is not None:  # its warnings, and whatever TORCH_LOGS asks for
        log.write_text(proc.stderr)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/rollout" in r]
    step = [r["time/step"] for r in rows]
    micro = yaml.safe_load((out / "config.yaml").read_text())["training"]["micro_batch_size"]
    return {"micro_batch_size": micro, "step_s": step, "rollout_s": [r["time/rollout"] for r in rows],
            "train_s": [r["time/train"] for r in rows],
            "logprobs_s": [r.get("time/logprobs") for r in rows],
            "peak_reserved_gib": [r.get("memory/peak_reserved_gib") for r in rows],
            **{k: [r.get(f"memory/{k}") for r in rows] for k in ("rollout_peak_gib", "before_update_gib", "update_peak_gib")},
            "median_step_s": statistics.median(step[1:]), **memory.summary()}


def trl_grpo(model_dir: str, data: Path, steps: int) -> dict:
    script = HERE / "trl_grpo.py"
    with tempfile.TemporaryDirectory() as tmp, GpuMemory() as memory:
        result = Path(tmp) / "trl.json"
        proc = subprocess.run([sys.executable, str(script), "--model", model_dir, "--data", str(data), "--steps",
                               str(steps), "--json", str(result)], capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"TRL failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
        found = json.loads(result.read_text())
    return {**found, "median_step_s": statistics.median(found["step_s"][1:]), **memory.summary()}


# rlx's runs besides GRPO's defaults (``grpo``), each setting named so that an arm measures
# the same run whatever the defaults become; an arm's name starts with its algorithm
ARMS = {
    # the engine's cache and graphs kept through the update (the default before rollout.sleep=auto)
    "grpo_awake": ["rollout.sleep=false", "training.compile_memory=1"],
    # the engine's cache and graphs freed while the policy trains
    "grpo_sleep": ["rollout.sleep=true", "training.compile_memory=1"],
    # asleep, and compiled layers that recompute elementwise outputs rather than keep them:
    # the defaults on one GPU
    "grpo_lean": ["rollout.sleep=true", "training.compile_memory=0.8"],
    # micro-batches of 32 (50 % MFU on the update alone) with fewer activations kept: 0.6 peaked
    # 0.1 GiB above TRL, 0.5 1.2 GiB below it at the same speed (docs/benchmarks-log.md)
    "grpo_mb32": ["rollout.sleep=true", "training.micro_batch_size=32", "training.compile_memory=0.6"],
    "grpo_mb32_lean": ["rollout.sleep=true", "training.micro_batch_size=32", "training.compile_memory=0.5"],
    # the next rollout generated while the policy trains, on the same GPU
    "grpo_overlap": ["rollout.overlap=true", "algorithm.off_policy_correction=tis", "training.compile_memory=1"],
    "grpo_overlap_lean": ["rollout.overlap=true", "algorithm.off_policy_correction=tis",
                          "training.compile_memory=0.5"],
    # PPO on the same workload, as grpo_mb32_lean: a critic (values, its update), the
    # reference's and the old log-probs beside the policy's update; no baseline of its own
    "ppo_mb32_lean": ["rollout.sleep=true", "training.micro_batch_size=32", "training.compile_memory=0.5"],
}


def main() -> None:
    from transformers import AutoConfig

    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", default="rollout,plain,grpo,trl")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--trl-steps", type=int, default=0, help="TRL's steps (0: --steps)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--timeline", action="store_true")
    parser.add_argument("--arm", action="append", default=[], help="NAME=key=value,key=value: an arm of one's own")
    args = parser.parse_args()
    parts = args.parts.split(",")
    arms = dict(ARMS)
    for arm in args.arm:
        name, _, settings = arm.partition("=")
        if not name.startswith(("grpo_", "ppo_")) or not settings:
            raise SystemExit(f"--arm {arm!r}: give NAME=key=value,... with NAME starting grpo_ or ppo_")
        arms[name] = settings.split(",")
        parts.append(name)
    results: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["RLX_CACHE"] = str(tmp / "cache")
        workload = w1_files(tmp)
        model_dir, data = workload[1], Path(workload[3])
        args.out.mkdir(parents=True, exist_ok=True)

        def traced(arm: str) -> tuple:  # where an arm's profile goes, and which plugin makes it
            if args.timeline:
                return args.out / f"{arm}_timeline.txt", "step_timeline"
            return (args.out / f"{arm}_profile.txt" if args.profile else None,)

        def save() -> None:  # after each part, so that a call cut short keeps what it measured
            (args.out / "single_gpu.json").write_text(json.dumps(results, indent=1))

        if any(p != "trl" for p in parts):  # what MFU is set against: this card's rate, measured now
            results["matmul_tflops"] = matmul_rate() / 1e12
        if "trl" in parts:  # the baseline first
            results["trl_grpo"] = trl_grpo(model_dir, data, args.trl_steps or args.steps)
            save()
        if "rollout" in parts:
            rollout_part(model_dir, data, results)
            save()
        if "plain" in parts:
            results.update(own_process(plain_part, model_dir))
            save()
        if "grpo" in parts:
            results["rlx_grpo"] = rlx_run("grpo", workload, tmp / "rlx-run", args.steps, *traced("grpo"),
                                          log=args.out / "grpo_stderr.txt")
            save()
        for name, settings in arms.items():
            if name in parts:
                sets = [a for s in settings for a in ("--set", s)]
                results[f"rlx_{name}"] = rlx_run(name.split("_")[0], [*workload, *sets], tmp / name, args.steps,
                                                 *traced(name), log=args.out / f"{name}_stderr.txt")
                save()
        config = AutoConfig.from_pretrained(model_dir)
    for name, a in results.items():  # the update inside each GRPO run's step: tokens/s and MFU
        if name.startswith("rlx_grpo"):
            train = statistics.median(a["train_s"][1:])
            flops = pass_flops(config, PROMPTS, SAMPLES, PROMPT_LEN, NEW_TOKENS, prompt_runs(a["micro_batch_size"]),
                               backward=True)
            a.update(update_s=train, update_tokens_per_s=PROMPTS * SAMPLES * (PROMPT_LEN + NEW_TOKENS) / train,
                     update_computed_tokens_per_s=computed_tokens(a["micro_batch_size"]) / train,
                     update_flops=flops, update_mfu=flops / train / (results["matmul_tflops"] * 1e12),
                     update_mfu_790=flops / train / 790e12)
    if "logprobs" in results:
        lp = results["logprobs"]
        rate = lp["flops"] / lp["time_s"]
        lp.update(mfu=rate / (results["matmul_tflops"] * 1e12), mfu_790=rate / 790e12)
    save()
    print(json.dumps(results, indent=1))
    print(table(results))


def table(results: dict) -> str:
    """The measurements of a call as a Markdown table: rlx, the baseline of the same call, the ratio."""
    lines = ["| | rlx | baseline, same call | ratio |", "|---|---|---|---|"]

    def row(what, ours, theirs="", ratio=None):
        lines.append(f"| {what} | {ours} | {theirs} | {f'{ratio:.2f}x' if ratio else ''} |")

    def mfu(measured, h200):
        return f"MFU {measured:.1%} ({h200:.1%} of 790 TFLOP/s)"

    if "rollout" in results:
        r = results["rollout"]
        row("rollout, generated tokens/s", f"{r['rlx_tokens_per_s']:,.0f}",
            f"{r['hf_generate_tokens_per_s']:,.0f} (`model.generate`)", r["ratio_rlx_over_hf"])
    plain_lp, plain_up = results.get("plain_logprobs"), results.get("plain_update")
    if "logprobs" in results:
        lp = results["logprobs"]
        row("log-prob pass, tokens/s", f"{lp['tokens_per_s']:,.0f} ({lp['computed_tokens_per_s']:,.0f} run), "
            f"{mfu(lp['mfu'], lp['mfu_790'])}", f"{plain_lp['tokens_per_s']:,.0f} (plain)" if plain_lp else "",
            plain_lp and lp["tokens_per_s"] / plain_lp["tokens_per_s"])
    trl = results.get("trl_grpo")
    for name, a in results.items():
        if name.startswith("rlx_grpo"):
            row(f"`{name[4:]}` update inside the step, tokens/s",
                f"{a['update_tokens_per_s']:,.0f} ({a['update_computed_tokens_per_s']:,.0f} run), "
                f"{mfu(a['update_mfu'], a['update_mfu_790'])}",
                f"{plain_up['tokens_per_s']:,.0f} (plain bf16 loop)" if plain_up else "",
                plain_up and a["update_tokens_per_s"] / plain_up["tokens_per_s"])
            row(f"`{name[4:]}` GRPO step", f"{a['median_step_s']:.2f} s",
                f"{trl['median_step_s']:.2f} s (TRL)" if trl else "", trl and trl["median_step_s"] / a["median_step_s"])
            row(f"`{name[4:]}` peak GPU memory", f"{a['peak_gib']:.1f} GiB",
                f"{trl['peak_gib']:.1f} GiB (TRL)" if trl else "")
        elif name.startswith("rlx_ppo"):
            rollout, train = (statistics.median(a[k][1:]) for k in ("rollout_s", "train_s"))
            row(f"`{name[4:]}` PPO step", f"{a['median_step_s']:.2f} s (rollout {rollout:.2f} s, train {train:.2f} s), "
                f"peak {a['peak_gib']:.1f} GiB")
    if "matmul_tflops" in results:
        lines.append(f"\nbf16 matmul rate measured in this call: {results['matmul_tflops']:.0f} TFLOP/s. "
                     "tokens/s count every sample's prompt and response tokens; 'run', each prompt once per "
                     "micro-batch, as the passes run them; MFU counts the FLOPs the card computes (flops.py).")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
