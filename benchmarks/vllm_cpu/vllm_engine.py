"""A vLLM rollout engine with rlx's RolloutEngine interface (prototype for vLLM 0.32, CPU).

    engine = VLLMEngine(path)                      # in-process by default (see below)
    outs = engine.generate([[ids...], ...], SamplingParams(n=4, temperature=0.7))
    engine.update_weights(model.state_dict())     # HF names, full state dict
    engine.sleep(); engine.wake()                 # no-ops unless sleep mode is on

Log-probs: ``logprobs_mode="processed_logprobs"`` plus a patch of the sampler installed
in the worker (``WeightSyncExtension.rlx_install_scaled_logprobs``) so that the
returned log-prob of every sampled token is log softmax(logits / T) over the FULL
vocabulary, before top-k / top-p truncation (what rlx's NativeEngine reports and
what a trainer recomputes). Greedy requests report T = 1. See NOTES.md for what the
unpatched modes return.

In-process vs multi-process: ``multiprocess=False`` (default) sets
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` before vLLM is imported and uses the "uni"
executor: the engine core and worker live in this process and tensors pass to the
worker as they are. With ``multiprocess=True`` the engine core runs in its own
process and tensors are sent as safetensors bytes (a dict of tensors in the rpc
arguments fails there: "Call to collective_rpc method failed: cannot pickle
memoryview objects").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

# The module that holds the worker extension must be importable in the worker process
# (a spawned engine-core process, a Ray actor): make sure this folder is on its path.
_HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class SamplingParams:
    """Same fields as rlx.core.rollout.SamplingParams."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    seed: int | None = None
    greedy: bool = False


@dataclass
class Completion:
    """Same fields as rlx.core.rollout.Completion."""

    prompt_index: int
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: Literal["stop", "length"]


# --------------------------------------------------------------------------------------
# Worker side: methods mixed into vLLM's worker class (worker_extension_cls).
# `self` is the vLLM Worker (CPUWorker here); `self.model_runner` its model runner.
# --------------------------------------------------------------------------------------
class WeightSyncExtension:
    def rlx_update_weights(self, named_tensors: dict[str, torch.Tensor]) -> int:
        """In-process path: tensors arrive as they are. HF checkpoint names."""
        self.model_runner.reload_weights(weights_iterator=iter(named_tensors.items()))
        return len(named_tensors)

    def rlx_update_weights_bytes(self, payload: bytes) -> int:
        """Multi-process path: one safetensors blob (safetensors.torch.save)."""
        from safetensors.torch import load

        tensors = load(payload)
        self.model_runner.reload_weights(weights_iterator=iter(tensors.items()))
        return len(tensors)

    def rlx_install_scaled_logprobs(self) -> str:
        """Make the sampler report log softmax(logits / T) before top-k / top-p.

        vLLM's Sampler.sample() divides logits by T and then calls
        topk_topp_sampler(logits, generators, k, p), which in "processed_logprobs"
        mode returns log_softmax of the *truncated* logits. Wrap it: take the
        log_softmax of the incoming (already temperature-scaled) logits first, and
        let the original do only the sampling. The Sampler must be in
        "processed_logprobs" mode so it uses what this returns (and, for all-greedy
        batches, log_softmax of the unscaled logits).
        """
        sampler = self.model_runner.sampler
        if sampler.logprobs_mode != "processed_logprobs":
            raise RuntimeError(f"needs logprobs_mode='processed_logprobs', got {sampler.logprobs_mode!r}")
        tts = sampler.topk_topp_sampler
        if getattr(tts, "_rlx_patched", False):
            return "already"
        original = tts.forward  # bound method chosen per platform (forward_cpu here)
        tts.logprobs_mode = "raw_logprobs"  # the original need not compute its own

        def forward(logits, generators, k, p):
            full = logits.log_softmax(dim=-1, dtype=torch.float32)  # before in-place top-k/p
            sampled, _ = original(logits, generators, k, p)
            return sampled, full

        tts.forward = forward
        tts._rlx_patched = True
        return original.__name__

    def rlx_eager_logprob_ranks(self) -> None:
        """Replace the torch.compile'd rank count used whenever logprobs are requested.

        vllm.v1.sample.ops.logprobs.batched_count_greater_than is decorated with
        @torch.compile even under enforce_eager; on this CPU its first call compiled
        inside the first generate (18.6 s with a cold inductor cache, 3.9 s warm).
        The ranks are not used by rlx.
        """
        import vllm.v1.sample.sampler as sampler_module

        sampler_module.batched_count_greater_than = lambda x, values: (x >= values).sum(-1)


