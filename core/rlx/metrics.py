"""Run outputs: ``metrics.jsonl``, TensorBoard scalars and a progress bar.

``metrics.jsonl`` holds one JSON object per logged step, ``{"step": N, "name": value,
...}``; values are floats and a non-finite one is written as ``null``, so the file is
strict JSON. A resumed run first drops the rows after its checkpoint, so the file of
a run that was killed and resumed matches that of an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from rlx.config import LoggingConfig

# shown in the progress bar when a step reports them, under these short names
_BAR = {"loss": "loss", "loss/policy": "loss", "reward/mean": "reward", "tokens_per_s": "tok/s"}


def add_shares(into: dict[str, float], values: dict[str, float]) -> None:
    """Adds each rank's or micro-batch's share of a metric; a ``*_max`` metric keeps the largest."""
    for k, v in values.items():
        into[k] = max(into.get(k, float(v)), float(v)) if k.endswith("_max") else into.get(k, 0.0) + float(v)


def _number(value) -> float | None:
    value = float(value.item() if hasattr(value, "item") else value)
    return value if math.isfinite(value) else None


def truncate_after(path: Path, step: int) -> None:
    """Drop the rows of ``path`` with a step above ``step`` (and any torn last line)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        if isinstance(row, dict) and row.get("step", math.inf) <= step:
            kept.append(line + "\n")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


class RunLogger:
    """Writes the metrics of each step; only rank 0 writes anything.

    ``log`` writes every ``cfg.log_every`` steps and on the last step; the progress
    bar moves every step. Use as a context manager or call ``close``.
    """

    def __init__(self, output_dir: str | Path, cfg: LoggingConfig, total_steps: int, start_step: int = 0,
                 rank: int = 0):
        self.cfg = cfg
        self.total_steps = total_steps
        self.active = rank == 0
        self._file = self._writer = self._bar = None
        if not self.active:
            return
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "metrics.jsonl"
        truncate_after(self.path, start_step)
        self._file = open(self.path, "a")
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step hides events a killed run wrote after its last checkpoint
            self._writer = SummaryWriter(str(out / "tensorboard"), purge_step=start_step + 1 if start_step else None)
        if cfg.progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def log(self, step: int, metrics: dict) -> None:
        if not self.active:
            return
        values = {k: _number(v) for k, v in metrics.items()}
        if step % max(1, self.cfg.log_every) == 0 or step == self.total_steps:
            self._file.write(json.dumps({"step": step, **values}) + "\n")
            self._file.flush()
            if self._writer is not None:
                for name, value in values.items():
                    if value is not None:
                        self._writer.add_scalar(name, value, step)
        if self._bar is not None:
            shown = {short: f"{values[k]:.4g}" for k, short in _BAR.items() if values.get(k) is not None}
            self._bar.set_postfix(shown, refresh=False)
            self._bar.update(step - self._bar.n)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._writer is not None:
            self._writer.close()
        if self._bar is not None:
            self._bar.close()
        self._file = self._writer = self._bar = None

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
