"""Loading, scoring and saving models.

Policies and reference models are ``AutoModelForCausalLM``; reward models and critics
are ``AutoModelForSequenceClassification`` with one label, so every model rlx writes is
plain Hugging Face format. Functions that take a ``model`` accept the bare Hugging Face
module, a peft wrapper of it, or a training-engine wrapper exposing ``.module``.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from rlx import sdpa, varlen
from rlx.config import ModelConfig
from rlx.errors import ModelError
from rlx.paths import check_model_folder, model_path

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# rows of logits turned into float32 at once: bounds the temporary copy to ~64 MiB
_CHUNK_ELEMENTS = 1 << 24


def resolve_device(name: str) -> torch.device:
    """``auto`` is the GPU of this process (``LOCAL_RANK`` under a launcher) when CUDA is
    available, else the CPU; ``cuda`` without an index also follows ``LOCAL_RANK``."""
    if name in ("auto", "cuda"):
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        if name == "cuda":
            raise ModelError("training.device is 'cuda' but no CUDA device is available")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"training.device is {name!r} but no CUDA device is available")
    return device


def resolve_dtype(name: str, device: torch.device | str) -> torch.dtype:
    """``auto`` is bfloat16 on CUDA and float32 elsewhere."""
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ModelError(f"unknown dtype {name!r}; expected auto or one of {', '.join(_DTYPES)}")
    return _DTYPES[name]


def attn_implementation(name: str, device: torch.device | str | None = None, vlm: bool = False) -> str:
    """``auto`` takes flash-attn when it is installed and the device (by default the
    GPU when there is one) is CUDA; else, for a text model on CUDA that torch's flash kernel
    runs on, ``rlx.varlen`` (SDPA, torch's own variable-length kernel for packed rows and
    rows of shared prompts); else, on the CPU, SDPA with grouped-query heads read in place
    (``rlx.sdpa``); else SDPA."""
    has_flash = importlib.util.find_spec("flash_attn") is not None
    if name == "auto":
        device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
        if has_flash and device.type == "cuda":
            return "flash_attention_2"
        if not vlm and varlen.available(device):
            name = varlen.NAME
        else:
            name = sdpa.NAME if device.type == "cpu" else "sdpa"
    if name == "flash_attention_2" and not has_flash:
        raise ModelError("model.attn_implementation is flash_attention_2 but flash-attn is not installed")
    if name == varlen.NAME:
        varlen.register()
    if name == sdpa.NAME:
        sdpa.register()
    return name


def load_tokenizer(path: str | Path):
    """The tokenizer of a model folder or hub name, with a pad token (eos when missing)."""
    from transformers import AutoTokenizer

    source = model_path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as e:
        check_model_folder(source)  # a folder without config.json: say that, not why the tokenizer failed
        where = "" if Path(source).exists() else "no such local folder, and loading it from the hub failed: "
        raise ModelError(f"cannot load a tokenizer from {source!r}: {where}{e}") from e
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelError(f"the tokenizer of {source!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _from_pretrained(auto_class, cfg: ModelConfig, device: torch.device, path: str | None, vlm: bool = False,
                     new_head: str | None = None, **kwargs):
    """``new_head``: the prefix of the weights the auto class adds on top of a causal LM's
    (``score.``); a load that only lacks those and drops the LM head prints no report."""
    source = model_path(path or cfg.path)
    check_model_folder(source)
    report = _HeldRecords(logging.getLogger("transformers.modeling_utils") if new_head else None)
    try:
        with report:
            loaded = auto_class.from_pretrained(
                source,
                dtype=resolve_dtype(cfg.dtype, device),
                attn_implementation=attn_implementation(cfg.attn_implementation, device, vlm),
                trust_remote_code=cfg.trust_remote_code,
                output_loading_info=bool(new_head),
                **kwargs,
            )
    except (OSError, ValueError) as e:
        where = "folder" if Path(source).expanduser().exists() else "name (no such local folder, and not loadable from the hub)"
        raise ModelError(f"cannot load model {source!r}: bad model {where}: {e}") from e
    if not new_head:
        return loaded.to(device)
    model, info = loaded
    expected = (all(k.startswith(new_head) for k in info["missing_keys"]) and not info["mismatched_keys"]
                and all(k.startswith("lm_head.") for k in info["unexpected_keys"]))
    # anything else transformers logged while loading still shows
    report.replay(lambda record: not (expected and "LOAD REPORT" in record.getMessage()))
    return model.to(device)


class _HeldRecords(logging.Filter):
    """Inside ``with``, holds back what ``logger`` logs (nothing without a logger) until
    ``replay`` logs those records ``keep`` picks; a block that raises replays all of them,
    so that a report stands above its error."""

    def __init__(self, logger: logging.Logger | None):
        super().__init__()
        self.logger, self.records = logger, []

    def __enter__(self):
        if self.logger is not None:
            self.logger.addFilter(self)
        return self

    def __exit__(self, kind, error, trace) -> None:
        if self.logger is not None:
            self.logger.removeFilter(self)
        if kind is not None:
            self.replay()

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False

    def replay(self, keep=lambda record: True) -> None:
        for record in self.records:
            if keep(record):
                self.logger.handle(record)
        self.records = []


def _prepare_for_training(model, cfg: ModelConfig, task_type: str):
    """Gradient checkpointing and LoRA adapters, as the config asks."""
    if cfg.gradient_checkpointing:
        # non-reentrant checkpointing needs no input grads, so frozen embeddings (LoRA) work
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if cfg.lora.rank > 0:
        try:
            import peft
        except ImportError as e:
            raise ModelError("model.lora.rank > 0 needs peft: pip install 'rlx[lora]'") from e
        targets = cfg.lora.target_modules
        lora = peft.LoraConfig(
            task_type=task_type,
            r=cfg.lora.rank,
            lora_alpha=cfg.lora.alpha,
            lora_dropout=cfg.lora.dropout,
            # peft takes "all-linear" only as a plain string; it excludes the output head
            target_modules="all-linear" if targets == ["all-linear"] else list(targets),
        )
        model = peft.get_peft_model(model, lora)
    return model.train()


def _freeze(model):
    model.requires_grad_(False)
    return model.eval()


def load_causal_lm(cfg: ModelConfig, device: torch.device, *, path: str | None = None, trainable: bool = True):
    """A causal LM on ``device`` in the configured dtype and attention kernel.

    ``path`` overrides ``cfg.path`` (a reference model, say). A trainable model gets
    gradient checkpointing and LoRA as configured; a frozen one is in eval mode with no
    gradients.
    """
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from rlx.multimodal import model_type

    source = model_path(path or cfg.path)
    check_model_folder(source)
    is_vlm = Path(source).expanduser().is_dir() and model_type(source)[1]
    model = _from_pretrained(AutoModelForImageTextToText if is_vlm else AutoModelForCausalLM, cfg, device, path,
                             bool(is_vlm))
    if is_vlm and cfg.freeze_vision and trainable:
        vision_tower(model).requires_grad_(False)
    return _prepare_for_training(model, cfg, "CAUSAL_LM") if trainable else _freeze(model)


VISION_TOWERS = ("visual", "vision_tower", "vision_model")


def vision_tower(model) -> torch.nn.Module:
    """The image encoder of a VLM: the submodule named ``visual`` (Qwen-VL),
    ``vision_tower`` (LLaVA and others) or ``vision_model``."""
    hf = hf_module(model)
    for owner in (hf, getattr(hf, "model", None)):
        for name in VISION_TOWERS:
            if isinstance(getattr(owner, name, None), torch.nn.Module):
                return getattr(owner, name)
    raise ModelError(f"model.freeze_vision: {type(hf).__name__} has no vision tower named {', '.join(VISION_TOWERS)}")


def load_value_model(cfg: ModelConfig, device: torch.device, *, path: str | None = None, trainable: bool = True):
    """A model with a scalar head for reward models and critics.

    Loading a causal-LM checkpoint initialises a fresh ``score`` head. A config without
    a pad id gets the tokenizer's. With LoRA the head stays fully trainable (peft's
    sequence-classification task saves it whole).
    """
    from transformers import AutoModelForSequenceClassification

    model = _from_pretrained(AutoModelForSequenceClassification, cfg, device, path, new_head="score.", num_labels=1)
    if model.config.pad_token_id is None:
        # the model's own forward pools at the last non-pad token and needs the pad id
        model.config.pad_token_id = load_tokenizer(path or cfg.path).pad_token_id
    return _prepare_for_training(model, cfg, "SEQ_CLS") if trainable else _freeze(model)


def _unwrap_engine(model):
    """The module inside training-engine wrappers (DeepSpeed, DDP: ``.module``)."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


