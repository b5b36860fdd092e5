import os
import re
import shutil
import subprocess
import sys
import types

import pytest
import torch
import transformers
from tokenizers import Tokenizer, models as tok_models, pre_tokenizers

from rlx import models, paths
from rlx.config import LoraConfig, ModelConfig

CPU = torch.device("cpu")


def _tiny_lm(path, seed=0):
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=128)
    transformers.Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def _tokenizer(path):
    vocab = {"<eos>": 0, "<unk>": 1, **{chr(97 + i): i + 2 for i in range(26)}}
    tok = Tokenizer(tok_models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>")
    fast.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    _tiny_lm(path)
    _tokenizer(path)
    return path


def _ids(batch=3, length=9, seed=0):
    return torch.randint(2, 28, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_devices_and_dtypes(monkeypatch):
    assert models.resolve_device("cpu") == CPU
    if not torch.cuda.is_available():
        assert models.resolve_device("auto") == CPU
        with pytest.raises(models.ModelError, match="no CUDA"):
            models.resolve_device("cuda")
    assert models.resolve_dtype("auto", CPU) is torch.float32
    assert models.resolve_dtype("auto", "cuda") is torch.bfloat16
    assert models.resolve_dtype("float16", CPU) is torch.float16
    with pytest.raises(models.ModelError, match="float64"):
        models.resolve_dtype("float64", CPU)


def test_attention_choice(monkeypatch):
    real = models.importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None if name == "flash_attn" else real(name))
    monkeypatch.setattr(models.varlen, "available", lambda device: torch.device(device).type == "cuda")
    assert models.attn_implementation("auto", "cuda") == "rlx_varlen"
    assert models.attn_implementation("auto", "cuda", vlm=True) == "sdpa"
    with pytest.raises(models.ModelError, match="flash-attn is not installed"):
        models.attn_implementation("flash_attention_2", "cuda")
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: object())
    assert models.attn_implementation("auto", "cuda") == "flash_attention_2"
    assert models.attn_implementation("auto", CPU) == "rlx_sdpa"
    assert models.attn_implementation("auto") == ("flash_attention_2" if torch.cuda.is_available() else "rlx_sdpa")
    assert models.attn_implementation("eager", "cuda") == "eager"


def test_tokenizer_gets_a_pad_token(tmp_path):
    _tokenizer(tmp_path)
    tok = models.load_tokenizer(tmp_path)
    assert tok.pad_token == "<eos>" and tok.pad_token_id == 0
    with pytest.raises(models.ModelError, match="nowhere"):
        models.load_tokenizer(tmp_path / "nowhere")


def test_missing_model_names_the_path(tmp_path):
    with pytest.raises(models.ModelError, match="no-such-model"):
        models.load_causal_lm(ModelConfig(path=str(tmp_path / "no-such-model")), CPU)


@pytest.mark.parametrize("name", ["gpt2", "Qwen/Qwen2.5-0.5B-Instruct", "org_1/model.v2-x"])
def test_hub_names_pass_through(name):
    assert paths.model_path(name) == name


@pytest.mark.parametrize("path", ["/nonexistent/model", "./no-such-model", "../no-such-model", "~/no-such-model-rlx",
                                  "models/no/such-model", "-model", "model-", "a--b", "a..b", "owner//name"])
