"""Smaller facts about rlx's vLLM engine on the CPU. Each case runs in its own subprocess:

    python probe_misc.py              # all
    python probe_misc.py CASE         # inproc | tensors_mp | sleep
"""

from __future__ import annotations

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def inproc():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common import compare, model_path, vllm_engine
    from rlx.rollout import SamplingParams

    path = model_path()
    hf = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(1234)
    real = torch.set_num_threads
    e = vllm_engine(path, max_model_len=256)
    print(f"[misc] after construct: torch.initial_seed()={torch.initial_seed()} (was 1234; vLLM seed=0); "
          f"torch.set_num_threads is the real one again: {torch.set_num_threads is real}")

    # does sampling consume this process's global torch RNG?
    torch.manual_seed(5)
    ref = torch.rand(1).item()
    for seed in (None, 3):
        torch.manual_seed(5)
        e.generate([tok("12 + 30 =")["input_ids"]], SamplingParams(n=2, max_new_tokens=4, seed=seed))
        print(f"[misc] in-process generate(seed={seed}) leaves the global torch RNG untouched: {torch.rand(1).item() == ref}")
    torch.manual_seed(5)
    e.generate([tok("12 + 30 =")["input_ids"]], SamplingParams(greedy=True, max_new_tokens=4))
    print(f"[misc] in-process greedy generate leaves the global torch RNG untouched: {torch.rand(1).item() == ref}")

    # (b) stop_token_ids: take the token greedy decoding emits 3rd for a prompt
    from vllm import SamplingParams as VSP
    from vllm.inputs import TokensPrompt

    prompt = tok("12 + 30 =")["input_ids"]
    g = e.generate([prompt], SamplingParams(greedy=True, max_new_tokens=8))[0]
    for stop_id, label in ((g.token_ids[2], "ordinary"), (tok.convert_tokens_to_ids("<|im_end|>"), "special <|im_end|>")):
        r = e.llm.generate([TokensPrompt(prompt_token_ids=prompt)],
                           VSP(temperature=0, max_tokens=8, stop_token_ids=[stop_id], logprobs=0), use_tqdm=False)[0].outputs[0]
        print(f"[misc] stop_token_ids=[{stop_id}] ({label}): token_ids={list(r.token_ids)} finish={r.finish_reason} "
              f"stop_reason={r.stop_reason} text={r.text!r}")
    r = e.llm.generate([TokensPrompt(prompt_token_ids=prompt)],
                       VSP(temperature=0, max_tokens=8, logprobs=0, skip_special_tokens=False), use_tqdm=False)[0].outputs[0]
    print(f"[misc] greedy tokens {g.token_ids} text {g.text!r}")
    # which EOS ids does vLLM stop on by default?
    print(f"[misc] vLLM tokenizer eos_token_id={e.llm.get_tokenizer().eos_token_id}; "
          f"generation_config eos from model config: {e.llm.llm_engine.model_config.hf_config.eos_token_id}")

    # (c) prefix cache after a reload without reset_prefix_cache()
    long_prompts = [tok(" ".join(["the cat sat on the mat"] * 8) + f" {i} +")["input_ids"] * 2 for i in range(4)]
    print(f"[misc] long prompts: {len(long_prompts[0])} tokens (KV block size "
          f"{e.llm.llm_engine.vllm_config.cache_config.block_size})")
    g = SamplingParams(greedy=True, max_new_tokens=4)
    e.generate(long_prompts, g)  # fills the prefix cache
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    with e._own_threads_and_rng():
        e.llm.collective_rpc("rlx_load_weights", args=({k: v.detach() for k, v in hf.state_dict().items()},))
    out = e.generate(long_prompts, g)
    print(f"[misc] after reload WITHOUT reset_prefix_cache: vs HF(new) {compare(hf, long_prompts, out):.2e}")
    print(f"[misc] reset_prefix_cache() -> {e.llm.reset_prefix_cache()}")
    out = e.generate(long_prompts, g)
    print(f"[misc] after reset_prefix_cache: vs HF(new) {compare(hf, long_prompts, out):.2e}")

    # (d) max_model_len=256
    p100 = (long_prompts[0] * 3)[:228]
    out = e.generate([p100], SamplingParams(greedy=True, max_new_tokens=64))[0]
    print(f"[misc] 228-token prompt, max_new_tokens=64, max_model_len=256: {len(out.token_ids)} tokens, "
          f"finish={out.finish_reason}")
    try:
        e.generate([(long_prompts[0] * 3)[:260]], SamplingParams(greedy=True, max_new_tokens=4))
        print("[misc] 260-token prompt: accepted")
    except Exception as exc:  # noqa: BLE001
        print(f"[misc] 260-token prompt with max_model_len=256: {type(exc).__name__}: {str(exc)[:300]}")
    # (e) seeds per prompt: prompt i of a seeded call samples with seed + i*n
    a = e.generate([prompt], SamplingParams(n=2, max_new_tokens=6, seed=9))
    b = e.generate([prompt, prompt], SamplingParams(n=2, max_new_tokens=6, seed=9))
    print(f"[misc] seed=9: same tokens alone vs in a batch of 2 prompts: "
          f"{[c.token_ids for c in a] == [c.token_ids for c in b[:2]]}; the same prompt twice in one call gets the same samples: "
          f"{[c.token_ids for c in b[:2]] == [c.token_ids for c in b[2:]]}")


def tensors_mp():
    from transformers import AutoModelForCausalLM

    from common import model_path, vllm_engine

    path = model_path()
    hf = AutoModelForCausalLM.from_pretrained(path).eval()
    e = vllm_engine(path, multiprocess=True)
    try:
        e.llm.collective_rpc("rlx_load_weights", args=({k: v.detach() for k, v in hf.state_dict().items()},))
        print("[misc] multiprocess: tensors in collective_rpc args: accepted")
    except Exception as exc:  # noqa: BLE001
        print(f"[misc] multiprocess: tensors in collective_rpc args: {type(exc).__name__}: {str(exc)[:400]}")


def sleep():
    from common import model_path, vllm_engine

    path = model_path()
    try:
        e = vllm_engine(path, enable_sleep_mode=True)
        print("[misc] enable_sleep_mode=True: constructed")
        e.sleep()
        e.wake()
    except Exception as exc:  # noqa: BLE001
        print(f"[misc] enable_sleep_mode=True: {type(exc).__name__}: {' | '.join(str(exc).splitlines())[:600]}")
    # and the plain LLM.sleep() without sleep mode
    e = vllm_engine(path)
    try:
        e.llm.sleep(level=1)
        e.llm.wake_up()
        print("[misc] LLM.sleep()/wake_up() without enable_sleep_mode: returned")
    except Exception as exc:  # noqa: BLE001
        print(f"[misc] LLM.sleep() without enable_sleep_mode: {type(exc).__name__}: {str(exc)[:300]}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        globals()[sys.argv[1]]()
    else:
        for case in ("inproc", "tensors_mp", "sleep"):
            r = subprocess.run([sys.executable, __file__, case], capture_output=True, text=True, timeout=300)
            print("\n".join(line for line in r.stdout.splitlines() if line.startswith("[misc]")))
            if r.returncode:
                print(f"[{case} exited {r.returncode}]", r.stderr[-2500:])
