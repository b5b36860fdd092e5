"""Checks of the vLLM engine against Hugging Face forwards, run in a process of their own
(vLLM in-process initialises torch.distributed and spawns helpers; the test suite's own
process stays clean). Prints one JSON object of measurements; ``test_vllm`` asserts on it.

    python tests/vllm_checks.py MODEL_DIR
"""

import json
import sys

import torch


def hf_logprobs(model, prompts, completions, temperature):
    """log softmax(logits / T) of each completion's tokens under ``model``."""
    rows = []
    for c in completions:
        prompt = prompts[c.prompt_index]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1:-1]
        lp = (logits / temperature).log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
        rows.append(lp)
    return torch.cat(rows)


def gap(model, prompts, completions, temperature):
    got = torch.cat([torch.tensor(c.logprobs) for c in completions])
    return (hf_logprobs(model, prompts, completions, temperature) - got).abs().max().item()


def main(path: str) -> None:
    import peft
    from transformers import AutoModelForCausalLM

    from rlx import models
    from rlx.engines.vllm import VLLMEngine
    from rlx.errors import RunError
    from rlx.partial import generate_in_segments
    from rlx.rollout import SamplingParams

    out = {}
    torch.manual_seed(1234)
    engine = VLLMEngine(path, seed=0, dtype="float32", max_model_len=256, eos_ids=[0])
    out["caller_seed_kept"] = torch.initial_seed() == 1234
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    sampled = SamplingParams(n=4, temperature=0.8, top_p=0.9, top_k=20, max_new_tokens=10, seed=3)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    rng = torch.get_rng_state()
    first = engine.generate(prompts, sampled)
    out["caller_rng_kept"] = torch.equal(rng, torch.get_rng_state())
    out["samples"] = len(first)
    out["prompt_order"] = [c.prompt_index for c in first]
    out["gap_start"] = gap(hf, prompts, first, 0.8)
    out["same_seed_same_tokens"] = [c.token_ids for c in engine.generate(prompts, sampled)] == [c.token_ids for c in first]
    alone = engine.generate(prompts[:1], sampled)
    out["prompt_alone_same"] = [c.token_ids for c in alone] == [c.token_ids for c in first[:4]]
    greedy = engine.generate(prompts, SamplingParams(n=2, greedy=True, max_new_tokens=10))
    out["greedy_copies"] = len(greedy) == 6 and greedy[0].token_ids == greedy[1].token_ids
    out["greedy_gap"] = gap(hf, prompts, greedy, 1.0)
    # partial rollouts: in segments of 3 tokens, each continued from its token ids, the same answer
    parts = generate_in_segments(engine.generate, prompts, SamplingParams(n=2, greedy=True, max_new_tokens=10), 3,
                                 lambda: 0, models.load_tokenizer(path))
    out["segments_same"] = [c.token_ids for c in parts] == [c.token_ids for c in greedy]
    out["segments_gap"] = gap(hf, prompts, parts, 1.0)
    out["segments_longest"] = max(len(c.token_ids) for c in parts)

    # a sync: new weights, and the engine computes what they compute
    old = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine.update_weights(hf.state_dict())
    after = engine.generate(prompts, sampled)
    out["gap_after_sync"] = gap(hf, prompts, after, 0.8)
    out["gap_to_old_after_sync"] = gap(old, prompts, after, 0.8)

    # bad syncs are refused before anything reaches vLLM, and the engine keeps working
    refused = []
    state = hf.state_dict()
    for bad in ({"module.lm_head.weight": state["lm_head.weight"]},
                {"model.norm.weight": torch.zeros(7)},
                {"model.layers.0.self_attn.q_proj.weight": state["model.layers.0.self_attn.q_proj.weight"]}):
        try:
            engine.update_weights(bad)
            refused.append("accepted")
        except RunError as e:
            refused.append(str(e))
    out["refused"] = refused
    out["gap_after_refused"] = gap(hf, prompts, engine.generate(prompts, sampled), 0.8)

    # LoRA: only the adapted layers (merged, with their fused siblings) are sent
    lora = peft.get_peft_model(hf, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "up_proj"],
                                                    init_lora_weights=False))
    sent = models.engine_weights(lora, lora.state_dict())
    out["lora_sent"] = sorted(sent)
    engine.update_weights(sent)
    merged = lora.merge_and_unload()
    out["gap_after_lora_sync"] = gap(merged, prompts, engine.generate(prompts, sampled), 0.8)
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