def test_a_path_that_can_be_no_hub_name_must_be_a_folder(path, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(models.ModelError, match=f"^model folder {re.escape(repr(path))} does not exist"):
        paths.model_path(path)
    with pytest.raises(models.ModelError, match="does not exist"):
        models.load_tokenizer(path)


def test_a_folder_needs_config_json(lm_path, tmp_path):
    # the tokenizer alone loads (tokenizer folders need no config.json), the model does not
    folder = tmp_path / "tokenizer-only"
    shutil.copytree(lm_path, folder, ignore=shutil.ignore_patterns("config.json", "*.safetensors"))
    assert models.load_tokenizer(folder).eos_token == "<eos>"
    with pytest.raises(models.ModelError, match=f"model folder '{folder}' holds no config.json"):
        models.load_causal_lm(ModelConfig(path=str(folder)), CPU)
    (tmp_path / "empty").mkdir()
    with pytest.raises(models.ModelError, match="holds no config.json"):
        models.load_tokenizer(tmp_path / "empty")
    with pytest.raises(models.ModelError, match="is a file"):
        models.load_causal_lm(ModelConfig(path=str(lm_path / "config.json")), CPU)


def test_home_is_expanded(lm_path, monkeypatch):
    monkeypatch.setenv("HOME", str(lm_path.parent))
    assert paths.model_path(f"~/{lm_path.name}") == str(lm_path)


def test_builtin_names_resolve_at_the_run_edge_not_in_the_loaders(tiny_model_dir):
    from rlx.config import RunConfig
    from rlx.run import with_builtin_models

    with pytest.raises(models.ModelError, match="built-in model name.*builtin_model"):
        models.load_causal_lm(ModelConfig(path="builtin:tiny"), CPU, trainable=False)
    config = RunConfig()
    config.model.path, config.reward.model = "builtin:tiny", "builtin:tiny"
    resolved = with_builtin_models(config)
    assert resolved.model.path == resolved.reward.model == tiny_model_dir
    assert config.model.path == "builtin:tiny"  # the run's own config keeps the name
    with pytest.raises(models.ModelError, match="unknown built-in model"):
        config.model.path = "builtin:nope"
        with_builtin_models(config)


def test_causal_lm_options(lm_path):
    cfg = ModelConfig(path=str(lm_path), dtype="bfloat16", gradient_checkpointing=True)
    model = models.load_causal_lm(cfg, CPU)
    assert model.dtype is torch.bfloat16 and model.training
    assert model.config._attn_implementation == "rlx_sdpa"
    assert model.is_gradient_checkpointing and not model.config.use_cache
    models.token_logprobs(model, _ids()).sum().backward()
    assert all(p.grad is not None for p in model.parameters())

    frozen = models.load_causal_lm(cfg, CPU, trainable=False)
    assert not frozen.training and not any(p.requires_grad for p in frozen.parameters())


def test_lora_trains_only_adapters(lm_path):
    cfg = ModelConfig(path=str(lm_path), gradient_checkpointing=True, lora=LoraConfig(rank=4, alpha=8))
    model = models.load_causal_lm(cfg, CPU)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any("mlp.down_proj" in n for n in trainable)  # all-linear reaches the MLP too
    assert not any("lm_head" in n for n in trainable)
    models.token_logprobs(model, _ids()).sum().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "lora_A" in n)


class _Logits(torch.nn.Module):
    """A stand-in model that returns fixed logits."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, **kwargs):
        return types.SimpleNamespace(logits=self.logits)


def _naive_logprobs(logits, ids, temperature):
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    return logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprobs_match_float64(dtype, monkeypatch):
    monkeypatch.setattr(models, "_CHUNK_ELEMENTS", 64 * 3)  # 3 rows per chunk: chunks split every row
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 8, 64, generator=g) * 4).to(dtype).requires_grad_()
    ids = torch.randint(0, 64, (2, 8), generator=g)
    weights = torch.randn(2, 7, generator=g)
    for temperature in (1.0, 0.7):
        got = models.token_logprobs(_Logits(logits), ids, temperature=temperature)
        want = _naive_logprobs(logits, ids, temperature)
        assert got.dtype is torch.float32 and got.shape == (2, 7)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
        (grad,) = torch.autograd.grad((got * weights).sum(), logits)
        (want_grad,) = torch.autograd.grad((want * weights.double()).sum(), logits)
        assert grad.dtype is dtype
        tolerance = 1e-5 if dtype is torch.float32 else 1e-2
        torch.testing.assert_close(grad.double(), want_grad.double(), atol=tolerance, rtol=tolerance)
        assert grad[:, -1].abs().sum() == 0  # the last position predicts nothing


def test_token_logprobs_of_a_model(lm_path):
    model = models.load_causal_lm(ModelConfig(path=str(lm_path)), CPU, trainable=False)
    ids = _ids()
    mask = torch.ones_like(ids)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        got = models.token_logprobs(model, ids, mask)
    torch.testing.assert_close(got.double(), _naive_logprobs(logits, ids, 1.0), atol=1e-5, rtol=1e-5)


def test_entropy_matches_float64(monkeypatch):
    monkeypatch.setattr(models, "_CHUNK_ELEMENTS", 64 * 5)
    logits = torch.randn(3, 7, 64) * 3
    p = torch.softmax(logits.double() / 0.5, -1)
    want = -(p * p.log()).sum(-1)
    got = models.entropy_from_logits(logits, temperature=0.5)
    assert got.shape == (3, 7) and got.dtype is torch.float32
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_last_token_values_left_and_right_padding():
    values = torch.arange(10.0).reshape(2, 5)
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 0]])
    assert models.last_token_values(values, right).tolist() == [2.0, 9.0]
    assert models.last_token_values(values, left).tolist() == [4.0, 8.0]


def test_value_model_from_a_causal_checkpoint(lm_path):
    model = models.load_value_model(ModelConfig(path=str(lm_path)), CPU)
    assert isinstance(model, transformers.Qwen2ForSequenceClassification) and model.num_labels == 1
    pad = models.load_tokenizer(lm_path).pad_token_id
    assert model.config.pad_token_id == pad  # so the model's own forward pools correctly
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0  # right padding
    ids[0, 6:] = pad
    values = models.token_values(model, ids, mask)
    assert values.shape == ids.shape and values.dtype is torch.float32
    with torch.no_grad():
        pooled = model(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
    torch.testing.assert_close(models.last_token_values(values, mask), pooled)


def test_lora_value_model_keeps_the_head_trainable(lm_path):
    model = models.load_value_model(ModelConfig(path=str(lm_path), lora=LoraConfig(rank=4)), CPU)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any("score" in n for n in trainable) and any("lora_" in n for n in trainable)
    assert not any("embed_tokens" in n for n in trainable)
    values = models.token_values(model, _ids())
    values.sum().backward()
    head = [p for n, p in model.named_parameters() if "score" in n and p.requires_grad]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head)


def _perturb_adapters(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or "score" in name:
                p.normal_(0, 0.5)


def test_save_hf_merges_lora_without_touching_the_model(lm_path, tmp_path):
    tok = models.load_tokenizer(lm_path)
    model = models.load_causal_lm(ModelConfig(path=str(lm_path), gradient_checkpointing=True,
                                              lora=LoraConfig(rank=4)), CPU)
    _perturb_adapters(model)
    before = {n: p.detach().clone() for n, p in model.state_dict().items()}
    models.save_hf(model, tok, tmp_path / "final")

    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert not model.base_model.model.config.use_cache  # the training model keeps its settings

    saved = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert not any("lora" in n for n, _ in saved.named_parameters())
    assert saved.config.use_cache
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(saved(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-4, rtol=1e-4)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "final").pad_token_id == tok.pad_token_id


def test_a_value_model_from_a_causal_lm_loads_without_a_report(lm_path, caplog):
    """The new score head and the dropped LM head are what a critic or reward model from a
    policy checkpoint always has: transformers' load report on them would read as a fault."""
    models.load_value_model(ModelConfig(path=str(lm_path)), CPU)
    assert "LOAD REPORT" not in caplog.text


