"""The FLOP count that benchmarks/single_gpu.py sets MFU on (benchmarks/flops.py), against
torch's own count of the matmuls a forward and backward run, and against the causal mask's
pairs."""

import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from flops import attention_flops, counts, matmul_flops, pass_flops  # noqa: E402

SHAPE = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)
CONFIGS = [Qwen2Config(**SHAPE, tie_word_embeddings=True), LlamaConfig(**SHAPE, tie_word_embeddings=False),
           Qwen3Config(**SHAPE, head_dim=32, tie_word_embeddings=True)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.model_type)
def test_counts_are_the_model_s_weight_matrices(config):
    model = AutoModelForCausalLM.from_config(config)
    body, head = counts(config)
    assert head == config.vocab_size * config.hidden_size
    layers = sum(p.numel() for name, p in model.named_parameters() if ".layers." in name and p.dim() == 2)
    assert body == layers


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.model_type)
@pytest.mark.parametrize("backward", [False, True])
def test_the_matmuls_are_those_torch_counts(config, backward):
    """Every row run whole (each prompt once per sample), the head on the response only:
    torch's count of the linear layers' matmuls equals the count's, attention left out."""
    prompts, samples, prompt_len, response_len = 2, 3, 5, 7
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    ids = torch.randint(0, config.vocab_size, (prompts * samples, prompt_len + response_len))
    counter = FlopCounterMode(display=False)
    with counter:
        states = model.model(input_ids=ids).last_hidden_state[:, prompt_len - 1:-1]
        logits = model.lm_head(states)
        if backward:
            logits.float().logsumexp(-1).sum().backward()
    by_op = counter.get_total_flops() and counter.get_flop_counts()["Global"]
    matmuls = sum(n for op, n in by_op.items() if str(op).split(".")[1] in ("mm", "addmm"))
    expected = matmul_flops(config, prompts, samples, prompt_len, response_len, samples) * (3 if backward else 1)
    assert matmuls == expected


def test_attention_counts_the_causal_pairs():
    """A prompt's pairs once per run, each response's over its prompt and itself."""
    config = CONFIGS[2]  # a head_dim of its own
    prompts, samples, prompt_len, response_len, runs = 2, 3, 5, 7, 1
    prompt_pairs = torch.ones(prompt_len, prompt_len).tril().sum()
    response_pairs = torch.ones(prompt_len + response_len, prompt_len + response_len).tril()[prompt_len:].sum()
    pairs = prompts * runs * prompt_pairs + prompts * samples * response_pairs
    per_pair = 4 * config.num_attention_heads * config.head_dim * config.num_hidden_layers
    assert attention_flops(config, prompts, samples, prompt_len, response_len, runs) == per_pair * pairs
    forward = pass_flops(config, prompts, samples, prompt_len, response_len, runs, backward=False)
    assert forward == matmul_flops(config, prompts, samples, prompt_len, response_len, runs) + per_pair * pairs
    assert pass_flops(config, prompts, samples, prompt_len, response_len, runs, backward=True) == 3 * forward
