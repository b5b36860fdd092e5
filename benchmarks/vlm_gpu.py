"""VLM rollout and GRPO step on a random Qwen2.5-VL: rlx's native engine against plain
``model.generate`` on the same prompts with images, in the same call, then the step time
of ``rlx train --algo grpo`` on the shapes task.

    python benchmarks/vlm_gpu.py [--shape 3b|tiny] [--prompts 32] [--samples 8] [--new-tokens 128]

``--shape 3b`` is Qwen2.5-VL-3B's shape (36 layers of hidden 2048, a 32-block vision tower,
the real vocabulary) in bfloat16 on the GPU; ``tiny`` the tests' model on the CPU, to check
the script. Every completion runs the full ``--new-tokens`` (EOS is never sampled by a
random model in practice; the count is reported). It also serves the images over HTTP on
127.0.0.1 and encodes the prompts again from those URLs, which go through qwen-vl-utils
(installed where torchvision works), and reports whether the tensors equal the ones read
from the files. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {
    "3b": dict(
        text=dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                  num_attention_heads=16, num_key_value_heads=2, head_dim=128, max_position_embeddings=32768,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]}),
        vision=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                    fullatt_block_indexes=[7, 15, 23, 31], window_size=112),
        dtype="bfloat16", device="cuda"),
    "tiny": dict(text=None, vision=None, dtype="float32", device="cpu"),
}


def rollout_speeds(model_path: str, data: Path, device: str, prompts: int, samples: int, new_tokens: int) -> dict:
    """Tokens per second of the native engine and of ``model.generate`` on the same prompts."""
    import torch

    from rlx import models, multimodal
    from rlx.config import resolve
    from rlx.plugins import get_host
    from rlx.rollout import NativeEngine, SamplingParams

    host = get_host()
    config = resolve(host.algorithms.get("grpo"), {"model": {"path": model_path, "dtype": "auto"},
                                                    "data": {"path": str(data), "chat_template": "none"},
                                                    "training": {"device": device}})
    tokenizer = models.load_tokenizer(model_path)
    vision = multimodal.vision_data(config, host, tokenizer).reading(str(data))
    rows = [json.loads(line) for line in data.read_text().splitlines()[:prompts]]
    encoded = [vision.encode_prompt(r) for r in rows]
    model = models.load_causal_lm(config.model, torch.device(device), trainable=False)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    engine = NativeEngine(model, tokenizer, max_batch_size=prompts * samples)
    params = SamplingParams(n=samples, max_new_tokens=new_tokens, seed=0)
    ids, inputs = [p["prompt_ids"] for p in encoded], [p["inputs"] for p in encoded]
    engine.generate(ids[:2], SamplingParams(n=2, max_new_tokens=4), inputs[:2])  # warm-up
    sync()
    started = time.perf_counter()
    completions = engine.generate(ids, params, inputs)
    sync()
    rlx_s = time.perf_counter() - started
    rlx_tokens = sum(len(c.token_ids) for c in completions)

    # the same prompts through transformers: left padding, M-RoPE from mm_token_type_ids
    width = max(len(i) for i in ids)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(i)) + i for i in ids], device=device)
    attention = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids], device=device)
    extra, _ = multimodal.collate(inputs)
    extra = {k: v.to(device) for k, v in multimodal.present(extra).items()}
    kinds = (input_ids == model.config.image_token_id).int()
    with torch.inference_mode():
        sync()
        started = time.perf_counter()
        out = model.generate(input_ids=input_ids, attention_mask=attention, mm_token_type_ids=kinds, **extra,
                             do_sample=True, max_new_tokens=new_tokens, num_return_sequences=samples,
                             pad_token_id=pad)
        sync()
    hf_s = time.perf_counter() - started
    hf_tokens = int((out[:, width:] != pad).sum())
    return {"rlx_rollout_tokens_per_s": rlx_tokens / rlx_s, "rlx_rollout_tokens": rlx_tokens, "rlx_rollout_s": rlx_s,
            "generate_tokens_per_s": hf_tokens / hf_s, "generate_tokens": hf_tokens, "generate_s": hf_s}


def url_images(model_path: str, data: Path, device: str, prompts: int) -> dict:
    """The first prompts encoded from http:// URLs (fetched by qwen-vl-utils) against the same
    prompts read from files: their ids and image tensors should be equal."""
    import functools
    import http.server
    import threading

    import torch

    from rlx import models, multimodal
    from rlx.config import resolve
    from rlx.plugins import get_host

    host = get_host()
    config = resolve(host.algorithms.get("grpo"), {"model": {"path": model_path}, "training": {"device": device},
                                                    "data": {"path": str(data), "chat_template": "none"}})
    vision = multimodal.vision_data(config, host, models.load_tokenizer(model_path)).reading(str(data))
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(data.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rows = [json.loads(line) for line in data.read_text().splitlines()[:prompts]]
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        equal = 0
        for row in rows:
            local = vision.encode_prompt(row)
            fetched = vision.encode_prompt({**row, "images": [url + name for name in row["images"]]})
            same_ids = local["prompt_ids"] == fetched["prompt_ids"]
            a, b = local["inputs"].tensors, fetched["inputs"].tensors
            equal += same_ids and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    finally:
        server.shutdown()
    return {"url_prompts": len(rows), "url_prompts_equal_to_files": equal}


def step_times(model_path: str, data: Path, out: Path, device: str, prompts: int, samples: int, new_tokens: int,
               steps: int) -> list[float]:
    """Seconds per GRPO step of ``rlx train`` (the first, warm-up, left out)."""
    settings = {"data.chat_template": "none", "training.device": device, "training.max_steps": steps,
                "training.batch_size": prompts * samples, "training.micro_batch_size": min(8, prompts * samples),
                "rollout.max_new_tokens": new_tokens, "algorithm.rollout_batch_size": prompts,
                "algorithm.n_samples": samples, "data.eval_size": 0, "logging.progress": False,
                "logging.tensorboard": False, "checkpoint.save_final": False}
    command = [sys.executable, "-m", "rlx_cli", "train", "--algo", "grpo", "--model", model_path, "--data", str(data),
               "-o", str(out)] + [arg for key, value in settings.items() for arg in ("-s", f"{key}={value}")]
    subprocess.run(command, check=True, capture_output=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/train" in r]
    return [r["time/rollout"] + r["time/logprobs"] + r["time/train"] + r["time/sync"] for r in steps][1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=sorted(SHAPES), default="3b")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    from rlx_qwen_vl.shapes import write_dataset
    from rlx_qwen_vl.tiny import make_tiny_qwen_vl

    shape = SHAPES[args.shape]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = make_tiny_qwen_vl(tmp / "model", text=shape["text"], vision=shape["vision"], dtype=shape["dtype"])
        data = write_dataset(tmp / "shapes", max(64, args.prompts), size=112)["prompts"]
        result = {"shape": args.shape, "prompts": args.prompts, "samples": args.samples, "new_tokens": args.new_tokens}
        result.update(rollout_speeds(model, data, shape["device"], args.prompts, args.samples, args.new_tokens))
        try:
            result.update(url_images(model, data, shape["device"], 8))
        except Exception as e:  # qwen-vl-utils or torchvision missing: say so, time the rest
            result["url_error"] = f"{type(e).__name__}: {e}"
        times = step_times(model, data, tmp / "run", shape["device"], args.prompts, args.samples, args.new_tokens,
                           args.steps)
        result.update(grpo_step_s=statistics.median(times), grpo_step_s_all=times)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
