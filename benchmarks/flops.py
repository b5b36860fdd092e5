"""What a W1-like pass computes, in FLOPs, and the card's bf16 matmul rate to set it against.

A batch of ``prompts`` × ``samples`` rows, each a prompt of ``prompt_len`` tokens and a
response of ``response_len``, with each prompt run ``prompt_runs`` times (once per
micro-batch that holds its samples, as ``training.share_prompts`` runs it; ``samples`` times
when every row runs its own). Counted as the card computes them: every matmul of the decoder
layers for every token run, the output head for the response tokens only (the passes take
no logits at the prompt), and attention's two products over each query's causal keys. A
backward pass computes twice its forward.
"""

from __future__ import annotations


def counts(config) -> tuple[int, int]:
    """The decoder layers' parameters (the embedding left out) and the output head's."""
    h, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    d = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    bias = q + 2 * kv if getattr(config, "attention_bias", True) else 0  # Qwen2's q, k and v carry biases
    layer = h * (q + 2 * kv) + bias + q * h + 3 * h * inner + 2 * h
    return layers * layer + h, config.vocab_size * h


def pass_flops(config, prompts: int, samples: int, prompt_len: int, response_len: int, prompt_runs: int,
               backward: bool) -> float:
    body, head = counts(config)
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rows, runs = prompts * samples, prompts * prompt_runs
    tokens = runs * prompt_len + rows * response_len
    pairs = (runs * prompt_len * (prompt_len + 1) // 2
             + rows * (response_len * prompt_len + response_len * (response_len + 1) // 2))
    attention = 4 * config.num_attention_heads * d * config.num_hidden_layers * pairs
    forward = 2 * body * tokens + 2 * head * rows * response_len + attention
    return forward * (3 if backward else 1)


def matmul_rate(size: int = 8192, reps: int = 20) -> float:
    """bf16 FLOP/s of a ``size``-cubed matmul on the current CUDA device, the best of three."""
    import torch

    a, b = (torch.randn(size, size, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    best = 0.0
    for _ in range(4):  # the first warms up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            a @ b
        end.record()
        torch.cuda.synchronize()
        best = max(best, 2 * size**3 * reps / (start.elapsed_time(end) / 1000))
    return best
