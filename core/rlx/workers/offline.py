"""The policy worker of the offline algorithms (SFT, reward models, DPO, KTO ...): the
trained model, its engine and the algorithm's objective."""

from __future__ import annotations

from pathlib import Path

import torch

from rlx import models
from rlx.checkpoint import load_checkpoint, save_checkpoint
from rlx.engine import make_engine, save_hf
from rlx.errors import RunError
from rlx.objectives import OBJECTIVES, Objective, micro_batches
from rlx.workers.policy import own_host


class OfflinePolicyWorker:
    """Builds the objective of the run's row format and, after ``prepare``, the model it
    trains; ``train_step`` is one optimizer step over a step's rows (this rank's share)."""

    def __init__(self, config, tokenizer, host=None):
        host, spec = own_host(config, host)
        self.config, self.spec, self.t = config, spec, config.training
        self.device = models.resolve_device(self.t.device)
        self.objective: Objective = OBJECTIVES[(spec.data, spec.head)](config, spec, host, tokenizer, self.device)
        self.engine = None

    def prepare(self, examples: list[dict], eval_examples: list[dict], out: Path, resume: bool, *,
                total_steps: int, log=print) -> None:
        """Run the objective's one-off preparation (a precomputed reference, say), then load
        the model into its engine."""
        if self.objective.prepare is not None:
            self.objective.prepare(examples, eval_examples, out, resume, log)
        torch.manual_seed(self.t.seed)  # a new value head starts the same wherever a launcher builds this worker
        if self.spec.head == "value":
            model = models.load_value_model(self.config.model, self.device)
        else:
            model = models.load_causal_lm(self.config.model, self.device)
        self.engine = make_engine(model, self.t, total_steps=total_steps,
                                  micro_steps_per_step=self.t.batch_size // self.t.micro_batch_size)
        self.engine.model.train()

    def rank(self) -> int:
        return self.engine.rank

    def world_size(self) -> int:
        return self.engine.world_size

    def train_step(self, rows: list[dict]) -> dict[str, float]:
        """One optimizer step over ``rows``: this rank's share, normalised over all ranks."""
        engine, objective = self.engine, self.objective
        shard = rows[engine.rank::engine.world_size]
        normaliser = engine.all_reduce_sum(torch.tensor(float(objective.count(shard)))).item()
        if normaliser == 0:
            raise RunError("a training step has no tokens to learn from (all responses truncated away?)")
        sums: dict[str, float] = {}
        tokens = 0
        if objective.begin_step is not None:
            objective.begin_step(engine.model, rows, engine)
        for micro in micro_batches(shard, self.t.micro_batch_size):
            loss, metrics = objective.loss(engine.model, micro, normaliser)
            # the engine averages gradients over ranks; the normaliser already spans them
            engine.backward(loss * engine.world_size)
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v
            tokens += sum(len(v) for r in micro for k, v in r.items() if k.endswith("_ids"))
        if engine.world_size > 1:
            # each rank holds its share of the step's metrics; the step's value is their sum
            keys = sorted(sums)
            total = engine.all_reduce_sum(torch.tensor([sums[k] for k in keys], dtype=torch.float64))
            sums = dict(zip(keys, total.tolist()))
        sums.update(engine.step())
        sums["tokens"] = tokens
        return sums

    @torch.no_grad()
    def evaluate(self, rows: list[dict]) -> dict[str, float]:
        """The objective's metrics over held-out ``rows``, as ``eval/NAME``."""
        if not rows:
            return {}
        engine, objective = self.engine, self.objective
        engine.model.eval()
        normaliser = float(objective.count(rows))
        sums: dict[str, float] = {}
        if objective.begin_step is not None:
            objective.begin_step(engine.model, rows, engine)
        for micro in micro_batches(rows, self.t.micro_batch_size):
            _, metrics = objective.loss(engine.model, micro, normaliser)
            for k, v in metrics.items():
                sums[f"eval/{k}"] = sums.get(f"eval/{k}", 0.0) + v
        engine.model.train()
        return sums

    def save(self, checkpoints: Path, step: int, keep: int) -> Path:
        return save_checkpoint(checkpoints, step, self.engine, {"step": step}, keep=keep)

    def load(self, path: Path) -> int:
        return load_checkpoint(path, self.engine)["step"]

    def save_final(self, tokenizer, out: Path) -> None:
        save_hf(self.engine, tokenizer, out)
