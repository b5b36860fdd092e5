"""Weights & Biases logging for rlx runs.

``--set logging.loggers=wandb`` sends every logged step's metrics to a W&B run (the
step is rlx's step), the samples of every ``logging.samples_every`` steps as a table
named ``samples``, and the run's resolved ``config.yaml`` as the W&B config. Options go
in ``logging.logger_options.wandb``: project, entity, name, mode, dir. In offline mode
the run is written under ``DIR/wandb/offline-run-*`` for a later ``wandb sync``. A
resumed rlx run continues the same W&B run: its id is kept in ``OUTPUT/wandb-run-id``.
wandb is imported only when a run opens the logger.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from rlx import hookimpl
from rlx.config import build, opt
from rlx.errors import ConfigError, RunError

COLUMNS = ["step", "prompt", "completion", "reward", "advantage"]


@dataclass
class WandbOptions:
    project: str = opt("rlx", "W&B project")
    entity: str = opt("", "W&B user or team (empty: your default entity)")
    name: str = opt("", "W&B run name (empty: the run's output folder name)")
    mode: Literal["", "online", "offline", "disabled"] = opt(
        "", "online, offline (files only, upload later with `wandb sync`) or disabled; empty: WANDB_MODE, else online")
    dir: str = opt("", "folder W&B writes into, as DIR/wandb/ (empty: the run's output folder)")


class WandbLogger:
    def __init__(self, output_dir: Path, options: dict, *, start_step: int = 0):
        o = build(WandbOptions, options, "logging.logger_options.wandb")
        try:
            import wandb
        except ImportError as e:
            raise ConfigError(f"logging.loggers names wandb, but the wandb package does not import ({e}): "
                              f"pip install 'wandb>=0.19,<1'") from e

        out = Path(output_dir)
        folder = Path(o.dir) if o.dir else out
        folder.mkdir(parents=True, exist_ok=True)
        id_file = out / "wandb-run-id"
        run_id = id_file.read_text().strip() if start_step and id_file.is_file() else secrets.token_hex(4)
        id_file.write_text(run_id + "\n")
        config_file = out / "config.yaml"
        config = yaml.safe_load(config_file.read_text()) if config_file.is_file() else {}
        try:
            self.run = wandb.init(project=o.project, entity=o.entity or None, name=o.name or out.resolve().name,
                                  mode=o.mode or None, dir=str(folder), id=run_id, resume="allow", config=config,
                                  settings=wandb.Settings(console="off", silent=True))
        except Exception as e:
            raise RunError(f"W&B could not start a run (logging.logger_options.wandb: {options}): "
                           f"{type(e).__name__}: {e}. Log in with `wandb login`, or set "
                           f"logging.logger_options.wandb.mode=offline") from e

    def log(self, step: int, metrics: dict[str, float | None]) -> None:
        self.run.log({k: v for k, v in metrics.items() if v is not None}, step=step)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        import wandb

        table = wandb.Table(columns=COLUMNS, data=[[step] + [r[c] for c in COLUMNS[1:]] for r in rows])
        self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        import wandb

        self.run.finish()
        # finish() may return before W&B's service has written all of the run's files;
        # teardown waits for it (a later run in this process starts a new service)
        wandb.teardown()


@hookimpl
def register_loggers(register):
    register("wandb", WandbLogger)
