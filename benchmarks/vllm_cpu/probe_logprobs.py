"""Which distribution are vLLM's returned sampled-token log-probs taken from?

    python probe_logprobs.py            # runs each mode in a fresh subprocess
    python probe_logprobs.py MODE       # one mode: raw | processed | patched

For each mode, sample with (T, top_k, top_p) settings and compare every returned
log-prob with three references computed from an HF forward of the same tokens:
  raw        log_softmax(logits)                       (T = 1, full vocab)
  scaled     log_softmax(logits / T)                   (full vocab)
  truncated  log_softmax(top-k/top-p(logits / T))      (vLLM's own apply_top_k_top_p)
"""

from __future__ import annotations

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SETTINGS = [
    ("greedy", dict(greedy=True)),
    ("T=0.7", dict(temperature=0.7)),
    ("T=0.7 top_k=20", dict(temperature=0.7, top_k=20)),
    ("T=0.7 top_p=0.8", dict(temperature=0.7, top_p=0.8)),
    ("T=1.3 top_k=20 top_p=0.8", dict(temperature=1.3, top_k=20, top_p=0.8)),
]


def run(mode: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    from common import FULL_VOCAB, model_path, vllm_engine
    from rlx.rollout import SamplingParams

    path = model_path()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [tok(t)["input_ids"] for t in ["12+30=", "the cat sat on", "99+1=100. copy", "count of"]]

    if mode == "raw":  # vLLM's default mode
        engine = vllm_engine(path, logprobs_mode="raw_logprobs", without=(FULL_VOCAB,))
    elif mode == "processed":
        engine = vllm_engine(path, without=(FULL_VOCAB,))
    else:
        engine = vllm_engine(path)  # processed_logprobs + the engine's full-vocabulary patch
    print(f"== mode {mode}: logprobs_mode={engine.llm.llm_engine.model_config.logprobs_mode}")
    for name, kw in SETTINGS:
        params = SamplingParams(n=4, max_new_tokens=12, seed=11, **kw)
        outs = engine.generate(prompts, params)
        T = 1.0 if kw.get("greedy") else kw["temperature"]
        k, p = kw.get("top_k", 0), kw.get("top_p", 1.0)
        worst = {"raw": 0.0, "scaled": 0.0, "truncated": 0.0}
        for c in outs:
            ids = torch.tensor([prompts[c.prompt_index] + c.token_ids])
            with torch.no_grad():
                logits = hf(ids).logits[0, len(prompts[c.prompt_index]) - 1 : -1].float()
            tokens = torch.tensor(c.token_ids)[:, None]
            got = torch.tensor(c.logprobs)
            refs = {
                "raw": logits.log_softmax(-1),
                "scaled": (logits / T).log_softmax(-1),
                "truncated": apply_top_k_top_p(
                    (logits / T).clone(),
                    torch.full((len(logits),), k, dtype=torch.int32) if k > 0 else None,
                    torch.full((len(logits),), p) if p < 1.0 else None,
                ).log_softmax(-1),
            }
            for key, ref in refs.items():
                d = (ref.gather(-1, tokens).squeeze(-1) - got).abs().nan_to_num(nan=float("inf")).max().item()
                worst[key] = max(worst[key], d)
        summary = "  ".join(f"{key}: {v:.1e}" for key, v in worst.items())
        match = [key for key, v in worst.items() if v < 1e-5]
        print(f"  {name:26s} max|d| vs {summary}   -> matches {match or 'none'}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        run(sys.argv[1])
    else:
        for mode in ("raw", "processed", "patched"):
            r = subprocess.run([sys.executable, __file__, mode], capture_output=True, text=True)
            lines = [line for line in r.stdout.splitlines() if line.startswith(("==", "  "))]
            print("\n".join(lines))
            if r.returncode:
                print(r.stderr[-3000:])
