"""The reference worker: a frozen copy of the starting policy, for KL terms."""

from __future__ import annotations

import torch

from rlx import models
from rlx.batch import Batch
from rlx.workers.forward import batched, forward_micro_batch, response_logprobs


class ReferenceWorker:
    def __init__(self, config):
        self.temperature, self.micro = config.rollout.temperature, forward_micro_batch(config.training)
        self.packed, self.share = config.training.packing, config.training.share_prompts
        device = models.resolve_device(config.training.device)
        self.model = models.load_causal_lm(config.model, device, trainable=False)
        models.compile_layers(self.model, config.training.compile, config.training.compile_memory)

    def logprobs(self, batch: Batch) -> torch.Tensor:
        return batched(lambda part: response_logprobs(self.model, part, self.temperature, packed=self.packed,
                                                      share=self.share)[0], batch, self.micro)