def compile_layers(model, setting: bool | str, memory: float = 1.0) -> None:
    """torch.compile each decoder layer when ``setting`` (``training.compile``) says so.

    Regional compilation: the layers share one compiled graph, built in seconds, which
    fuses the norms, the rotary embedding and the activation between the matmuls (on W1 the
    update ran 1.3x faster). ``auto`` compiles on CUDA only, and neither under gradient
    checkpointing, whose recomputation replays the layer outside the compiled graph, nor
    under LoRA, whose wrapped layers have not been measured compiled.

    ``memory`` (``training.compile_memory``) below 1 bounds the activations the compiled
    backward keeps, as that fraction of what it would keep; the partitioner then recomputes
    cheap elementwise outputs (the MLP's gated product, the norms) rather than store them.
    The setting is the process's: it is read when a graph compiles.
    """
    module = hf_module(model)
    device = next(module.parameters()).device
    lora = hasattr(_unwrap_engine(model), "peft_config")
    if setting is False or (setting == "auto" and (device.type != "cuda" or module.is_gradient_checkpointing or lora)):
        return
    import torch._functorch.config

    torch._functorch.config.activation_memory_budget = memory
    base = getattr(module, module.base_model_prefix, module)
    for layer in getattr(base, "layers", None) or []:
        layer.compile()


