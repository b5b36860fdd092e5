"""What update_weights does with names / shapes / dtypes it does not expect.

    python probe_names.py          # with the engine's pre-checks
    python probe_names.py --raw    # pre-checks off: what vLLM itself does (it breaks the engine)
"""
import os
import sys
import threading

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from common import compare, model_path, vllm_engine
from rlx.rollout import SamplingParams

if __name__ == "__main__":
    path = model_path()
    hf = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [tok(t)["input_ids"] for t in ["12+30=", "the cat sat on"]]
    g = SamplingParams(greedy=True, max_new_tokens=8)
    e = vllm_engine(path)
    raw = "--raw" in sys.argv
    if raw:
        e._check = lambda named: None
    print(f"[names] mode: {'raw (no pre-checks)' if raw else 'engine pre-checks on'}")
    sd = hf.state_dict()

    def check(label, timeout=120):
        # a broken engine can hang in generate (raw mode): give up on it after `timeout` s
        result = {}

        def run():
            try:
                result["out"] = e.generate(prompts, g)
            except Exception as exc:
                result["exc"] = exc

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive():
            print(f"[names]   then generate: no answer after {timeout} s; stopping")
            sys.stdout.flush()
            os._exit(0)
        if "exc" in result:
            exc = result["exc"]
            print(f"[names]   then generate: {type(exc).__name__}: {str(exc)[:200]}")
        else:
            print(f"[names]   then generate vs HF: {compare(hf, prompts, result['out']):.2e} ({label})")

    cases = [("bf16 tensors into the fp32 engine", {k: v.to(torch.bfloat16) for k, v in sd.items()}),
             ("state dict without lm_head.weight (tied)", {k: v for k, v in sd.items() if k != "lm_head.weight"}),
             ("'module.' prefix (DDP/DeepSpeed style)", {"module." + k: v for k, v in sd.items()}),
             ("unknown name", {"foo.bar.weight": torch.zeros(3)}),
             ("wrong shape", {**sd, "model.norm.weight": torch.ones(7)}),
             ("only layer 0 q_proj (partial)", {k: v for k, v in sd.items() if ".0.self_attn.q_proj." in k}),
             ("full valid state dict after the failures", sd),
             ("full valid state dict again", sd)]
    for label, named in cases:
        try:
            e.update_weights(named)
            print(f"[names] {label}: accepted")
        except Exception as exc:
            print(f"[names] {label}: {type(exc).__name__}: {' | '.join(str(exc).splitlines())[:160]}")
        check(label)
    sys.stdout.flush()
    os._exit(0)  # after a failed raw reload the engine loop does not shut down
