"""The native engine's static-cache decode loop (``rlx.engines.static_decode``) against the
plain transformers loop it replaces for Llama-family models. On the CPU it runs the same
step eagerly that a CUDA graph replays on a GPU (benchmarks/single_gpu.py runs that)."""

import copy

import numpy as np
import pytest
import torch
import transformers
from test_rollout import EOS, make_model, tokenizer  # noqa: F401  (a fixture)

from rlx.engines.static_decode import sample, supports
from rlx.rollout import NativeEngine, SamplingParams

PROMPTS = ["ab", "hello there", "1+2=3 is"]


def engines(model, tokenizer, keys_transposed=True):
    fast = NativeEngine(model, tokenizer)
    fast.static.keys_transposed = keys_transposed
    plain = NativeEngine(model, tokenizer)
    plain.static = None
    return fast, plain


# the CPU keeps each key head as [head_dim, columns]; CUDA keeps [columns, head_dim]
LAYOUTS = pytest.mark.parametrize("keys_transposed", [True, False], ids=["cpu-keys", "cuda-keys"])


@pytest.fixture
def prompts(tokenizer):  # noqa: F811
    return [tokenizer(p, add_special_tokens=False).input_ids for p in PROMPTS]


def eos_model(tokenizer, prompts):  # noqa: F811
    """A model whose greedy and sampled completions end at different lengths: a common
    token is made an EOS, so rows leave the batch at different steps."""
    model = make_model()
    plain = NativeEngine(model, tokenizer)
    plain.static = None
    out = plain.generate(prompts, SamplingParams(n=4, max_new_tokens=16, seed=0))
    counts = torch.bincount(torch.tensor([t for c in out for t in c.token_ids]))
    model.generation_config.eos_token_id = [EOS, int(counts.argmax())]
    return model


def test_supports_llama_family_and_refuses_the_rest():
    assert supports(make_model())
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    assert not supports(gpt2)
    sharded = make_model()
    next(sharded.parameters()).ds_id = 0  # what DeepSpeed ZeRO-3 marks its partitioned parameters with
    assert not supports(sharded)


@LAYOUTS
def test_greedy_equals_the_plain_loop_and_a_forward(tokenizer, prompts, keys_transposed):  # noqa: F811
    model = make_model()
    fast, plain = engines(model, tokenizer, keys_transposed)
    params = SamplingParams(greedy=True, max_new_tokens=12, n=2)
    got, want = fast.generate(prompts, params), plain.generate(prompts, params)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for c in got:
        ids = torch.tensor([prompts[c.prompt_index] + c.token_ids])
        with torch.no_grad():
            logp = model(ids).logits[0].log_softmax(-1)
        start = len(prompts[c.prompt_index]) - 1
        expected = [logp[start + i, t].item() for i, t in enumerate(c.token_ids)]
        assert c.logprobs == pytest.approx(expected, abs=1e-5)


class EpsNorm(torch.nn.Module):
    """An RMS norm that keeps its epsilon under another name than transformers' norms."""

    def __init__(self, norm):
        super().__init__()
        self.weight, self.eps = norm.weight, norm.variance_epsilon

    def forward(self, x):
        return self.weight * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def test_norms_of_another_kind_decode_through_their_modules(tokenizer, prompts):  # noqa: F811
    model = make_model()
    decoder = model.get_decoder()
    decoder.norm = EpsNorm(decoder.norm)
    for layer in decoder.layers:
        layer.input_layernorm, layer.post_attention_layernorm = (EpsNorm(layer.input_layernorm),
                                                                 EpsNorm(layer.post_attention_layernorm))
    assert supports(model)
    fast, plain = engines(model, tokenizer)
    params = SamplingParams(greedy=True, max_new_tokens=12, n=2)
    assert [c.token_ids for c in fast.generate(prompts, params)] == [c.token_ids for c in plain.generate(prompts, params)]


@pytest.mark.parametrize("settings", [{}, {"temperature": 0.7, "top_k": 10, "top_p": 0.9}])
def test_sampling_with_rows_ending_early_equals_the_plain_loop(tokenizer, prompts, settings):  # noqa: F811
    fast, plain = engines(eos_model(tokenizer, prompts), tokenizer)
    params = SamplingParams(n=4, max_new_tokens=16, seed=3, **settings)
    got, want = fast.generate(prompts, params), plain.generate(prompts, params)
    assert {c.finish_reason for c in got} == {"stop", "length"}  # rows left the batch early
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for a, b in zip(got, want):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert (a.text, a.finish_reason) == (b.text, b.finish_reason)


