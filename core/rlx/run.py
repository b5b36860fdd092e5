"""One training run: the output folder, the resolved config and the loop for the algorithm."""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path

import yaml

from rlx.config import RunConfig, to_dict
from rlx.errors import ModelError, RlxError, RunError
from rlx.host_memory import keep_freed_memory
from rlx.paths import check_run
from rlx.rewards import check_functions


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def output_dir(config: RunConfig) -> Path:
    if not config.output and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # each process would stamp its own time: the ranks must be told one folder
        raise RunError("several processes run this job: give them one output folder with --output")
    return Path(config.output or f"runs/{config.algo}-{time.strftime('%Y%m%d-%H%M%S')}")


# What a run leaves once it has started training. A folder holding only config.yaml is a
# run that failed before its first step (bad data, a wrong model path): running the fixed
# command into it again is no overwrite.
TRAINING_OUTPUTS = ("metrics.jsonl", "checkpoints", "final")


def prepare_output(config: RunConfig, *, resume: bool) -> Path:
    """Create the output folder; refuse to write over an earlier run unless resuming."""
    out = output_dir(config)
    if _rank() != 0:  # rank 0 checks and writes; the others only need the folder
        out.mkdir(parents=True, exist_ok=True)
        return out
    written = out / "config.yaml"
    if written.exists() and not resume and any((out / name).exists() for name in TRAINING_OUTPUTS):
        raise RunError(f"{out} already holds a run; pass --resume to continue it or choose another --output")
    if resume and not written.exists():
        raise RunError(f"--resume: {out} holds no run to continue")
    out.mkdir(parents=True, exist_ok=True)
    written.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    return out


def with_builtin_models(config: RunConfig) -> RunConfig:
    """A copy of ``config`` whose ``builtin:NAME`` model paths name the folders rlx made for
    them (built on first use). Built-in names resolve here, at the run's edge, so that the
    model loaders below know nothing of how the demo models are made."""
    from rlx.tiny import builtin_model

    config = copy.deepcopy(config)
    for section in (config.model, config.reward):
        path = section.model if section is config.reward else section.path
        if not str(path).startswith("builtin:"):
            continue
        try:
            folder = builtin_model(path)
        except ValueError as e:
            raise ModelError(str(e)) from e
        if section is config.reward:
            section.model = folder
        else:
            section.path = folder
    return config


def run(config: RunConfig, host, *, resume: bool = False) -> dict[str, float]:
    """Train ``config.algo`` and return the last step's metrics."""
    spec = host.algorithms.get(config.algo)
    try:  # a wrong path or reward name fails in a second, before the model libraries load
        check_run(config)
        if spec.loop == "online":
            check_functions(config.reward, host)
    except RlxError as e:
        raise RunError(str(e)) from e
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # rlx shows its own progress; weight-loading bars are noise
    out = prepare_output(config, resume=resume)
    host.hook.on_train_start(config=config, output_dir=str(out))
    if spec.loop == "offline":
        from rlx import offline as loop
    else:
        from rlx import online as loop

    keep_freed_memory()
    if config.training.threads:
        import torch

        torch.set_num_threads(config.training.threads)
    try:
        metrics = loop.train(with_builtin_models(config), spec, host, out, resume=resume)
    except RlxError as e:
        if isinstance(e, RunError):
            raise
        raise RunError(str(e)) from e
    host.hook.on_train_end(output_dir=str(out), metrics=metrics)
    if _rank() == 0:
        print(f"done: {out}")
    return metrics
