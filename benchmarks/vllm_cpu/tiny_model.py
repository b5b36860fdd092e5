"""A tiny random Qwen2 causal LM + byte-level BPE tokenizer, saved with save_pretrained.

Sizes: hidden 64, 2 attention heads of head_dim 32 (vLLM's CPU attention needs head
size >= 32), 1 KV head (GQA), 2 layers, intermediate 128, tied embeddings (as rlx's
builtin:tiny). The tokenizer follows rlx.core.tiny: NFC + Qwen2 split + ByteLevel, with
<|endoftext|> as EOS, <|pad|> as PAD and ChatML specials.
"""

from __future__ import annotations

import os
import random

EOS = "<|endoftext|>"
PAD = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def corpus(n: int = 2000, seed: int = 0):
    rng = random.Random(seed)
    words = "the a cat dog sat on mat add plus minus equals answer question copy count of to is".split()
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        yield f"{a} + {b} = {a + b}. " + " ".join(rng.choice(words) for _ in range(8)) + "\n"


def make_tokenizer(out_dir: str, vocab_size: int = 320):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus(), trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )
    tok.save_pretrained(out_dir)
    return tok


def make_model(out_dir: str, seed: int = 0, tie: bool = True) -> str:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    os.makedirs(out_dir, exist_ok=True)
    tok = make_tokenizer(out_dir)
    eos = tok.eos_token_id
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=128,
        max_position_embeddings=512,
        tie_word_embeddings=tie,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        # Random init is std 0.02: logits would be nearly uniform. Scale the embeddings
        # up so the distribution is peaked and greedy/top-p tests are meaningful.
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(3.0)
    model.generation_config = GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    model.save_pretrained(out_dir)
    return out_dir


if __name__ == "__main__":
    import sys

    print(make_model(sys.argv[1] if len(sys.argv) > 1 else "/tmp/rlx-vllm-cpu/tiny"))