def test_stop_strings_end_rows_as_in_the_plain_loop(tokenizer, prompts):  # noqa: F811
    fast, plain = engines(make_model(), tokenizer)
    full = plain.generate(prompts, SamplingParams(greedy=True, max_new_tokens=12))
    stop = full[1].text[3:5]
    params = SamplingParams(greedy=True, max_new_tokens=12, stop=(stop,))
    got, want = fast.generate(prompts, params), plain.generate(prompts, params)
    assert [(c.token_ids, c.text, c.finish_reason) for c in got] == [(c.token_ids, c.text, c.finish_reason) for c in want]
    assert got[1].finish_reason == "stop" and got[1].text.endswith(stop)


def test_weights_changed_in_place_are_seen_by_the_next_batch(tokenizer, prompts):  # noqa: F811
    model = make_model()
    fast, plain = engines(model, tokenizer)
    params = SamplingParams(greedy=True, max_new_tokens=10)
    before = fast.generate(prompts, params)
    with torch.no_grad():  # an optimizer step changes the shared module's tensors in place
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    after = fast.generate(prompts, params)
    assert [c.token_ids for c in after] == [c.token_ids for c in plain.generate(prompts, params)]
    assert [c.token_ids for c in after] != [c.token_ids for c in before]


def test_lora_layers_decode_through_their_modules(tokenizer, prompts):  # noqa: F811
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(make_model(), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                              init_lora_weights=False))
    fast, plain = engines(model, tokenizer)
    params = SamplingParams(greedy=True, max_new_tokens=10)
    got, want = fast.generate(prompts, params), plain.generate(prompts, params)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for a, b in zip(got, want):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_the_cpu_draw_samples_the_softmax():
    """The CPU's inverse-CDF draw picks each token with its probability under softmax(z / T)
    (CUDA's kernel: test_draw.py)."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]]).repeat(40_000, 1)
    generator = torch.Generator().manual_seed(0)
    probs = (logits[0] / 1.3).softmax(-1)
    token, logprob = sample(logits, SamplingParams(temperature=1.3), generator)
    freq = torch.bincount(token, minlength=5).float() / len(token)
    assert freq.tolist() == pytest.approx(probs.tolist(), abs=0.01)  # ~5 standard errors
    assert logprob.tolist() == pytest.approx(probs.log()[token].tolist(), abs=1e-6)
    truncated, _ = sample(logits, SamplingParams(top_k=2), generator)
    assert set(truncated.tolist()) == {0, 1}
    banned, _ = sample(logits, SamplingParams(), generator, banned=torch.tensor([0, 4]))
    assert set(banned.tolist()) == {1, 2, 3}


def test_a_rows_draw_does_not_depend_on_the_rows_beside_it():
    logits = torch.randn(6, 50)
    every = sample(logits, SamplingParams(), torch.Generator().manual_seed(4))[0]
    rows = torch.tensor([1, 4, 5])
    some = sample(logits[rows], SamplingParams(), torch.Generator().manual_seed(4), rows=(rows, 6))[0]
    assert some.tolist() == every[rows].tolist()


def test_a_deep_copy_keeps_its_own_weights(tokenizer, prompts):  # noqa: F811
    # an engine over a copy (the Ray rollout worker's) refreshes from the copy, not the original
    model = make_model()
    copied = copy.deepcopy(model)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-1)
    fast, _ = engines(copied, tokenizer)
    _, plain = engines(make_model(), tokenizer)
    params = SamplingParams(greedy=True, max_new_tokens=8)
    assert [c.token_ids for c in fast.generate(prompts, params)] == [c.token_ids for c in plain.generate(prompts, params)]


def test_sleep_frees_the_cache_and_the_next_rollout_is_the_same(tokenizer, prompts):  # noqa: F811
    fast, _ = engines(make_model(), tokenizer)
    params = SamplingParams(n=3, max_new_tokens=10, seed=5)
    first = fast.generate(prompts, params)
    assert fast.static.rows > 0 and hasattr(fast.static, "keys")
    fast.sleep()
    assert fast.static.rows == 0 and not hasattr(fast.static, "keys")
    again = fast.generate(prompts, params)
    assert [c.token_ids for c in again] == [c.token_ids for c in first]
    assert [lp for c in again for lp in c.logprobs] == pytest.approx([lp for c in first for lp in c.logprobs])


class CpuRemappable:
    """``remap.Remappable`` on the CPU for the decoder's side of it: ``unmap`` leaves NaN
    where the memory was (its contents are lost), ``map`` zeroes it unless told not to."""

    made = []

    def __init__(self, device, specs):
        self.tensors = [torch.zeros(shape, dtype=dtype) for shape, dtype in specs]
        self.mapped, self.closed = True, False
        CpuRemappable.made.append(self)

    def map(self, zero=True):
        if self.mapped:
            return False
        if zero:
            for t in self.tensors:
                t.zero_()
        self.mapped = True
        return True

    def unmap(self):
        with torch.inference_mode():  # the tensors were made in a rollout's
            for t in self.tensors:
                t.fill_(float("nan"))
        self.mapped = False

    def close(self):
        self.closed = True


def test_sleep_over_remappable_memory_keeps_the_buffers_and_the_next_rollout_is_the_same(
        tokenizer, prompts, monkeypatch):  # noqa: F811
    """Where the cache's addresses outlive its memory (CUDA's virtual memory), ``sleep``
    hands the memory back and keeps every buffer (the graphs that read them stay valid); the
    next rollout maps fresh memory and decodes as a fresh engine does, whatever the memory
    held, and the stacked projections are filled again."""
    from rlx.engines import static_decode

    monkeypatch.setattr(static_decode.remap, "Remappable", CpuRemappable)
    CpuRemappable.made.clear()
    fast, _ = engines(make_model(), tokenizer)
    fast.static.remappable = True
    params = SamplingParams(n=3, max_new_tokens=10, seed=5)
    first = fast.generate(prompts, params)
    cache, projections = CpuRemappable.made
    keys = [k.data_ptr() for k in fast.static.keys]
    assert keys == [t.data_ptr() for t in cache.tensors[:len(keys)]]
    assert fast.static._projections[0][0].data_ptr() == projections.tensors[0].data_ptr()
    fast.sleep()
    assert not cache.mapped and not projections.mapped and fast.static.rows > 0
    again = fast.generate(prompts, params)
    assert cache.mapped and projections.mapped and len(CpuRemappable.made) == 2
    assert [k.data_ptr() for k in fast.static.keys] == keys
    assert [c.token_ids for c in again] == [c.token_ids for c in first]
    assert [lp for c in again for lp in c.logprobs] == pytest.approx([lp for c in first for lp in c.logprobs])
    fresh, _ = engines(make_model(), tokenizer)
    assert [c.token_ids for c in fresh.generate(prompts, params)] == [c.token_ids for c in first]
    fast.static.release()
    assert cache.closed and projections.closed and not hasattr(fast.static, "keys")


def test_remappable_tensors_are_laid_out_aligned():
    from rlx.engines import remap

    offsets, size = remap.layout([((3, 5), torch.bfloat16), ((7,), torch.float32), ((2, 2), torch.int64)])
    assert offsets == [0, 256, 512] and size == 768
    assert not remap.supported(torch.device("cpu"))


def test_memory_mapped_outside_pytorch_is_counted_until_the_peak_is_reset(monkeypatch):
    """What the trainer's memory metrics add to PyTorch's counts (the map and unmap calls
    that keep the counts run on a GPU only)."""
    from rlx.engines import remap

    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(remap, "_mapped", {0: 3 << 30})
    monkeypatch.setattr(remap, "_peak", {0: 5 << 30})
    assert remap.mapped(gpu) == 3 << 30 and remap.peak_mapped(gpu) == 5 << 30
    remap.reset_peak(gpu)
    assert remap.peak_mapped(gpu) == 3 << 30 and remap.peak_mapped(torch.device("cuda", 1)) == 0


def test_the_trainer_s_peaks_add_the_mapped_memory_and_start_afresh(monkeypatch):
    """The policy worker's memory metrics: PyTorch's peaks plus the peak mapped outside its
    allocator, in GiB, every count reset after (PyTorch's stand-ins here: no GPU)."""
    from rlx.engines import remap
    from rlx.workers import policy

    gpu = torch.device("cuda", 0)
    stats = {"allocated": 2 << 30, "reserved": 4 << 30}
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: stats["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: stats["reserved"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: stats.update(allocated=0, reserved=0))
    monkeypatch.setattr(remap, "_mapped", {0: 0})
    monkeypatch.setattr(remap, "_peak", {0: 1 << 30})
    assert policy._peaks(gpu) == (3.0, 5.0)
    assert policy._peaks(gpu) == (0.0, 0.0)


def test_the_first_remaining_slot_of_a_prompt_leads_its_samples():
    """The attention kernel reads a prompt's columns once for the slots its first
    remaining slot lists (row r is a sample of prompt r // n), a tile's worth at a time;
    a batch bucket's spare slots read their own."""
    from rlx.engines.static_decode import prompt_members
    assert prompt_members(np.arange(6), 2, 2, 8).tolist() == [
        [0, 1], [-1, -1], [2, 3], [-1, -1], [4, 5], [-1, -1], [6, -1], [7, -1]]
    # rows 0, 4 and 7 done, the rest moved to the front
    assert prompt_members(np.array([1, 2, 3, 5, 6]), 2, 2, 6).tolist() == [
        [0, -1], [1, 2], [-1, -1], [3, -1], [4, -1], [5, -1]]
    # more samples than a tile takes: a second leader
    assert prompt_members(np.arange(8), 4, 3, 8).tolist() == [
        [0, 1, 2], [-1] * 3, [-1] * 3, [3, -1, -1], [4, 5, 6], [-1] * 3, [-1] * 3, [7, -1, -1]]
    fast = NativeEngine(make_model(), None).static
    fast.triton_attention = True  # what a GPU with Triton sets; only the bookkeeping runs here
    fast._allocate(8, 16, torch.float32)
    fast._share_prompts(np.arange(8), 2)
    assert fast.members.tolist() == prompt_members(np.arange(8), 2, 2, 8).tolist()
    fast._graphs[0], fast._pool = "a graph reading the groups", "its memory pool"
    fast._share_prompts(np.arange(8), 1)  # one sample a prompt: each slot reads its own
    assert fast.members is None and not fast._graphs and fast._pool is None


def tiny(config):
    """A 2-layer model of ``config``'s architecture at the test's sizes."""
    for key, value in dict(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=1, intermediate_size=128, head_dim=32, eos_token_id=EOS,
                           pad_token_id=0).items():
        setattr(config, key, value)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("config", [
    transformers.LlamaConfig(attention_bias=False),  # no projection biases
    transformers.LlamaConfig(attention_bias=True),
    transformers.Qwen3Config(),  # per-head query and key norms after the stacked projection
], ids=["llama", "llama-bias", "qwen3"])
def test_stacked_projections_decode_as_the_model_does(tokenizer, prompts, config):  # noqa: F811
    model = tiny(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):  # initialised to zero
                p.normal_()
    fast, plain = engines(model, tokenizer)
    params = SamplingParams(greedy=True, max_new_tokens=8)
    got, want = fast.generate(prompts, params), plain.generate(prompts, params)
    assert all(stacked is not None for stacked in fast.static._projections)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for a, b in zip(got, want):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


MANY = ["ab", "hello there", "1+2=3 is", "x", "the cat sat", "9*9", "one two three four", "zz top", "q"]


@LAYOUTS
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_prompts_join_as_rows_finish(tokenizer, greedy, keys_transposed):  # noqa: F811
    """More prompts than slots: the next prompts are prefilled into the slots of finished
    rows while the others decode on. Every completion carries the log-probs a forward pass
    gives its tokens; greedy ones equal the plain loop's (batch by batch), in fewer decode
    steps than batches decoded one after another; a seed repeats sampled ones."""
    prompts = [tokenizer(p, add_special_tokens=False).input_ids for p in MANY]
    model = eos_model(tokenizer, prompts)
    fast, plain = NativeEngine(model, tokenizer, max_batch_size=4), NativeEngine(model, tokenizer, max_batch_size=4)
    plain.static = None
    fast.static.keys_transposed = keys_transposed
    steps, prefilled = [], []
    replay, prefill = fast.static._replay, fast._prefill
    fast.static._replay = lambda *a: (steps.append(1), replay(*a))
    fast._prefill = lambda p, i: (prefilled.append(len(p)), prefill(p, i))[1]
    params = SamplingParams(n=2, max_new_tokens=16, seed=1, greedy=greedy)
    got = fast.generate(prompts, params)
    assert [c.prompt_index for c in got] == [i for i in range(len(prompts)) for _ in range(2)]
    assert sum(prefilled) == len(prompts)
    for c in got:
        assert 1 <= len(c.token_ids) <= 16 and (c.finish_reason == "length") == (c.token_ids[-1] not in fast.eos_ids)
        ids = torch.tensor([prompts[c.prompt_index] + c.token_ids])
        with torch.no_grad():
            logp = (model(ids).logits[0] / (1.0 if greedy else params.temperature)).log_softmax(-1)
        start = len(prompts[c.prompt_index]) - 1
        assert c.logprobs == pytest.approx([logp[start + i, t].item() for i, t in enumerate(c.token_ids)], abs=1e-5)
    if greedy:
        assert [c.token_ids for c in got] == [c.token_ids for c in plain.generate(prompts, params)]
        lengths = [len(c.token_ids) for c in got]  # batches of 4 rows one after another: the longest of each
        assert len(steps) < sum(max(lengths[i:i + 4]) - 1 for i in range(0, len(lengths), 4))
        assert len(prefilled) > len(range(0, len(prompts), 2))  # prompts joined one at a time
    else:
        assert [c.token_ids for c in fast.generate(prompts, params)] == [c.token_ids for c in got]


def test_finished_rows_waiting_in_the_batch_stay_inside_the_cache(tokenizer):  # noqa: F811
    """Prompts of one length joining as rows finish: a row that reached the token limit
    waits in the batch while rows admitted after it decode on, so it steps past the last
    position the cache holds; it must write on at that position, not past it."""
    prompts = [tokenizer("abcd", add_special_tokens=False).input_ids] * 12
    model = eos_model(tokenizer, prompts)
    params = SamplingParams(n=2, max_new_tokens=24, seed=0)
    got = NativeEngine(model, tokenizer, max_batch_size=4).generate(prompts, params)
    assert any(c.finish_reason == "length" for c in got) and any(c.finish_reason != "length" for c in got)
    for c in got:
        ids = torch.tensor([prompts[c.prompt_index] + c.token_ids])
        with torch.no_grad():
            logp = (model(ids).logits[0] / params.temperature).log_softmax(-1)
        assert c.logprobs == pytest.approx([logp[3 + i, t].item() for i, t in enumerate(c.token_ids)], abs=1e-5)


@pytest.mark.parametrize("config", [transformers.Qwen2Config(), transformers.Qwen3Config()], ids=["qwen2", "qwen3"])
def test_the_graphed_steps_layers_run_eagerly_decode_as_the_plain_loop(tokenizer, prompts, config):  # noqa: F811
    """The decode step a CUDA graph captures (compiled pieces, each layer's MLP output added
    in the next layer's first piece), run here uncaptured with SDPA for the Triton kernel."""
    model = tiny(config)
    fast, plain = engines(model, tokenizer, keys_transposed=False)
    fast.static._layers_eager = fast.static._layers_graphed
    params = SamplingParams(n=2, max_new_tokens=12, greedy=True)
    got, want = fast.generate(prompts, params), plain.generate(prompts, params)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert [lp for c in got for lp in c.logprobs] == pytest.approx([lp for c in want for lp in c.logprobs], abs=1e-5)


def test_a_stacked_gate_and_up_projection_gives_the_mlps_output(monkeypatch):
    """The decode step's MLP with one matmul for the gate and up projections (the CUDA graph's
    path, run here eagerly) against the model's own; LoRA-wrapped or too large, none is stacked."""
    from rlx.engines import static_decode

    model = make_model()
    layers = list(model.model.layers)
    stacked = [torch.empty(shape) for shape in static_decode._gate_up_shapes(layers)]
    x, attended = torch.randn(5, 1, 64), torch.randn(5, 1, 64)
    with torch.no_grad():
        for layer, gate_up in zip(layers, stacked):
            torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight], out=gate_up)
            torch.testing.assert_close(sum(static_decode._mlp(layer, x, attended, gate_up)),
                                       sum(static_decode._mlp(layer, x, attended)), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(static_decode, "GATE_UP_BYTES", sum(2 * layer.mlp.gate_proj.weight.nbytes for layer in layers) - 1)
    assert static_decode._gate_up_shapes(layers) == [None] * len(layers)
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(make_model(), peft.LoraConfig(r=4, target_modules=["up_proj"]))
    monkeypatch.setattr(static_decode, "GATE_UP_BYTES", 1 << 30)
    assert static_decode._gate_up_shapes(list(lora.base_model.model.model.layers)) == [None] * len(layers)
