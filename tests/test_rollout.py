"""The native rollout engine on a tiny random Qwen2 and a character-level tokenizer."""

import copy
import string
import warnings

import pytest
import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from rlx.rollout import Completion, NativeEngine, RolloutEngine, SamplingParams

EOS = 1
PROMPTS = ["ab", "hello", "1+2=3 is"]  # different lengths: left padding is exercised


@pytest.fixture(scope="module")
def tokenizer():
    vocab = {"<pad>": 0, "<eos>": EOS, "<unk>": 2}
    for c in (string.ascii_lowercase + string.digits + " +=.,!?\n<>/" + string.ascii_uppercase)[:61]:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def make_model(seed=0):
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    return transformers.Qwen2ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer(p, add_special_tokens=False).input_ids for p in PROMPTS]


def tokens(completions):
    return [c.token_ids for c in completions]


def test_engine_fills_the_interface(model, tokenizer):
    assert isinstance(NativeEngine(model, tokenizer), RolloutEngine)


def test_greedy_matches_hf_generate(model, tokenizer, prompts):
    # max_batch_size=2 splits the three prompts into two batches
    engine = NativeEngine(model, tokenizer, max_batch_size=2)
    out = engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=12))

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    hf = model.generate(input_ids=ids, attention_mask=attention, do_sample=False, max_new_tokens=12, pad_token_id=0)
    for completion, row in zip(out, hf[:, width:].tolist()):
        expected = row[: row.index(EOS) + 1] if EOS in row else row
        assert completion.token_ids == expected
        assert completion.finish_reason == ("stop" if EOS in row else "length")
    assert [c.prompt_index for c in out] == [0, 1, 2]


def test_decoding_raises_no_deprecation_warning(model, tokenizer, prompts):
    # the decode loop drives the KV cache through transformers' Cache API (DynamicCache,
    # batch_repeat_interleave, batch_select_indices); a FutureWarning or DeprecationWarning
    # here means a call the installed transformers is about to drop. Rows that finish early
    # (a stop string, EOS) take the batch_select_indices path.
    engine = NativeEngine(model, tokenizer, max_batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        engine.generate(prompts, SamplingParams(n=2, max_new_tokens=12, seed=0, stop=("a", "b", "c")))
        engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=12))


@pytest.mark.parametrize("temperature, top_k", [(1.0, 0), (0.7, 5)])
def test_logprobs_match_a_full_forward_pass(model, tokenizer, prompts, temperature, top_k):
    # log-probs are under softmax(logits / T) before top-k truncation, as the trainer computes them
    engine = NativeEngine(model, tokenizer)
    params = SamplingParams(n=2, temperature=temperature, top_k=top_k, max_new_tokens=10, seed=0)
    for c in engine.generate(prompts, params):
        prompt = prompts[c.prompt_index]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1 : -1]
        expected = (logits / temperature).log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None])
        torch.testing.assert_close(torch.tensor(c.logprobs), expected.squeeze(-1), atol=1e-4, rtol=0)


def test_n_samples_are_prompt_major(model, tokenizer, prompts):
    engine = NativeEngine(model, tokenizer, max_batch_size=4)
    out = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=4, seed=0))
    assert [c.prompt_index for c in out] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # greedy: every sample of a prompt is that prompt's single greedy completion
    single = tokens(engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=6)))
    grouped = tokens(engine.generate(prompts, SamplingParams(n=2, greedy=True, max_new_tokens=6)))
    assert grouped == [t for t in single for _ in range(2)]


def test_stop_string_ends_the_completion(model, tokenizer, prompts):
    engine = NativeEngine(model, tokenizer)
    full = engine.generate(prompts[1:2], SamplingParams(greedy=True, max_new_tokens=12))[0]
    assert full.finish_reason == "length"
    stop = full.text[4:6]
    # the completion ends at the first token whose text completes the stop string
    k = next(k for k in range(1, 13) if stop in tokenizer.decode(full.token_ids[:k], skip_special_tokens=True))
    out = engine.generate(prompts[1:2], SamplingParams(greedy=True, max_new_tokens=12, stop=("never", stop)))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == full.token_ids[:k]
    assert out.logprobs == pytest.approx(full.logprobs[:k], abs=1e-5)
    assert out.text.endswith(stop) and full.text.startswith(out.text)


def test_eos_ends_the_completion(model, tokenizer, prompts):
    full = NativeEngine(model, tokenizer).generate(prompts[1:2], SamplingParams(greedy=True, max_new_tokens=12))[0]
    k = next(k for k in range(1, 12) if full.token_ids[k] not in full.token_ids[:k])
    eos_model = copy.deepcopy(model)
    eos_model.generation_config.eos_token_id = [EOS, full.token_ids[k]]
    out = NativeEngine(eos_model, tokenizer).generate(prompts[1:2], SamplingParams(greedy=True, max_new_tokens=12))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == full.token_ids[: k + 1]  # EOS is kept


