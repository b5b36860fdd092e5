"""The rollout worker: generation engines behind one interface (``rlx.rollout``)."""

from __future__ import annotations

import dataclasses

from rlx.rollout import Completion, NativeEngine, SamplingParams


class RolloutWorker:
    """Samples completions with per-token log-probs. The native engine samples with the
    module it is given: under the local launcher that is the policy's own (no copy)."""

    def __init__(self, engine):
        self.engine = engine

    @classmethod
    def native(cls, config, tokenizer, module=None) -> "RolloutWorker":
        """The native engine over ``module`` (the policy's own, shared), or over a copy of
        the starting model that ``update_weights`` keeps in step with the policy."""
        from rlx import models

        device = models.resolve_device(config.training.device)
        if module is None:
            module = models.load_causal_lm(config.model, device, trainable=False)
        return cls(NativeEngine(module, tokenizer, device=device, max_batch_size=config.rollout.max_batch_size,
                                cuda_graphs=config.rollout.cuda_graphs))

    @classmethod
    def vllm(cls, config, tokenizer, engine_index: int = 0) -> "RolloutWorker":
        """A vLLM engine over the starting model's folder; the driver syncs it after each update."""
        from rlx import models
        from rlx.engines.vllm import VLLMEngine
        from rlx.rollout import eos_ids

        r, model = config.rollout, config.model
        # the trainer's dtype: vLLM's own "auto" would run a float32 model in bfloat16
        dtype = str(models.resolve_dtype(model.dtype, models.resolve_device(config.training.device)))
        return cls(VLLMEngine(
            model.path, seed=config.training.seed + engine_index, dtype=dtype.removeprefix("torch."),
            max_model_len=config.data.max_prompt_length + r.max_new_tokens,
            tensor_parallel_size=r.tensor_parallel_size, gpu_memory_utilization=r.gpu_memory_utilization,
            enable_prefix_caching=r.enable_prefix_caching, enable_sleep_mode=r.sleep is True,
            eos_ids=eos_ids(model.path, tokenizer), threads=config.training.threads or 1))

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, inputs=None) -> list[Completion]:
        if inputs is None:
            return self.engine.generate(prompt_ids, params)
        return self.engine.generate(prompt_ids, params, inputs)

    def update_weights(self, weights) -> None:
        self.engine.update_weights(weights)

    def sleep(self) -> None:
        self.engine.sleep()

    def wake(self) -> None:
        self.engine.wake()


def generate_balanced(group, prompt_ids: list[list[int]], params: SamplingParams, inputs=None) -> list[Completion]:
    """``params.n`` completions of each prompt from a group of engines, each taking an equal
    contiguous share of the prompts (and of their image ``inputs``, when given). Prompt ``i``
    gets seed ``seed + i·n`` wherever it runs, so an engine that seeds per prompt gives the
    same samples for any split."""
    engines = group.size
    per = -(-len(prompt_ids) // engines)
    starts = list(range(0, len(prompt_ids), per))
    calls = [(prompt_ids[s:s + per], params if params.seed is None else
              dataclasses.replace(params, seed=params.seed + s * params.n))
             + (() if inputs is None else (inputs[s:s + per],)) for s in starts]
    futures = group.call_each("generate", calls)
    completions = []
    for start, future in zip(starts, futures):
        completions += [dataclasses.replace(c, prompt_index=c.prompt_index + start) for c in future.result()]
    return completions
