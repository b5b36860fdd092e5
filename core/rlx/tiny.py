"""Tiny models and tokenizers made locally, for tests and CPU experiments.

``model.path: builtin:tiny`` (Qwen2) and ``builtin:tiny-llama`` (Llama) name random
models built here once and cached under ``$RLX_CACHE/models`` (default
``~/.cache/rlx``); no model hub is needed. The tokenizer is a byte-level BPE trained
on the built-in tasks' text, with Qwen2-style ChatML special tokens and template.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

EOS = "<|endoftext|>"
PAD = "<|pad|>"  # apart from EOS, so a reward read at a response's EOS is not taken for padding
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VOCAB_SIZE = 512
# Qwen2's pre-tokenizer split: digits one at a time, words with their leading space.
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen2-style ChatML; unlike Qwen's it adds no default system message.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# name -> architecture; all share the sizes of make_model's defaults
BUILTINS = {"tiny": "qwen2", "tiny-llama": "llama"}
DEMO = "tiny-arithmetic"  # builtin:tiny after a short SFT, made by rlx.demo


def make_tokenizer(out_dir: str | os.PathLike, extra_corpus: Iterable[str] = (), extra_special: Sequence[str] = ()):
    """Train a byte-level BPE on the tasks' corpus (and ``extra_corpus``) and save it to
    ``out_dir``.

    ``<|endoftext|>`` is EOS, ``<|pad|>`` padding; there is no BOS token, as in Qwen2.
    ``extra_special`` adds special tokens after the ChatML ones (a VLM's vision tokens).
    Returns the ``PreTrainedTokenizerFast``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from rlx.tasks import corpus

    bpe = Tokenizer(models.BPE())
    # The same pipeline as transformers' Qwen2Tokenizer, which AutoTokenizer uses for
    # a qwen2 model folder whatever tokenizer.json says: the ids must not depend on
    # the class that loads the files. No prefix space, so decode(encode(text)) == text
    # for any NFC-normalised text.
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS, PAD, IM_START, IM_END, *extra_special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(itertools.chain(corpus(), extra_corpus), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END, *extra_special],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )
    tokenizer.save_pretrained(out_dir)
    return tokenizer


def make_model(
    out_dir: str | os.PathLike,
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 256,
    seed: int = 0,
    arch: str = "qwen2",
    tie: bool = True,
) -> str:
    """Save a randomly initialised causal LM and its tokenizer to ``out_dir``.

    ``arch`` is "qwen2" or "llama". The weights depend only on the sizes and
    ``seed``. The head size is ``hidden // heads`` (32 by default: vLLM's CPU
    backend needs at least 32). ``tie=False`` gives the output head weights of
    its own. Returns ``out_dir`` as a string.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config

    from rlx.models import save_pretrained

    configs = {"qwen2": Qwen2Config, "llama": LlamaConfig}
    if arch not in configs:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(configs)}")
    tokenizer = make_tokenizer(out_dir)
    eos = tokenizer.eos_token_id
    config = configs[arch](
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        intermediate_size=intermediate,
        max_position_embeddings=512,
        tie_word_embeddings=tie,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
    )
    # Building under a fixed seed makes the random init reproducible.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=eos, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id
    )
    save_pretrained(model, out_dir)
    return str(out_dir)


def cache_dir() -> Path:
    """The rlx cache folder: ``$RLX_CACHE``, default ``~/.cache/rlx``."""
    return Path(os.environ.get("RLX_CACHE") or "~/.cache/rlx").expanduser()


def builtin_model(name: str) -> str:
    """The folder of built-in model ``name`` ("builtin:tiny" ...), built on first use.

    The model is built in a temporary folder beside its final place and renamed
    into it, so a reader never sees a half-written model; when two processes race,
    the first rename wins and the other's build is discarded.
    """
    short = name.removeprefix("builtin:")
    if short == DEMO:
        from rlx.demo import tiny_arithmetic

        return str(tiny_arithmetic(cache_dir() / "models" / short))
    if short not in BUILTINS:
        known = ", ".join("builtin:" + n for n in (*BUILTINS, DEMO))
        raise ValueError(f"unknown built-in model {name!r}; known: {known}")
    target = cache_dir() / "models" / short
    if target.is_dir():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{short}-", dir=target.parent)
    try:
        make_model(tmp, arch=BUILTINS[short])
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        os.rename(tmp, target)
    except OSError:
        if not target.is_dir():  # a real failure, not a lost race
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)
