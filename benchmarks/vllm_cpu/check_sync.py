"""Check rlx's vLLM engine against HF forwards before and after a weight sync.

    python check_sync.py [--multiprocess] [--untied] [--no-eager-ranks]

1. greedy log-probs == HF log_softmax(logits) (fp32, tol 1e-5), greedy tokens == HF argmax
2. 32 samples (8 prompts x n=4, T=0.8, top_p=0.9, top_k=50, seed): log-probs ==
   HF log_softmax(logits / T) over the full vocabulary; same seed -> same tokens
3. perturb every HF parameter, update_weights(new state dict): log-probs == HF(new),
   != HF(old); a part of a fused group is refused, a whole group is exact
4. EOS and stop strings: make EOS likely (scale its embedding row), sync, generate
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--multiprocess", action="store_true")
    ap.add_argument("--untied", action="store_true")
    ap.add_argument("--no-eager-ranks", action="store_true")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common import EAGER_RANKS, TOL, compare, model_path, vllm_engine
    from common import prompts as make_prompts
    from rlx.errors import RunError
    from rlx.rollout import SamplingParams

    path = model_path(tied=not args.untied)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    prompts = make_prompts(tok)

    t0 = time.perf_counter()
    engine = vllm_engine(path, multiprocess=args.multiprocess, without=(EAGER_RANKS,) if args.no_eager_ranks else ())
    t_construct = time.perf_counter() - t0
    print(f"[time] construct: {t_construct:.2f} s (multiprocess={args.multiprocess})")

    # 1. greedy
    greedy = SamplingParams(greedy=True, max_new_tokens=16)
    t0 = time.perf_counter()
    out = engine.generate(prompts, greedy)
    print(f"[time] first generate (8 greedy x 16 tokens): {time.perf_counter() - t0:.2f} s")
    assert len(out) == 8 and [c.prompt_index for c in out] == list(range(8))
    worst = compare(hf, prompts, out, check_argmax=True)
    print(f"[check] greedy vs HF: max |dlogprob| = {worst:.2e}; tokens == HF argmax")
    assert worst < TOL

    # 2. 32 samples
    sp = SamplingParams(n=4, temperature=0.8, top_p=0.9, top_k=50, max_new_tokens=16, seed=123)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        samples = engine.generate(prompts, sp)
        times.append(time.perf_counter() - t0)
    print(f"[time] generate 32 samples x 16 tokens: {', '.join(f'{t:.3f}' for t in times)} s")
    assert [c.prompt_index for c in samples] == [i for i in range(8) for _ in range(4)]
    worst = compare(hf, prompts, samples, temperature=0.8)
    print(f"[check] sampled (T=0.8, top_p=0.9, top_k=50) vs HF log_softmax(logits/T) full vocab: {worst:.2e}")
    assert worst < TOL
    again = engine.generate(prompts, sp)
    same = [a.token_ids == b.token_ids for a, b in zip(samples, again)]
    print(f"[check] same seed twice -> same tokens: {all(same)} ({sum(same)}/32)")
    distinct = len({tuple(c.token_ids) for c in samples[:4]})
    print(f"[check] the 4 samples of prompt 0 are {distinct} distinct sequences (children get seed+index)")
    unseeded = [engine.generate(prompts[:1], SamplingParams(n=4, max_new_tokens=8)) for _ in range(2)]
    print(f"[check] seed=None twice -> same tokens: {[c.token_ids for c in unseeded[0]] == [c.token_ids for c in unseeded[1]]}")

    # 3. perturb and sync
    old = copy.deepcopy(hf)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    state = hf.state_dict()
    print(f"[info] HF state_dict: {len(state)} tensors, lm_head.weight in it: {'lm_head.weight' in state}, "
          f"tied: {hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()}")
    sync_times = []
    for _ in range(3):
        t0 = time.perf_counter()
        engine.update_weights(state)
        sync_times.append(time.perf_counter() - t0)
    print(f"[time] update_weights ({sum(v.numel() for v in state.values()) * 4 / 1e6:.2f} MB fp32): "
          f"{', '.join(f'{t:.3f}' for t in sync_times)} s")
    out = engine.generate(prompts, greedy)
    worst_new = compare(hf, prompts, out, check_argmax=True)
    worst_old = compare(old, prompts, out)
    print(f"[check] after sync greedy vs HF(new): {worst_new:.2e}; vs HF(old): {worst_old:.2e}")
    assert worst_new < TOL and worst_old > 1e-2
    samples = engine.generate(prompts, sp)
    worst = compare(hf, prompts, samples, temperature=0.8)
    print(f"[check] after sync sampled vs HF(new) log_softmax(logits/T): {worst:.2e}")
    assert worst < TOL

    # 3b. a sync of part of a fused group (only q of q/k/v) is refused; a whole group is exact
    with torch.no_grad():
        hf.model.layers[0].self_attn.q_proj.weight.add_(0.1)
        hf.model.layers[0].self_attn.k_proj.weight.add_(0.1)
    state = hf.state_dict()
    q_only = {k: v for k, v in state.items() if k.startswith("model.layers.0.self_attn.q_proj.")}
    try:
        engine.update_weights(q_only)
        raise AssertionError("a sync of only q_proj was accepted")
    except RunError as e:
        print(f"[check] partial sync of only q_proj: refused ({e})")
    engine._check = lambda named: None  # what vLLM itself makes of it
    engine.update_weights(q_only)
    del engine._check
    print(f"[check] the same sent without the engine's checks: vs HF(new) "
          f"{compare(hf, prompts, engine.generate(prompts, greedy)):.2e}")
    qkv = {k: v for k, v in state.items() if k.startswith(tuple(f"model.layers.0.self_attn.{p}_proj." for p in "qkv"))}
    engine.update_weights(qkv)
    worst = compare(hf, prompts, engine.generate(prompts, greedy))
    print(f"[check] partial sync of layer 0's q/k/v weights+biases ({len(qkv)} tensors) vs HF(new): {worst:.2e}")
    assert worst < TOL

    # 4. EOS and stop strings
    eos = tok.eos_token_id
    with torch.no_grad():
        hf.model.embed_tokens.weight[eos].mul_(4.0)
        if args.untied:
            hf.lm_head.weight[eos].mul_(4.0)
    engine.update_weights(hf.state_dict())
    s = engine.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=24, seed=5))
    ended = [c for c in s if c.finish_reason == "stop"]
    print(f"[check] EOS: {len(ended)}/32 stopped; all end with EOS id: "
          f"{all(c.token_ids[-1] == eos for c in ended)}; EOS text in .text: "
          f"{any(tok.eos_token in c.text for c in s)}; EOS log-prob finite: {all(c.logprobs[-1] > -1e9 for c in ended)}")
    print(f"[check] EOS samples' log-probs vs HF(new): {compare(hf, prompts, s):.2e}")
    if ended:
        c = ended[0]
        print(f"        e.g. {c.token_ids} -> {c.text!r}")
    # a stop string: pick a multi-character text that often appears in samples
    lengthy = [c for c in s if c.finish_reason == "length"] or s
    stop_word = None
    for c in lengthy:
        pieces = [tok.decode([t]) for t in c.token_ids]
        for piece in pieces[3:]:
            if len(piece.strip()) >= 2 and piece.isprintable():
                stop_word = piece.strip()[:2]
                break
        if stop_word:
            break
    print(f"[info] stop string chosen: {stop_word!r}")
    st = engine.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=24, seed=5, stop=(stop_word,)))
    hit = [c for c in st if stop_word in c.text]
    ok = all(c.finish_reason == "stop" and c.text.endswith(stop_word) for c in hit)
    full_text_ok = all(stop_word in tok.decode(c.token_ids) for c in hit)
    print(f"[check] stop {stop_word!r}: {len(hit)}/32 hit; text ends at the stop string: {ok}; "
          f"decode(token_ids) contains it (completing token kept): {full_text_ok}")
    for c in hit[:3]:
        print(f"        {c.token_ids} -> {c.text!r} / decode: {tok.decode(c.token_ids)!r}")
    # n and prompt-major order with n > 1 and unequal prompt lengths
    mixed = engine.generate([prompts[0], prompts[1][:2]], SamplingParams(n=3, max_new_tokens=4, seed=1))
    print(f"[check] n=3, 2 prompts -> prompt_index order {[c.prompt_index for c in mixed]}")

    g3 = engine.generate(prompts[:2], SamplingParams(n=3, greedy=True, max_new_tokens=6))
    print(f"[check] greedy with n=3 (vLLM refuses n>1 greedy; the engine copies): "
          f"{[c.prompt_index for c in g3]}, copies identical: {g3[0].token_ids == g3[1].token_ids == g3[2].token_ids}")
    engine.sleep()
    engine.wake()
    print("[check] sleep()/wake() are no-ops without sleep mode")
    print("ALL CHECKS PASSED")


if __name__ == "__main__":
    main()