def test_a_value_model_missing_body_weights_still_reports_them(lm_path, tmp_path, caplog):
    model = transformers.AutoModelForCausalLM.from_pretrained(lm_path)
    state = {k: v for k, v in model.state_dict().items() if k != "model.layers.1.mlp.down_proj.weight"}
    model.save_pretrained(tmp_path / "cut", state_dict=state)
    models.load_value_model(ModelConfig(path=str(tmp_path / "cut")), CPU)
    assert "LOAD REPORT" in caplog.text and "model.layers.1.mlp.down_proj.weight" in caplog.text


def test_a_value_model_load_that_fails_keeps_its_report(tmp_path, caplog):
    """A two-label reward model loaded as one label fails on the head's size; the report
    transformers logs before raising says which weight."""
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=128, num_labels=2, pad_token_id=0)
    transformers.Qwen2ForSequenceClassification(config).save_pretrained(tmp_path / "rm2")
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        models.load_value_model(ModelConfig(path=str(tmp_path / "rm2")), CPU)
    assert "LOAD REPORT" in caplog.text and "score.weight" in caplog.text


def test_saving_on_the_cpu_prints_no_deepspeed_warning(lm_path, tmp_path):
    """save_pretrained imports DeepSpeed (installed with rlx's pins), which warned at the end
    of every CPU run that it had found no GPU."""
    code = ("import sys; from rlx import models; "
            f"models.save_hf(models.load_causal_lm(models.ModelConfig(path={str(lm_path)!r}), 'cpu'), None, {str(tmp_path / 'out')!r}); "
            "print('deepspeed' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.split()[-1] == "True"  # the import the setting is for still happens
    assert "accelerator" not in result.stdout + result.stderr


@pytest.mark.parametrize("rank", [0, 4])
def test_save_hf_value_model(lm_path, tmp_path, rank):
    tok = models.load_tokenizer(lm_path)
    model = models.load_value_model(ModelConfig(path=str(lm_path), lora=LoraConfig(rank=rank)), CPU)
    _perturb_adapters(model)
    models.save_hf(model, tok, tmp_path / "rm")
    saved = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")
    assert saved.config.pad_token_id == tok.pad_token_id
    ids = _ids()
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want = models.last_token_values(models.token_values(model, ids, mask), mask)
        torch.testing.assert_close(saved(input_ids=ids, attention_mask=mask).logits.squeeze(-1), want,
                                   atol=1e-5, rtol=1e-5)
