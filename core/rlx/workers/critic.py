"""The critic worker: a value model (PPO/GAE) and its engine."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from rlx import models, ops
from rlx.batch import Batch
from rlx.checkpoint import load_checkpoint, save_checkpoint
from rlx.engine import make_engine, save_hf
from rlx.metrics import add_tensors
from rlx.workers.forward import Host, batched, chunks, forward_micro_batch, response_values
from rlx.workers.policy import own_host


class CriticWorker:
    """Holds the value model in its own engine (learning rate ``algorithm.critic_lr``);
    computes values and trains on returns with the algorithm's value loss."""

    def __init__(self, config, host=None, *, total_steps: int, micro_steps: int):
        host, spec = own_host(config, host)
        self.a, self.t = config.algorithm, config.training
        device = models.resolve_device(self.t.device)
        torch.manual_seed(self.t.seed)  # the same value head wherever a launcher builds this worker
        cfg = dataclasses.replace(self.t, lr=self.a.critic_lr)
        self.engine = make_engine(models.load_value_model(config.model, device), cfg, total_steps=total_steps,
                                  micro_steps_per_step=micro_steps)
        self.value_loss = host.get("register_value_losses", spec.value_loss)

    def values(self, batch: Batch) -> torch.Tensor:
        self.engine.model.eval()
        return batched(lambda part: response_values(self.engine.model, part, packed=self.t.packing,
                                                    share=self.t.share_prompts), batch, forward_micro_batch(self.t))

    def train_step(self, batch: Batch, *, token_count: float, **_) -> tuple[dict[str, float], dict[str, float]]:
        """One optimizer step of the token-mean value loss on this rank's share of the step;
        ``token_count`` counts the action tokens of the whole step (all ranks)."""
        engine = self.engine
        engine.model.train()
        totals: dict[str, torch.Tensor] = {}
        # a prompt's samples go together, so that each micro-batch runs its prompts once
        batch = batch.select(torch.argsort(batch.group_ids.cpu(), stable=True).tolist())
        host = Host.of(batch)  # the micro-batches' layouts, worked out without waiting for the GPU
        for index in chunks(len(batch), self.t.micro_batch_size):
            micro = batch.select(index)
            values = response_values(engine.model, micro, packed=self.t.packing, share=self.t.share_prompts,
                                     host=host.select(index))
            per_token, extra = self.value_loss(values, micro.values, micro.returns, micro.action_mask, config=self.a)
            loss = ops.aggregate(per_token, micro.action_mask, "token_mean", token_count=token_count)
            engine.backward(loss * engine.world_size)
            share = micro.action_mask.sum() / token_count
            shares = {f"value/{k}": torch.as_tensor(v, device=share.device) * share for k, v in extra.items()}
            add_tensors(totals, {"loss/value": loss, **shares})
        return {k: v.item() for k, v in totals.items()}, {f"critic/{k}": v for k, v in engine.step().items()}

    def save(self, checkpoints: Path, step: int) -> Path:
        return save_checkpoint(checkpoints, step, self.engine, {}, keep=0, name=f"critic_{step:08d}")

    def load(self, path: Path) -> None:
        load_checkpoint(path, self.engine)

    def save_final(self, tokenizer, out: Path) -> None:
        save_hf(self.engine, tokenizer, out)
