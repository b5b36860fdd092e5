"""The locally made tiny tokenizer and models."""

import os
import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from rlx import tiny

TEXTS = [
    "23+45=68",
    "count a in abcab=2",
    "copy xyz=xyz",
    "  leading and trailing spaces  ",
    "tabs\tand\nnew\n\nlines\r\n",
    "héllo wörld ✓ 😀 Ωmega",
    "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n2<|endoftext|>",
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer")
    tiny.make_tokenizer(path)
    return path


def test_tokenizer_loads_and_round_trips_exactly(tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert 400 <= len(tok) <= 600
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text


def test_tokenizer_special_tokens(tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token == "<|pad|>"
    assert tok.bos_token is None
    for special in ("<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"):
        ids = tok(special, add_special_tokens=False)["input_ids"]
        assert ids == [tok.convert_tokens_to_ids(special)]
    assert tok("23+45=", add_special_tokens=True)["input_ids"] == tok("23+45=", add_special_tokens=False)["input_ids"]
    assert tok.decode(tok("ab<|endoftext|>")["input_ids"], skip_special_tokens=True) == "ab"


def test_chat_template_is_chatml_with_optional_system(tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    user = [{"role": "user", "content": "1+1="}]
    assert tok.apply_chat_template(user, tokenize=False) == "<|im_start|>user\n1+1=<|im_end|>\n"
    assert tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n")
    chat = [{"role": "system", "content": "Be brief."}, *user, {"role": "assistant", "content": "2"}]
    assert tok.apply_chat_template(chat, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1+1=<|im_end|>\n"
        "<|im_start|>assistant\n2<|im_end|>\n")


def test_model_folder_tokenizer_gives_the_same_ids(tokenizer_dir, tiny_model_dir):
    # AutoTokenizer picks Qwen2Tokenizer for a qwen2 folder; the ids must not change.
    plain, from_model = AutoTokenizer.from_pretrained(tokenizer_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    for text in TEXTS:
        assert from_model(text)["input_ids"] == plain(text)["input_ids"]
    assert from_model.chat_template == plain.chat_template


def test_tiny_model_loads_with_its_config(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    c = model.config
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (2, 128, 4, 2)
    assert c.head_dim == 32 and c.intermediate_size == 256 and c.max_position_embeddings == 512
    assert c.vocab_size == len(tok) and c.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert c.eos_token_id == c.bos_token_id == tok.eos_token_id and c.pad_token_id == tok.pad_token_id
    gen = GenerationConfig.from_pretrained(tiny_model_dir)
    assert gen.eos_token_id == gen.bos_token_id == tok.eos_token_id and gen.pad_token_id == tok.pad_token_id
    ids = torch.tensor([tok("23+45=")["input_ids"]])
    assert model(ids).logits.shape == (1, ids.shape[1], len(tok))


def _weights(path):
    return AutoModelForCausalLM.from_pretrained(path).state_dict()


def test_random_init_depends_only_on_the_seed(tmp_path):
    a, b, c = (tiny.make_model(tmp_path / name, seed=seed) for name, seed in (("a", 0), ("b", 0), ("c", 1)))
    wa, wb, wc = _weights(a), _weights(b), _weights(c)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not torch.equal(wa["model.layers.0.mlp.up_proj.weight"], wc["model.layers.0.mlp.up_proj.weight"])


def test_make_model_sizes_are_configurable(tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny.make_model(tmp_path, layers=1, hidden=64, heads=2, kv_heads=1))
    assert (model.config.num_hidden_layers, model.config.head_dim, model.config.num_key_value_heads) == (1, 32, 1)


def test_builtin_llama(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_CACHE", str(tmp_path))
    path = tiny.builtin_model("builtin:tiny-llama")
    assert path == str(tmp_path / "models" / "tiny-llama")
    model = AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.head_dim == 32


def test_builtin_model_is_built_once(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_CACHE", str(tmp_path))
    first = tiny.builtin_model("builtin:tiny")
    monkeypatch.setattr(tiny, "make_model", lambda *a, **k: pytest.fail("rebuilt a cached model"))
    assert tiny.builtin_model("builtin:tiny") == first
    assert os.listdir(tmp_path / "models") == ["tiny"]


def test_unknown_builtin_names_the_known_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match="builtin:tiny, builtin:tiny-llama"):
        tiny.builtin_model("builtin:huge")


def test_racing_builds_agree_and_leave_no_temporary_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_CACHE", str(tmp_path))
    build = tiny.make_model
    both_built = threading.Barrier(2, timeout=60)

    def slow_build(*args, **kwargs):
        out = build(*args, **kwargs)
        both_built.wait()  # neither renames before both have built: a real race
        return out

    monkeypatch.setattr(tiny, "make_model", slow_build)
    results, errors = [], []

    def worker():
        try:
            results.append(tiny.builtin_model("builtin:tiny"))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == [str(tmp_path / "models" / "tiny")] * 2
    assert os.listdir(tmp_path / "models") == ["tiny"]
    AutoModelForCausalLM.from_pretrained(results[0])


def test_failed_build_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_CACHE", str(tmp_path))

    def broken(out_dir, **kwargs):
        (Path(out_dir) / "config.json").touch()  # a half-written model
        raise RuntimeError("disk full")

    monkeypatch.setattr(tiny, "make_model", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        tiny.builtin_model("builtin:tiny")
    assert os.listdir(tmp_path / "models") == []