def test_finished_rows_stop_growing_and_length_is_reported(model, tokenizer, prompts):
    out = NativeEngine(model, tokenizer).generate(prompts, SamplingParams(n=4, max_new_tokens=5, seed=1))
    for c in out:
        if c.finish_reason == "length":
            assert len(c.token_ids) == 5 and EOS not in c.token_ids
        else:
            assert c.token_ids[-1] == EOS and EOS not in c.token_ids[:-1]
        assert len(c.logprobs) == len(c.token_ids)
    assert any(c.finish_reason == "length" for c in out)


def test_truncation_to_one_token_is_greedy(model, tokenizer, prompts):
    engine = NativeEngine(model, tokenizer)
    greedy = tokens(engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=8)))
    assert tokens(engine.generate(prompts, SamplingParams(top_k=1, max_new_tokens=8, seed=0))) == greedy
    assert tokens(engine.generate(prompts, SamplingParams(top_p=1e-6, max_new_tokens=8, seed=0))) == greedy


def test_seeded_sampling_is_reproducible(model, tokenizer, prompts):
    engine = NativeEngine(model, tokenizer)
    params = SamplingParams(n=2, temperature=0.9, top_p=0.9, top_k=20, max_new_tokens=8, seed=123)
    first, again = engine.generate(prompts, params), engine.generate(prompts, params)
    assert first == again
    other = engine.generate(prompts, SamplingParams(n=2, temperature=0.9, top_p=0.9, top_k=20, max_new_tokens=8, seed=7))
    assert tokens(other) != tokens(first)


def test_train_mode_is_restored(tokenizer, prompts):
    model = make_model()
    modes = []
    model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    model.train()
    NativeEngine(model, tokenizer).generate(prompts, SamplingParams(max_new_tokens=2, seed=0))
    assert model.training and modes and not any(modes)


def test_update_weights(model, tokenizer, prompts):
    other = make_model(seed=1)
    engine = NativeEngine(make_model(), tokenizer)
    engine.update_weights(engine.model)  # the shared actor: nothing to copy
    engine.update_weights(other.state_dict())
    expected = NativeEngine(other, tokenizer).generate(prompts, SamplingParams(greedy=True, max_new_tokens=6))
    assert engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=6)) == expected
    assert isinstance(expected[0], Completion)


@pytest.mark.parametrize("static", [True, False], ids=["static-decoder", "plain-loop"])
def test_a_rollout_never_compiles_the_policys_compiled_layers(tokenizer, prompts, static):
    """The policy's layers compiled for training (``training.compile``) run eagerly in a
    rollout: its shapes would make Dynamo compile them again, for dynamic shapes."""
    from torch._dynamo.testing import CompileCounter

    model, counter = make_model(), CompileCounter()
    for layer in model.model.layers:
        layer.compile(backend=counter)
    engine = NativeEngine(model, tokenizer)
    if not static:
        engine.static = None
    engine.generate(prompts, SamplingParams(n=2, max_new_tokens=5, seed=0))
    assert counter.frame_count == 0
    model(torch.tensor(prompts[:1]))  # outside a rollout the compiled layers compile
    assert counter.frame_count > 0


def test_texts_are_each_rows_decode(tmp_path, tokenizer):
    from rlx.rollout import texts
    from rlx.tiny import make_tokenizer

    bpe = make_tokenizer(tmp_path / "bpe")
    special = sorted(bpe.all_special_ids)
    rows = [bpe("12 + 30 = 42, so: yes!", add_special_tokens=False).input_ids + special,
            [], special[:1] + bpe(" héllo wörld").input_ids, list(range(0, len(bpe), 7))]
    assert texts(bpe, rows) == [bpe.decode(r, skip_special_tokens=True) for r in rows]
    # the backend's batch decode is taken only where decode is the backend's: else row by row
    calls = []

    class Marked(type(bpe)):
        def decode(self, ids, **kwargs):
            calls.append(ids)
            return "<" + super().decode(ids, **kwargs) + ">"

    marked = Marked.from_pretrained(tmp_path / "bpe")
    assert texts(marked, rows) == ["<" + bpe.decode(r, skip_special_tokens=True) + ">" for r in rows]
    assert calls == rows
    spaced = copy.deepcopy(tokenizer)
    spaced.clean_up_tokenization_spaces = True
    words = [tokenizer("a , b .", add_special_tokens=False).input_ids]
    assert texts(spaced, words) == [spaced.decode(words[0], skip_special_tokens=True)]
