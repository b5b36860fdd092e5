"""No cost on one device: GRPO through the role workers and the local launcher against the
single-process loop they replaced (commit 957d5c4, the last before the workers), on

- W0 (CPU): a 2-layer, hidden-128 Qwen2 (builtin:tiny), 32 prompts x 8 samples, 64 new
  tokens, on this machine's cores;
- W1 (one GPU): the Qwen2.5-0.5B shape with random bf16 weights (hidden 896, 24 layers,
  14 heads, 2 KV heads, intermediate 4864, vocab 151936, tied embeddings), 64 prompts x
  8 samples, 128-token prompts, 512 new tokens (a random model of that vocabulary all but
  never samples EOS; the mean response length is printed).

    python benchmarks/local_overhead.py [--workload w0|w1] [--baseline REV | --baseline-tree DIR] [--new-tree DIR]
                                        [--rounds 3] [--steps 6]

Both versions run as subprocesses, alternating, on the same seed: the old one from a copy
of its tree put first on PYTHONPATH (its plugins too). A step's time is time/rollout +
time/train (+ time/sync) from metrics.jsonl, the same spans in both; the first step
(warm-up) is left out. Prints the median step of each and their ratio, and checks that
both computed the same run (the same reward and loss at every step).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
W0 = ["--model", "builtin:tiny", "--data", "builtin:arithmetic", "--set", "algorithm.rollout_batch_size=32",
      "--set", "algorithm.n_samples=8", "--set", "rollout.max_new_tokens=64", "--set", "training.batch_size=256",
      "--set", "training.micro_batch_size=64", "--set", "algorithm.eval_size=0", "--set", "logging.progress=false",
      "--set", "logging.tensorboard=false", "--set", "checkpoint.save_final=false"]


W1 = ["--set", "algorithm.rollout_batch_size=64", "--set", "algorithm.n_samples=8", "--set",
      "rollout.max_new_tokens=512", "--set", "data.max_prompt_length=128", "--set", "data.max_length=1024", "--set", "data.chat_template=none",
      "--set", "training.batch_size=512", "--set", "training.micro_batch_size=16", "--set", "algorithm.eval_size=0",
      "--set", "logging.progress=false", "--set", "logging.tensorboard=false", "--set", "checkpoint.save_final=false"]


def w1_files(into: Path) -> list[str]:
    """The W1 model folder and a prompt file whose prompts are cut to 128 tokens."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rlx.tiny import make_tokenizer

    model_dir = into / "w1-model"
    tokenizer = make_tokenizer(model_dir)
    config = Qwen2Config(vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, intermediate_size=4864, max_position_embeddings=4096,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(model_dir)
    rng = random.Random(0)
    rows = []
    for _ in range(640):
        text = " ".join(f"{rng.randrange(100)}+{rng.randrange(100)}={rng.randrange(200)};" for _ in range(60))
        rows.append({"prompt": text, "label": "0"})
    data = into / "w1-prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["--model", str(model_dir), "--data", str(data), *W1]


def w1_engine():
    """The native engine over the W1 model on the GPU (batch 512), W1's 64 prompts of 128
    token ids and its sampling: 8 samples of 512 tokens, seeded."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlx.rollout import NativeEngine, SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = w1_files(Path(tmp))[1]
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    prompts = [[(7 * i + j) % 1000 + 10 for j in range(128)] for i in range(64)]
    return NativeEngine(model, tokenizer, max_batch_size=512), prompts, SamplingParams(n=8, max_new_tokens=512, seed=0)


def archive(rev: str, tree: Path, *paths: str) -> Path:
    """``rev``'s files (those under ``paths``, or all) extracted into a new folder ``tree``."""
    tree.mkdir()
    files = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *paths], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=files, check=True)
    return tree


