"""The workers' log-prob path (the output head over action tokens in chunks, with a
hand-written backward for a plain head, against log_softmax over the full logits) and the
critic's values, on the same states."""

import numpy as np
import pytest
import torch
import transformers

from rlx import models, varlen
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
@pytest.mark.parametrize("keep", [True, False])  # the probabilities kept for the backward pass, or recomputed
def test_chunked_head_matches_full_logits_and_their_gradients(tie, entropy_grad, temperature, keep, monkeypatch):
    monkeypatch.setattr(forward, "_CHUNK_ELEMENTS", 97 * 4)  # chunks of 4 tokens
    monkeypatch.setattr(forward, "_KEEP_ELEMENTS", 1 << 24 if keep else 0)
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
    assert compiled(False) == [False, False]
    assert compiled(True) == [True, True]


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


def test_auto_picks_rlx_varlen_for_text_models_on_cuda(monkeypatch):
    from rlx import models

    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)  # no flash-attn
    assert models.attn_implementation("auto", "cpu") == "rlx_sdpa"
    monkeypatch.setattr(varlen, "available", lambda device: torch.device(device).type == "cuda")
    assert models.attn_implementation("auto", "cuda") == "rlx_varlen"
    assert models.attn_implementation("auto", "cuda", vlm=True) == "sdpa"


def test_rlx_varlen_needs_a_card_the_flash_kernel_runs_on(monkeypatch):
    assert not varlen.available("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))  # a T4
    assert not varlen.available("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert varlen.available("cuda")


def test_rlx_sdpa_matches_sdpa_on_a_padded_grouped_query_batch(monkeypatch):
    from transformers.integrations import sdpa_attention

    from rlx import sdpa

    sdpa.register()
    repeats = []  # transformers' SDPA copies the key heads; rlx_sdpa must not
    repeat_kv = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda *a: repeats.append(1) or repeat_kv(*a))
    model, batch = model_and_batch(False)  # two query heads per key head
    batch.attention_mask[1, :2] = 0
    batch.position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    results = []
    for attention in ("sdpa", "rlx_sdpa"):
        model.set_attn_implementation(attention)
        model.zero_grad()
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids).logits
        (logits * torch.linspace(-1, 1, logits.shape[-1])).sum().backward()
        results.append((logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        if attention == "sdpa":
            assert repeats
            repeats.clear()
    assert not repeats
    (want, want_grads), (got, got_grads) = results
    assert torch.allclose(got, want, atol=1e-5)
    for name in want_grads:
        assert torch.allclose(got_grads[name], want_grads[name], atol=1e-5), name


def test_rlx_varlen_finds_a_packed_row_from_its_positions_alone():
    model, _ = model_and_batch(False)
    varlen.register()
    model.set_attn_implementation("rlx_varlen")
    a, b = torch.randint(0, 97, (1, 5)), torch.randint(0, 97, (1, 3))
    with torch.no_grad():
        packed = model(input_ids=torch.cat([a, b], 1), position_ids=torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]])).logits
        apart = torch.cat([model(input_ids=a).logits, model(input_ids=b).logits], 1)
    assert torch.allclose(packed, apart, atol=1e-5)