def full_attention(config) -> bool:
    """Whether every layer of a model of ``config`` attends over the whole sequence (no
    sliding window), so that a cache holds every earlier key and value."""
    text = config.get_text_config()
    if any(t != "full_attention" for t in getattr(text, "layer_types", None) or []):
        return False
    return not (text.model_type == "mistral" and getattr(text, "sliding_window", None))


def zero3(model) -> bool:
    """Whether DeepSpeed ZeRO-3 shards ``model``'s weights (each forward gathers them)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def layers_compiled(model) -> bool:
    """Whether ``compile_layers`` compiled the model's decoder layers."""
    module = hf_module(model)
    base = getattr(module, module.base_model_prefix, module)
    return any(layer._compiled_call_impl is not None for layer in getattr(base, "layers", None) or [])


def hf_module(model):
    """The Hugging Face module inside engine and peft wrappers."""
    model = _unwrap_engine(model)
    get_base = getattr(model, "get_base_model", None)
    return get_base() if get_base is not None else model


def token_values(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The scalar head applied at every position: ``[B, T]`` in float32.

    The head's output is taken from a forward pass of the whole model rather than by
    calling the base model and the head one after the other: DeepSpeed ZeRO-3 only
    accumulates gradients correctly over passes through the outermost module.
    """
    _, scores = run_capturing(model, hf_module(model).score, input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids, use_cache=False)
    return scores.squeeze(-1).float()


def run_capturing(model, module, **inputs):
    """``model(**inputs)`` and what ``module``, one of its submodules, returned in that pass
    (a forward hook, removed after it): the pass goes through the outermost module all the same."""
    captured = []
    hook = module.register_forward_hook(lambda m, args, out: captured.append(out))
    try:
        out = model(**inputs)
    finally:
        hook.remove()
    return out, captured[-1]


def last_token_values(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``values[b, t]`` at the last position where ``attention_mask`` is set, for left or
    right padding alike: ``[B]``."""
    flipped = attention_mask.flip(-1).to(torch.int32)
    last = attention_mask.shape[-1] - 1 - flipped.argmax(-1)  # argmax finds the first 1 from the right
    return values.gather(-1, last.unsqueeze(-1)).squeeze(-1)


class _NextTokenLogprob(torch.autograd.Function):
    """``log_softmax(logits[:, t] / T)[input_ids[:, t + 1]]`` for ``t < T - 1``.

    Works through the logits a few rows at a time in float32 and saves only the
    logits (alive anyway) and one log-normaliser per row for the backward pass, so no
    float32 copy of the full ``[B, T, V]`` tensor is ever held.
    """

    @staticmethod
    def forward(ctx, logits, input_ids, temperature):
        batch, length, vocab = logits.shape
        rows = max(1, _CHUNK_ELEMENTS // vocab)
        targets = input_ids[:, 1:]
        logp = torch.empty(batch, length - 1, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(logp)
        for b in range(batch):
            for s in range(0, length - 1, rows):
                e = min(s + rows, length - 1)
                x = logits[b, s:e].float() / temperature
                lse[b, s:e] = torch.logsumexp(x, dim=-1)
                logp[b, s:e] = x.gather(-1, targets[b, s:e, None]).squeeze(-1) - lse[b, s:e]
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        return logp

    @staticmethod
    def backward(ctx, grad_logp):
        logits, targets, lse = ctx.saved_tensors
        batch, length, vocab = logits.shape
        rows = max(1, _CHUNK_ELEMENTS // vocab)
        grad = torch.zeros_like(logits)
        for b in range(batch):
            for s in range(0, length - 1, rows):
                e = min(s + rows, length - 1)
                g = grad_logp[b, s:e, None].float()
                # d logp / d x = onehot(target) - softmax(x), and x = logits / T
                d = torch.exp(logits[b, s:e].float() / ctx.temperature - lse[b, s:e, None]) * -g
                d.scatter_add_(-1, targets[b, s:e, None], g)
                grad[b, s:e] = d / ctx.temperature
        return grad, None, None


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                   position_ids: torch.Tensor | None = None, temperature: float = 1.0, **inputs) -> torch.Tensor:
    """Log-probability of each next token under ``model``: ``[B, T - 1]`` in float32.

    Entry ``t`` scores ``input_ids[:, t + 1]`` given the tokens up to ``t``. ``inputs``
    go to the model too (a VLM's image tensors).
    """
    if attention_mask is None and position_ids is not None and len(input_ids) == 1 and not inputs:
        inputs = varlen.packed_kwargs(position_ids)  # a packed row: its samples' bounds
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False, **inputs).logits
    return _NextTokenLogprob.apply(logits, input_ids, float(temperature))


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of ``softmax(logits / T)`` over the last dimension, in float32, a few
    rows at a time."""
    flat = logits.reshape(-1, logits.shape[-1])
    rows = max(1, _CHUNK_ELEMENTS // flat.shape[-1])
    parts = []
    for s in range(0, flat.shape[0], rows):
        x = flat[s:s + rows].float() / temperature
        logp = F.log_softmax(x, dim=-1)
        parts.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(parts).reshape(logits.shape[:-1])


def _cpu_state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def _cpu_replica(model, state: dict[str, torch.Tensor]):
    """A CPU model built like ``model`` (peft adapters included) holding ``state``.

    It is built on the meta device and then given ``state``, so the training model is
    never copied on its device nor changed.
    """
    hf = hf_module(model)
    peft_config = getattr(model, "peft_config", None)
    config = copy.deepcopy(hf.config)
    config.use_cache = True  # switched off for gradient checkpointing, wanted for generation
    with torch.device("meta"):
        replica = type(hf)(config)
        if peft_config is not None:
            import peft

            replica = peft.get_peft_model(replica, peft_config[model.active_adapter])
    replica.load_state_dict(state, strict=False, assign=True)
    # non-persistent buffers (rotary frequencies...) are in no state dict
    buffers = dict(model.named_buffers())
    for name, buffer in list(replica.named_buffers()):
        if buffer.is_meta:
            owner, _, leaf = name.rpartition(".")
            replica.get_submodule(owner).register_buffer(leaf, buffers[name].detach().cpu(), persistent=False)
    missing = [name for name, p in replica.named_parameters() if p.is_meta]
    if missing:
        raise ModelError(f"cannot save the model: no weights for {', '.join(missing[:5])}")
    generation_config = getattr(hf, "generation_config", None)
    if generation_config is not None:
        replica.generation_config = generation_config
    return replica


_FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def engine_weights(model, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights a rollout engine with its own copy of the model loads: checkpoint names
    and, under LoRA, the adapters merged and only the layers that carry them (with the
    layers an engine fuses them with: q/k/v, gate/up). ``state`` is ``model.state_dict()``
    with full weights. Weights that do not train (a frozen vision tower) are left out: the
    engine holds them already."""
    model = _unwrap_engine(model)
    if not hasattr(model, "merge_and_unload"):
        frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
        return {k: v for k, v in state.items() if k not in frozen} if frozen else state
    adapted = {k.split(".lora_A.")[0].removeprefix("base_model.model.") for k in state if ".lora_A." in k}
    for prefix in list(adapted):
        owner, _, leaf = prefix.rpartition(".")
        for group in _FUSED:
            if leaf in group:
                adapted.update(f"{owner}.{m}" for m in group)
    # merging writes into the base weights: into copies, not the caller's tensors
    state = {k: v.clone() if ".base_layer." in k else v for k, v in state.items()}
    merged = _cpu_replica(model, state).merge_and_unload().state_dict()
    return {k: v for k, v in merged.items() if k.rpartition(".")[0] in adapted}


def save_hf(model, tokenizer, out_dir: str | Path, *, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Write ``model`` and ``tokenizer`` in ``save_pretrained`` layout under ``out_dir``.

    LoRA adapters are merged into a CPU replica, so a training run can go on with the
    model untouched. ``state_dict`` supplies full weights where the module's own are
    partitioned (ZeRO-3); its keys are those of ``model.state_dict()``.
    """
    out = Path(out_dir)
    model = _unwrap_engine(model)
    replica = _cpu_replica(model, state_dict if state_dict is not None else _cpu_state(model))
    if hasattr(replica, "merge_and_unload"):
        replica = replica.merge_and_unload()
    if getattr(replica.config, "pad_token_id", None) is None and tokenizer is not None:
        # sequence-classification heads find the last token through the pad id
        replica.config.pad_token_id = tokenizer.pad_token_id
    save_pretrained(replica, out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def save_pretrained(model, out_dir: str | Path) -> None:
    """``model.save_pretrained(out_dir)``. On a machine without CUDA, transformers imports
    DeepSpeed there (where it is installed), which warns that it found no GPU: every CPU
    run printed that at its end. It is told the accelerator it would choose."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    model.save_pretrained(out_dir)