def old_tree(rev: str, into: Path, tree: Path | None = None) -> dict:
    """The environment that imports ``rev``'s rlx and plugins (or those of an extracted
    ``tree``): its tree first on PYTHONPATH."""
    if tree is None:
        tree = archive(rev, into / "tree")
    tree = tree.resolve()  # the runs work in other folders
    packages = into / "packages"
    packages.mkdir()
    (packages / "rlx").symlink_to(tree / "core")  # its layout: core/ was `rlx`, cli/ was `rlx.cli`
    cli = tree / "core" / "cli"
    if not (cli / "__init__.py").exists():  # a copied tree may hold a dangling link
        if cli.is_symlink():
            cli.unlink()
        shutil.copytree(tree / "cli", cli)
    paths = [str(packages)] + sorted(str(p) for p in tree.glob("plugins/*/*/src"))
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def current_tree(tree: Path) -> dict:
    """The environment that imports the rlx and plugins of an extracted tree of today's layout."""
    tree = tree.resolve()
    paths = [str(tree / "core"), str(tree / "cli")] + sorted(str(p) for p in tree.glob("plugins/*/*/src"))
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def run(command: list[str], workload: list[str], env: dict, out: Path, steps: int,
        deadline: float | None = None) -> list[dict]:
    """The logged steps of a run; past ``deadline`` seconds it is stopped and the steps it
    logged so far stand."""
    try:
        result = subprocess.run([*command, "train", "--algo", "grpo", *workload, "--max-steps", str(steps),
                                 "--output", str(out)],
                                env=env, capture_output=True, text=True, cwd=out.parent, timeout=deadline)
    except subprocess.TimeoutExpired:
        result = None
    if result is not None and result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "time/rollout" in r]


def step_times(rows: list[dict]) -> list[float]:
    """Each step's wall time after the first (trees before ``time/step``: its parts)."""
    return [r.get("time/step") or r["time/rollout"] + r["time/train"] + r.get("time/sync", 0.0) for r in rows[1:]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", choices=["w0", "w1"], default="w0")
    parser.add_argument("--baseline", default="957d5c4")
    parser.add_argument("--baseline-tree", type=Path, help="an extracted tree of the baseline (no git needed)")
    parser.add_argument("--new-tree", type=Path, help="an extracted tree to measure instead of the installed rlx")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cache = {"RLX_CACHE": str(tmp / "cache")}
        workload = W0 if args.workload == "w0" else w1_files(tmp)
        old_env = {**old_tree(args.baseline, tmp, args.baseline_tree), **cache}
        new_env = {**(current_tree(args.new_tree) if args.new_tree else os.environ), **cache}
        times: dict[str, list[float]] = {"old": [], "new": []}
        runs: dict[str, list[dict]] = {}
        for i in range(args.rounds):
            for name, command, env in (("old", [sys.executable, "-m", "rlx.cli"], old_env),
                                       ("new", [sys.executable, "-m", "rlx_cli"], new_env)):
                rows = run(command, workload, env, tmp / f"{name}{i}", args.steps)
                times[name] += step_times(rows)
                runs[name] = rows
        same = all(abs(a["reward/mean"] - b["reward/mean"]) < 1e-9 and abs(a["loss/policy"] - b["loss/policy"]) < 1e-5
                   for a, b in zip(runs["old"], runs["new"]))
    old, new = statistics.median(times["old"]), statistics.median(times["new"])
    length = statistics.mean(r["response_length/mean"] for r in runs["new"])
    print(f"{args.workload.upper()} GRPO step (mean response {length:.1f} tokens), median of {len(times['new'])} "
          f"steps: loop before the workers ({args.baseline}) "
          f"{old:.3f} s, workers + local launcher {new:.3f} s; ratio new/old {new / old:.3f}")
    print(f"ranges: old {min(times['old']):.3f}-{max(times['old']):.3f} s, new {min(times['new']):.3f}-{max(times['new']):.3f} s")
    print(f"same rewards and losses at every step: {same}")


if __name__ == "__main__":
    main()