def grouped_batch(n: int = 3):
    """Two prompts (one left-padded) with ``n`` samples each, responses of varied lengths."""
    torch.manual_seed(1)
    prompts = [torch.randint(0, 97, (5,)), torch.cat([torch.zeros(2, dtype=torch.long), torch.randint(0, 97, (3,))])]
    prompt_mask = [torch.ones(5, dtype=torch.long), torch.tensor([0, 0, 1, 1, 1])]
    rows = 2 * n
    ids = torch.cat([torch.stack([prompts[i // n] for i in range(rows)]), torch.randint(0, 97, (rows, 6))], 1)
    action = (torch.arange(6) < torch.randint(1, 7, (rows,))[:, None]).float()
    attention = torch.cat([torch.stack([prompt_mask[i // n] for i in range(rows)]), action.long()], 1)
    return Batch(input_ids=ids, attention_mask=attention, position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
                 action_mask=action, prompt_len=5, rewards=torch.zeros(rows),
                 group_ids=torch.arange(rows) // n)


def tokens_seen(model):
    """A list that gets the number of tokens each forward embeds."""
    seen = []
    model.model.embed_tokens.register_forward_hook(lambda module, args, out: seen.append(args[0].numel()))
    return seen


@pytest.mark.parametrize("checkpointing", [False, True])
def test_samples_of_a_prompt_run_it_once_with_the_same_logprobs_and_gradients(checkpointing):
    model, _ = model_and_batch(True)
    if checkpointing:  # no cache under gradient checkpointing: one forward over prompt and response
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    batch = grouped_batch()
    seen = tokens_seen(model)
    weights = torch.randn(6, 6)
    logp, _ = forward.response_logprobs(model, batch, 0.7)
    (logp * weights).sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert seen == ([6 * 11] if checkpointing else [2 * 5, 6 * 6])  # the two prompts once, then the responses
    model.zero_grad()
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   position_ids=batch.position_ids).logits[:, 4:-1].float()
    want = (logits / 0.7).log_softmax(-1).gather(-1, batch.responses[..., None]).squeeze(-1) * batch.action_mask
    (want * weights).sum().backward()
    assert torch.allclose(logp, want, atol=1e-5)
    for name, p in model.named_parameters():
        assert torch.allclose(got[name], p.grad, atol=1e-5), name


def test_prompts_run_once_only_where_it_pays_and_the_layers_are_eager():
    model, _ = model_and_batch(True)
    seen = tokens_seen(model)
    with torch.no_grad():
        forward.response_logprobs(model, grouped_batch(n=1), 1.0)  # every prompt distinct
        assert seen == [2 * 11]
    distinct, grouped = grouped_batch(n=1), grouped_batch()
    assert forward._shared_prompts(distinct, forward.Host.of(distinct)) is None
    assert forward._shared_prompts(grouped, forward.Host.of(grouped)) is not None and forward._cache_ready(model)
    for layer in model.model.layers:
        layer.compile()  # a compiled layer would trace the cache: a row of shared prompts instead, on CUDA
    assert not forward._cache_ready(model)
    assert not forward._row_ready(model)  # on the CPU, where the rows' attention would go segment by segment


def test_a_micro_batchs_host_view_is_the_one_its_own_batch_would_copy():
    """A training step copies the batch's masks and prompts to the host once and lays out
    each micro-batch from its share of them."""
    batch = grouped_batch()
    batch.action_mask[0, 0] = 0  # a token that takes no gradient
    index = [4, 0, 5]
    picked, copied = forward.Host.of(batch).select(index), forward.Host.of(batch.select(index))
    part = batch.select(index)
    assert np.array_equal(copied.attention, part.attention_mask.numpy() != 0)
    assert np.array_equal(copied.action, part.action_mask.numpy() != 0) and not copied.action[1, 0]
    assert np.array_equal(copied.prompts, part.input_ids[:, :5].numpy())
    for name in ("attention", "action", "prompts"):
        assert np.array_equal(getattr(picked, name), getattr(copied, name)), name


def test_a_row_of_shared_prompts_gives_the_padded_forwards_numbers_and_gradients(monkeypatch):
    """The path CUDA takes: each distinct prompt once in a packed row, then its samples'
    responses, each attending to its prompt's keys and its own (on the CPU in float32 the
    attention goes segment by segment; benchmarks/shared_prompts.py checks the flash kernel)."""
    model, _ = model_and_batch(True)
    varlen.register()
    model.set_attn_implementation("rlx_varlen")
    # interleaved: three samples of one prompt, four of the other
    batch = grouped_batch(n=4).select([5, 0, 6, 1, 7, 2, 4])
    batch.action_mask[1, 0] = 0  # a token that takes no gradient still attends and is attended to
    weights = torch.randn(batch.action_mask.shape)
    results, seen = [], tokens_seen(model)
    monkeypatch.setattr(forward, "_cache_ready", lambda model: False)
    for row in (False, True):
        monkeypatch.setattr(forward, "_row_ready", lambda model: row)
        model.zero_grad()
        logp, _ = forward.response_logprobs(model, batch, 0.7)
        (logp * weights).sum().backward()
        results.append((logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, seen[:]))
        seen.clear()
    (want, want_grads, padded), (got, grads, shared) = results
    assert padded == [7 * 11]
    assert shared == [5 + 3 + int(batch.attention_mask[:, 5:].sum())]  # the two prompts once, then the responses
    assert torch.allclose(got, want, atol=1e-5)
    for name in want_grads:
        assert torch.allclose(grads[name], want_grads[name], atol=1e-5), name


@pytest.mark.parametrize("share", [True, False])
def test_a_training_step_puts_a_prompts_samples_in_the_same_micro_batch(tiny_model_dir, share):
    from rlx.config import resolve
    from rlx.plugins import build_host
    from rlx.workers.policy import PolicyWorker

    config = resolve(build_host().algorithms.get("grpo"), {
        "model": {"path": tiny_model_dir}, "training": {"batch_size": 6, "micro_batch_size": 3, "share_prompts": share},
        "algorithm": {"rollout_batch_size": 2, "n_samples": 3}})
    policy = PolicyWorker(config, build_host(), total_steps=10, micro_steps=2)
    batch = grouped_batch().select([0, 3, 1, 4, 2, 5])  # shuffled: each group split across micro-batches
    batch.input_ids %= policy.module().config.vocab_size
    batch.advantages = torch.randn(6, 6) * batch.action_mask
    seen = tokens_seen(policy.module())
    policy.train_step(batch, token_count=batch.action_mask.sum().item(), seq_count=6, beta=0.0)
    if share:
        assert seen == [5, 3 * 6, 5, 3 * 6]  # each micro-batch: its one prompt, then its three responses
    else:
        assert seen == [3 * 11, 3 * 11]  # training.share_prompts=false: every sample's prompt


def test_a_critics_training_step_runs_each_prompt_once_per_micro_batch(tiny_model_dir):
    from rlx.config import resolve
    from rlx.plugins import build_host
    from rlx.workers.critic import CriticWorker

    config = resolve(build_host().algorithms.get("ppo"), {
        "model": {"path": tiny_model_dir}, "training": {"batch_size": 6, "micro_batch_size": 3},
        "algorithm": {"rollout_batch_size": 2, "n_samples": 3}})
    critic = CriticWorker(config, build_host(), total_steps=10, micro_steps=2)
    batch = grouped_batch().select([0, 3, 1, 4, 2, 5])  # shuffled: each group split across micro-batches
    batch.input_ids %= models.hf_module(critic.engine.model).config.vocab_size
    batch.values, batch.returns = torch.zeros(6, 6), torch.randn(6, 6) * batch.action_mask
    seen = tokens_seen(models.hf_module(critic.engine.model))
    metrics, update = critic.train_step(batch, token_count=batch.action_mask.sum().item())
    assert seen == [5, 3 * 6, 5, 3 * 6]  # each micro-batch: its one prompt, then its three responses
    assert metrics["loss/value"] > 0 and update["critic/grad_norm"] > 0


def test_a_frozen_head_passes_its_gradient_on_and_gets_none(monkeypatch):
    monkeypatch.setattr(forward, "_CHUNK_ELEMENTS", 97 * 4)  # chunks of 4 tokens
    monkeypatch.setattr(forward, "_KEEP_ELEMENTS", 0)  # the logits recomputed in the backward pass
    model, batch = model_and_batch(False)
    model.lm_head.weight.requires_grad_(False)
    weights = torch.randn(3, 5)
    logp, _ = forward.response_logprobs(model, batch, 0.7)
    (logp * weights).sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    want_logp, _ = reference(model, batch, 0.7)
    (want_logp * weights).sum().backward()
    assert model.lm_head.weight.grad is None
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert torch.allclose(got[name], p.grad, atol=1e-5), name


@pytest.mark.parametrize("packed", [False, True])
def test_the_forward_installs_no_output_capture_hooks(packed):
    """The last hidden states come from a hook of the forward's own, removed after it, not
    from ``output_hidden_states``: that installs transformers' capture hooks in every
    attention module, and their ``ContextVar`` splits a compiled layer's graph in three."""
    model, batch = model_and_batch(True)
    logp, _ = forward.response_logprobs(model, batch, 1.0, packed=packed)
    logp.sum().backward()
    assert not [name for name, module in model.named_modules() if module._forward_hooks]
    want, _ = reference(model, batch, 1.0)
    assert torch.allclose(logp, want, atol=1e-5)


def test_the_flash_kernels_flop_count_takes_grouped_key_heads(monkeypatch):
    """Before torch 2.12 the count raised on fewer key heads than query heads, and a compiled
    layer's partitioner, which counts FLOPs under training.compile_memory below 1, with it."""
    from torch.utils import flop_counter

    op = torch.ops.aten._flash_attention_forward

    def strict(query, key, value, *args, **kwargs):  # torch 2.11's, in short
        if key.shape[-2] != query.shape[-2]:
            raise AssertionError("sdpa_flop_count: query/key/value shapes are incompatible")
        return 4 * query.shape[0] * query.shape[1] * query.shape[2] * key.shape[0]

    monkeypatch.setitem(flop_counter.flop_registry, op, strict)
    varlen._count_grouped_heads()
    query, key = torch.empty(100, 14, 64), torch.empty(120, 2, 64)
    assert flop_counter.flop_registry[op](query, key, key, None, None, 100, 120) == 4 * 100 * 14 * 64 * 120
    counted = flop_counter.flop_registry[op]
    varlen._count_grouped_heads()  # wrapped once
    assert flop_counter.flop_registry[op] is counted
    monkeypatch.setitem(flop_counter.flop_registry, op, own := lambda *args, **kwargs: 7)
    varlen._count_grouped_heads()  # a count that takes grouped heads stays
    assert flop_counter.flop_registry[op] is own


def value_model():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=64, num_labels=1, pad_token_id=0)
    return transformers.Qwen2ForSequenceClassification(config)


@pytest.mark.parametrize("path", ["packed", "cache", "row"])
def test_a_critics_values_take_the_policys_paths_with_the_same_numbers_and_gradients(monkeypatch, path):
    """Values of the state before each response token, from a packed row, from prompts run
    once through a cache (the CPU's way) or in a row of shared prompts (CUDA's), against
    the padded forward's per-position values."""
    model = value_model()
    if path != "cache":
        varlen.register()
        model.set_attn_implementation("rlx_varlen")
    monkeypatch.setattr(forward, "_row_ready", lambda model: path == "row")
    batch = grouped_batch()
    weights = torch.randn(batch.action_mask.shape) * batch.action_mask
    seen = tokens_seen(model)
    values = forward.response_values(model, batch, packed=path == "packed", share=path != "packed")
    (values * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    responses = int(batch.attention_mask[:, 5:].sum())
    # every sample's prompt and response without padding; the two prompts once (padded), then
    # the responses; the two prompts once (5 and 3 tokens) and the responses, without padding
    assert seen == {"packed": [6 * 5 - 3 * 2 + responses], "cache": [2 * 5, 6 * 6], "row": [5 + 3 + responses]}[path]
    model.zero_grad()
    want = models.token_values(model, batch.input_ids, batch.attention_mask, batch.position_ids)[:, 4:-1]
    (want * weights).sum().backward()
    assert values.dtype == torch.float32 and values.shape == batch.action_mask.shape
    assert torch.allclose(values * batch.action_mask, want * batch.action_mask, atol=1e-5)
    for name, p in model.named_parameters():
        assert torch.allclose(grads[name], p.grad, atol=1e-5), name
