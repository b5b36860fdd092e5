"""The offline loop: SFT, reward models and preference optimisation.

Each optimizer step takes ``training.batch_size`` encoded rows in an order fixed by
(seed, epoch), so a step number alone says where the data stands and a resumed run
sees exactly the rows an uninterrupted one would. The rows are split into
micro-batches (and across data-parallel ranks); every micro-batch loss is normalised by
the count of the whole step (response tokens for SFT, pairs for pairwise losses), so
micro-batching never changes the update.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from pathlib import Path

import torch

from rlx import data, models, multimodal
from rlx.algorithm import AlgorithmSpec
from rlx.checkpoint import resume_latest
from rlx.config import RunConfig
from rlx.errors import RunError
from rlx.launch import make_launcher
from rlx.metrics import RunLogger
from rlx.objectives import OBJECTIVES, Objective
from rlx.workers.offline import OfflinePolicyWorker


def _step_rows(examples: list[dict], step: int, batch_size: int, seed: int) -> list[dict]:
    """The rows of optimizer step ``step``: a fresh seeded permutation each epoch."""
    per_epoch = math.ceil(len(examples) / batch_size)
    epoch, index = divmod(step, per_epoch)
    order = list(range(len(examples)))
    random.Random(seed * 100_003 + epoch).shuffle(order)
    return [examples[i] for i in order[index * batch_size:(index + 1) * batch_size]]


def _schema(config: RunConfig, spec: AlgorithmSpec, objective: Objective) -> data.Schema:
    schema = data.required_keys(config.data, spec.data)
    if objective.extra_keys:
        schema = dataclasses.replace(schema, required={**schema.required, **objective.extra_keys})
    return schema


def _load_examples(config: RunConfig, spec: AlgorithmSpec, host, objective: Objective, log,
                   vision=None) -> tuple[list, list]:
    tasks = host.registry("register_tasks").items
    schema = _schema(config, spec, objective)

    def load(path: str, split: str) -> list[dict]:
        # with images, each row's images are read and checked with the rest of the row
        checked = vision.reading(path).schema(schema) if vision is not None else schema
        source = data.load_rows(path, config.data, split=split, task_format=spec.data, tasks=tasks)
        rows, skipped, _ = data.validate_rows(source, checked, config.data.skip_bad_rows)
        if skipped:
            log(f"skipped {skipped} malformed rows of {source.source}")
        return rows

    def encode(path: str, rows: list[dict]) -> list[dict]:
        if vision is not None:
            vision.reading(path)  # relative image paths are looked up beside the rows' file
        return [objective.encode(r) for r in rows]

    train_rows = load(config.data.path, config.data.split)
    if config.data.eval_path or config.data.path.startswith("builtin:"):
        eval_path = config.data.eval_path or config.data.path
        eval_rows = load(eval_path, "test")
        eval_rows = eval_rows[:config.data.eval_size] if config.data.eval_size else []
    else:
        # hold out the last rows of a user's file; they never enter training
        eval_path, n = config.data.path, min(config.data.eval_size, len(train_rows) // 5)
        train_rows, eval_rows = train_rows[:len(train_rows) - n], train_rows[len(train_rows) - n:]
    if config.data.max_samples:
        train_rows = train_rows[:config.data.max_samples]
    return encode(config.data.path, train_rows), encode(eval_path, eval_rows)


def train(config: RunConfig, spec: AlgorithmSpec, host, out: Path, *, resume: bool, log=print) -> dict[str, float]:
    t = config.training
    key = (spec.data, spec.head)
    if key not in OBJECTIVES:
        raise RunError(f"algorithm {spec.name!r}: the offline loop has no objective for data={spec.data!r} "
                       f"with head={spec.head!r} (known: {sorted(OBJECTIVES)})")
    torch.manual_seed(t.seed)
    device = models.resolve_device(t.device)
    tokenizer = models.load_tokenizer(config.model.path)
    vision = multimodal.vision_data(config, host, tokenizer)
    if vision is not None:
        multimodal.check_supported(config, spec)
    # the driver's own objective only encodes rows (images included); the worker's computes the losses
    objective = OBJECTIVES[key](config, spec, host, tokenizer, device, **({"vision": vision} if vision else {}))
    examples, eval_examples = _load_examples(config, spec, host, objective, log, vision)
    if not examples:
        raise RunError(f"no training rows in {config.data.path!r}")
    per_epoch = math.ceil(len(examples) / t.batch_size)
    total = t.max_steps or t.epochs * per_epoch

    launcher = make_launcher(config, host)
    try:
        ranks = config.launcher.policy_ranks
        launcher.reserve({"policy": (ranks, 1)})
        policy = launcher.place("policy", OfflinePolicyWorker, config, tokenizer, ranks=ranks)
        policy.wait("prepare", examples, eval_examples, out, resume, total_steps=total, log=log)
        world = policy.wait("world_size")

        checkpoints = out / "checkpoints"
        step = resume_latest(checkpoints, lambda path: policy.wait("load", path), log) if resume else 0

        logger = RunLogger(out, config.logging, total, start_step=step, rank=policy.wait("rank"), host=host)
        metrics: dict[str, float] = {}
        try:
            while step < total:
                started = time.perf_counter()
                metrics = policy.wait("train_step", _step_rows(examples, step, t.batch_size, t.seed))
                elapsed = time.perf_counter() - started
                metrics["tokens_per_s"] = metrics.pop("tokens") * world / elapsed
                metrics["time/step"] = elapsed
                metrics["epoch"] = step / per_epoch
                step += 1
                if (t.eval_every and step % t.eval_every == 0) or step == total:
                    metrics.update(policy.wait("evaluate", eval_examples))
                    host.hook.on_eval_end(step=step,
                                          metrics={k: v for k, v in metrics.items() if k.startswith("eval/")})
                logger.log(step, metrics)
                host.hook.on_step_end(step=step, metrics=metrics)
                if config.checkpoint.every and step % config.checkpoint.every == 0 and step < total:
                    policy.wait("save", checkpoints, step, keep=config.checkpoint.keep)
        finally:
            # also when a step or a hook raises: the metrics file and TensorBoard writer are closed
            logger.close()
        policy.wait("save", checkpoints, step, keep=config.checkpoint.keep)
        if config.checkpoint.save_final:
            policy.wait("save_final", tokenizer, out / "final")
            if vision is not None:
                multimodal.copy_processor_files(config.model.path, out / "final")
        return metrics
    finally:
        launcher.shutdown()
