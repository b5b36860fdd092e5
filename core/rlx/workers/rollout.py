"""The rollout worker: generation engines behind one interface (``rlx.rollout``)."""

from __future__ import annotations

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
        return cls(NativeEngine(module, tokenizer, device=device, max_batch_size=config.rollout.max_batch_size))

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[Completion]:
        return self.engine.generate(prompt_ids, params)

    def update_weights(self, weights) -> None:
        self.engine.update_weights(weights)