# --------------------------------------------------------------------------------------
# Driver side
# --------------------------------------------------------------------------------------
def _safetensors_bytes(named: Mapping[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    # contiguous, detached, CPU; tied tensors (lm_head = embed) must not share storage
    # in one safetensors blob, so clone when a storage is seen twice.
    seen: set[int] = set()
    out = {}
    for name, t in named.items():
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            t = t.clone()
        seen.add(ptr)
        out[name] = t
    return save(out)


def _checkpoint_shapes(model_path: str) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of the model folder's safetensors files (headers only)."""
    import glob

    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(glob.glob(os.path.join(model_path, "*.safetensors"))):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def _safetensors_header_shapes(payload: bytes) -> dict[str, tuple[int, ...]]:
    import json
    import struct

    (n,) = struct.unpack("<Q", payload[:8])
    header = json.loads(payload[8 : 8 + n])
    return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}


def _rng_states():
    import random

    import numpy as np

    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def _set_rng_states(states) -> None:
    import random

    import numpy as np

    torch.set_rng_state(states[0])
    np.random.set_state(states[1])
    random.setstate(states[2])


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        *,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.5,
        enable_prefix_caching: bool = True,
        seed: int = 0,
        dtype: str = "float32",
        max_model_len: int = 512,
        enable_sleep_mode: bool = False,
        multiprocess: bool = False,
        scaled_logprobs: bool = True,
        enforce_eager: bool = True,
        eager_logprob_ranks: bool = True,
        num_threads: int | None = 1,
        strict_sync: bool = True,
        **llm_kwargs: Any,
    ):
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU
        # Must be set before vLLM reads it; vllm.envs reads it lazily at engine start.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
        if _HERE not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_HERE, os.environ.get("PYTHONPATH")) if p)
        from vllm import LLM

        self.multiprocess = multiprocess
        self.sleep_enabled = enable_sleep_mode
        self.scaled_logprobs = scaled_logprobs
        kwargs: dict[str, Any] = dict(
            model=model_path,
            tokenizer=model_path,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=enable_prefix_caching,
            seed=seed,
            dtype=dtype,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            # a "module.Class" path the worker process can import (this file's folder
            # is put on PYTHONPATH above)
            worker_extension_cls="vllm_engine.WeightSyncExtension",
            logprobs_mode="processed_logprobs" if scaled_logprobs else "raw_logprobs",
        )
        if enable_sleep_mode:
            kwargs["enable_sleep_mode"] = True
        if not multiprocess and tensor_parallel_size == 1:
            kwargs["distributed_executor_backend"] = "uni"
        kwargs.update(llm_kwargs)
        # In-process, vLLM's CPUWorker.init_device replaces torch.set_num_threads with
        # a no-op for the whole process (it assumes it bound OMP threads, which only
        # the multiprocess executor does). Keep the real one, and put it back.
        # In-process, the worker also calls set_random_seed(seed): it reseeds this
        # process's global torch / numpy / random generators. Put their states back.
        real_set_num_threads = torch.set_num_threads
        rng_states = _rng_states()
        try:
            self.llm = LLM(**kwargs)
        finally:
            if not multiprocess:
                torch.set_num_threads = real_set_num_threads
                _set_rng_states(rng_states)
        self.num_threads = num_threads
        self.strict_sync = strict_sync
        self.expected_shapes = _checkpoint_shapes(model_path)
        # A tied model's checkpoint has no lm_head.weight, but HF's state_dict() does
        # (vLLM's Qwen2/Llama loaders skip "lm_head." when tie_word_embeddings is set).
        self._optional_names = {"lm_head.weight"}
        self._rng = torch.Generator().manual_seed(seed).get_state()
        self.tokenizer = self.llm.get_tokenizer()
        if scaled_logprobs:
            self.llm.collective_rpc("rlx_install_scaled_logprobs")
        if eager_logprob_ranks:
            self.llm.collective_rpc("rlx_eager_logprob_ranks")

    @contextlib.contextmanager
    def _threads(self):
        """In-process: run vLLM's steps with ``num_threads`` torch threads and the
        engine's own global-RNG state, then restore the caller's.

        On 2 shared cores two OMP threads spin-wait against any other busy process:
        32 samples x 16 tokens took 0.8-1.9 s with 2 threads vs 0.06 s with 1.
        vLLM's CPU sampler draws per-row seeds with torch.randint from the global
        generator (seeded requests too): without the swap, every rollout would shift
        the trainer's random stream.
        """
        if self.multiprocess:
            yield
            return
        threads = torch.get_num_threads()
        caller_rng = torch.get_rng_state()
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
        torch.set_rng_state(self._rng)
        try:
            yield
        finally:
            self._rng = torch.get_rng_state()
            torch.set_rng_state(caller_rng)
            torch.set_num_threads(threads)

    # -- generation ---------------------------------------------------------------
    def _vllm_params(self, params: SamplingParams):
        from vllm import SamplingParams as VSP

        greedy = params.greedy or params.temperature == 0
        return VSP(
            # vLLM 0.32 refuses n > 1 with greedy sampling ("n must be 1 when using
            # greedy sampling"): ask for one and copy it (generate does).
            n=1 if greedy else params.n,
            temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=0 if greedy else params.top_k,  # vLLM: 0 or -1 = off
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            include_stop_str_in_output=True,  # rlx: text keeps the stop string
            seed=params.seed,
            logprobs=0,  # only the sampled token's log-prob
            skip_special_tokens=True,
        )

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[Completion]:
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        if params.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {params.n}")
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids]
        base = self._vllm_params(params)
        if params.seed is not None:
            # vLLM seeds request i's k-th sample with seed + k, for every request: equal
            # seeds across prompts would reuse the same noise. Give prompt i seed + i*n.
            per_prompt = []
            for i in range(len(prompts)):
                sp = base.clone()
                sp.seed = params.seed + i * params.n
                per_prompt.append(sp)
            vparams = per_prompt
        else:
            vparams = base
        with self._threads():
            outputs = self.llm.generate(prompts, vparams, use_tqdm=False)
        completions: list[Completion] = []
        copies = params.n if params.greedy or params.temperature == 0 else 1
        for i, out in enumerate(outputs):  # LLM.generate returns outputs in input order
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                lps = [c.logprobs[k][tok].logprob for k, tok in enumerate(ids)]
                reason = "length" if c.finish_reason == "length" else "stop"
                for _ in range(copies):
                    completions.append(Completion(i, list(ids), list(lps), c.text, reason))
        return completions

    # -- weights ----------------------------------------------------------------
    def _check_names(self, named: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]] | None = None) -> None:
        """Refuse a state dict the engine would choke on, before sending anything.

        A reload that fails half-way (unknown name, wrong shape) leaves vLLM's model on
        meta tensors: every later generate fails, and the next reload replays the
        failed one's buffered weights. Partial dicts silently corrupt fused layers
        (q/k/v -> qkv_proj, gate/up -> gate_up_proj) whose other parts are not sent.
        """
        shapes = shapes or {k: tuple(v.shape) for k, v in named.items()}
        expected = self.expected_shapes
        unknown = sorted(set(shapes) - set(expected) - self._optional_names)
        if unknown:
            raise ValueError(f"update_weights: names the model does not have: {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
        bad = [(k, shapes[k], expected[k]) for k in shapes if k in expected and tuple(shapes[k]) != expected[k]]
        if bad:
            raise ValueError(f"update_weights: wrong shapes (name, got, expected): {bad[:5]}")
        if self.strict_sync:
            missing = sorted(set(expected) - set(shapes))
            if missing:
                raise ValueError(f"update_weights: missing {len(missing)} tensors (send the whole state dict): {missing[:5]}")

    def update_weights(self, weights: torch.nn.Module | Mapping[str, torch.Tensor]) -> None:
        """Load HF-named weights (a module or its state dict) into the live engine."""
        named = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
        self._check_names(named)
        if self.multiprocess:
            self.llm.collective_rpc("rlx_update_weights_bytes", args=(_safetensors_bytes(named),))
        else:
            named = {k: v.detach() for k, v in named.items()}
            with self._threads():
                self.llm.collective_rpc("rlx_update_weights", args=(named,))
        self._reset_prefix_cache()

    def update_weights_bytes(self, payload: bytes) -> None:
        """Load a safetensors blob (what a trainer actor ships through Ray)."""
        self._check_names({}, _safetensors_header_shapes(payload))
        with self._threads():
            self.llm.collective_rpc("rlx_update_weights_bytes", args=(payload,))
        self._reset_prefix_cache()

    def _reset_prefix_cache(self) -> None:
        # Without it, prompts whose first KV blocks (128 tokens on CPU) are cached keep
        # the old weights' keys/values: measured |dlogprob| ~1.0 after a sync.
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM could not reset the prefix cache (requests still hold blocks)")

    # -- memory -----------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        if self.sleep_enabled:
            self.llm.sleep(level=level)

    def wake(self) -> None:
        if self.sleep_enabled:
            self.llm.wake_up()

    def shutdown(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            core = getattr(engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            self.llm = None


safetensors_bytes = _safetensors_bytes
