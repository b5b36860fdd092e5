"""The built-in TensorBoard logger, registered through ``register_loggers`` like a plugin's.

A logger is what a ``register_loggers`` factory returns: an object with
``log(step, metrics)``, ``log_samples(step, rows)`` and ``close()``. ``metrics.jsonl``
and ``samples.jsonl`` are not loggers: every run writes them, and ``rlx report`` reads them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlx.errors import ConfigError
from rlx.hookspecs import hookimpl

# first-party loggers that live in their own distribution, to name the package to install
FIRST_PARTY = {"wandb": "rlx-wandb"}


def samples_markdown(rows: list[dict]) -> str:
    """The sample rows as a markdown table (how TensorBoard renders text)."""
    def cell(value) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", "\\n") or " "

    lines = ["| prompt | completion | reward | advantage |", "|---|---|---|---|"]
    lines += [f"| {cell(r['prompt'])} | {cell(r['completion'])} | {cell(r['reward'])} | {cell(r['advantage'])} |"
              for r in rows]
    return "\n".join(lines)


class TensorBoardLogger:
    """Scalars and sample tables as TensorBoard events under ``OUTPUT/tensorboard``."""

    def __init__(self, output_dir: Path, options: dict[str, Any], *, start_step: int = 0):
        if options:
            raise ConfigError(f"logging.logger_options.tensorboard: the TensorBoard logger takes no options, "
                              f"got {sorted(options)}")
        from torch.utils.tensorboard import SummaryWriter

        # purge_step hides events a killed run wrote after its last checkpoint
        self.writer = SummaryWriter(str(Path(output_dir) / "tensorboard"),
                                    purge_step=start_step + 1 if start_step else None)

    def log(self, step: int, metrics: dict[str, float | None]) -> None:
        for name, value in metrics.items():
            if value is not None:
                self.writer.add_scalar(name, value, step)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        self.writer.add_text("samples", samples_markdown(rows), step)

    def close(self) -> None:
        self.writer.close()


@hookimpl
def register_loggers(register):
    register("tensorboard", TensorBoardLogger)
