"""The workers' log-prob path: the output head over action tokens in chunks, with a
hand-written backward for a plain head, against log_softmax over the full logits."""

import pytest
import torch
import transformers

from rlx import varlen
from rlx.batch import Batch
from rlx.workers import forward


def model_and_batch(tie: bool):
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=64, tie_word_embeddings=tie)
    model = transformers.Qwen2ForCausalLM(config)
    ids = torch.randint(0, 97, (3, 9))
    action = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.float32)
    attention = torch.cat([torch.ones(3, 4, dtype=torch.long), action.long()], 1)
    batch = Batch(input_ids=ids, attention_mask=attention, position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
                  action_mask=action, prompt_len=4, rewards=torch.zeros(3), group_ids=torch.arange(3))
    return model, batch


def reference(model, batch, temperature):
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   position_ids=batch.position_ids).logits[:, 3:-1].float()
    logp = (logits / temperature).log_softmax(-1).gather(-1, batch.responses[..., None]).squeeze(-1)
    entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    return logp * batch.action_mask, entropy * batch.action_mask


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("entropy_grad", [False, True])  # the hand-written backward, and autograd's replay
@pytest.mark.parametrize("temperature", [0.7, 1.0])  # at 1 the entropy shares the log-probs' normaliser
def test_chunked_head_matches_full_logits_and_their_gradients(tie, entropy_grad, temperature, monkeypatch):
    monkeypatch.setattr(forward, "_CHUNK_ELEMENTS", 97 * 4)  # chunks of 4 tokens
    model, batch = model_and_batch(tie)
    weights = torch.randn(3, 5)
    logp, entropy = forward.response_logprobs(model, batch, temperature, with_entropy=True, entropy_grad=entropy_grad)
    (logp * weights).sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    want_logp, want_entropy = reference(model, batch, temperature)
    (want_logp * weights).sum().backward()
    assert torch.allclose(logp, want_logp, atol=1e-5)
    assert torch.allclose(entropy, want_entropy.detach(), atol=1e-5)
    for name, p in model.named_parameters():
        assert torch.allclose(got[name], p.grad, atol=1e-5), name


def test_no_grad_pass_and_padding_only_rows():
    model, batch = model_and_batch(True)
    batch.action_mask[1] = 0
    with torch.no_grad():
        logp, entropy = forward.response_logprobs(model, batch, 1.0)
        want, _ = reference(model, batch, 1.0)
    assert entropy is None
    assert torch.allclose(logp, want, atol=1e-5)
    assert logp[1].abs().sum() == 0


def test_compile_layers_follows_the_setting(tiny_model_dir):
    from rlx import models
    from rlx.config import ModelConfig

    def compiled(setting):
        model = models.load_causal_lm(ModelConfig(path=tiny_model_dir), torch.device("cpu"), trainable=False)
        models.compile_layers(model, setting)
        return [layer._compiled_call_impl is not None for layer in model.model.layers]

    assert compiled("auto") == [False, False]  # auto compiles on CUDA only
    assert compiled("off") == [False, False]
    assert compiled("on") == [True, True]


@pytest.mark.parametrize("attention", ["sdpa", "rlx_varlen"])
def test_packed_pass_matches_the_padded_one_with_left_and_right_padding(attention):
    model, batch = model_and_batch(False)
    if attention == "rlx_varlen":  # on the CPU in float32: its padded calls take SDPA, its packed ones go sample by sample
        varlen.register()
        model.set_attn_implementation(attention)
    batch.attention_mask[1, :2] = 0  # a shorter prompt, left-padded, beside right-padded responses
    batch.position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    weights = torch.randn(3, 5)
    results = []
    for packed in (False, True):
        model.zero_grad()
        logp, entropy = forward.response_logprobs(model, batch, 0.7, with_entropy=True, packed=packed)
        (logp * weights).sum().backward()
        results.append((logp.detach(), entropy, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (padded, padded_entropy, padded_grads), (packed, packed_entropy, packed_grads) = results
    assert padded.abs().sum() > 0
    assert torch.allclose(packed, padded, atol=1e-5)
    assert torch.allclose(packed_entropy, padded_entropy, atol=1e-5)
    for name in padded_grads:
        assert torch.allclose(packed_grads[name], padded_grads[name], atol=1e-5), name


def test_packed_kwargs_give_each_samples_bounds():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    kwargs = varlen.packed_kwargs(positions)
    assert kwargs["cu_seq_lens_q"].tolist() == [0, 3, 5, 9] and kwargs["max_length_q"] == 4
    assert kwargs["cu_seq_lens_k"] is kwargs["cu_seq_lens_q"]


def test_auto_picks_the_varlen_kernel_only_for_packed_models_on_cuda(monkeypatch):
    from rlx import models

    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)  # no flash-attn
    assert models.attn_implementation("auto", "cpu", packed=True) == "sdpa"
    monkeypatch.setattr(varlen, "available", lambda device: torch.device(device).type == "cuda")
    assert models.attn_implementation("auto", "cuda", packed=True) == "rlx_varlen"
    assert models.attn_implementation("auto", "cuda", packed=False) == "sdpa"


def test_rlx_varlen_finds_a_packed_row_from_its_positions_alone():
    model, _ = model_and_batch(False)
    varlen.register()
    model.set_attn_implementation("rlx_varlen")
    a, b = torch.randint(0, 97, (1, 5)), torch.randint(0, 97, (1, 3))
    with torch.no_grad():
        packed = model(input_ids=torch.cat([a, b], 1), position_ids=torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]])).logits
        apart = torch.cat([model(input_ids=a).logits, model(input_ids=b).logits], 1)
    assert torch.allclose(packed, apart, atol=1e-5)
