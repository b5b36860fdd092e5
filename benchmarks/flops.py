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
    """The parameters of the decoder layers' weight matrices, and the output head's, in the
    model ``config`` builds (on the meta device: no memory); norms and biases run no matmul."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    body = sum(p.numel() for p in model.parameters() if p.dim() == 2 and p is not embedding and p is not head)
    return body, head.numel()


def matmul_flops(config, prompts: int, samples: int, prompt_len: int, response_len: int, prompt_runs: int) -> int:
    """A forward's matmuls: the decoder's for every token run, the head's for response tokens."""
    body, head = counts(config)
    tokens = prompts * prompt_runs * prompt_len + prompts * samples * response_len
    return 2 * body * tokens + 2 * head * prompts * samples * response_len


def attention_flops(config, prompts: int, samples: int, prompt_len: int, response_len: int, prompt_runs: int) -> int:
    """A forward's attention: q·kᵀ and p·v, 4·heads·head_dim FLOPs a layer for each (query,
    key) pair of the causal mask; a prompt's pairs once per run, a response's over its
    prompt and itself."""
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    pairs = (prompts * prompt_runs * prompt_len * (prompt_len + 1) // 2
             + prompts * samples * (response_len * prompt_len + response_len * (response_len + 1) // 2))
    return 4 * config.num_attention_heads * d * config.num_hidden_layers * pairs


def pass_flops(config, prompts: int, samples: int, prompt_len: int, response_len: int, prompt_runs: int,
               backward: bool) -> int:
    forward = (matmul_flops(config, prompts, samples, prompt_len, response_len, prompt_runs)
               + attention_flops(config, prompts, samples, prompt_len, response_len, prompt_runs))
    return forward * (3 if backward else 1)


def matmul_rate(size: int = 8192, reps: int = 20) -> float:
    """bf16 FLOP/s of a ``size``-cubed matmul on the current CUDA device, the best of three."""
    import torch

    a, b = (torch.randn(size, size, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    rates = []
    for _ in range(4):  # the first warms up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            a @ b
        end.record()
        torch.cuda.synchronize()
        rates.append(2 * size**3 * reps / (start.elapsed_time(end) / 1000))
    return max(rates[1:])
