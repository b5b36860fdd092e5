"""Run outputs: ``metrics.jsonl``, ``samples.jsonl``, the chosen loggers and a progress bar.

``metrics.jsonl`` holds one JSON object per logged step, ``{"step": N, "name": value,
...}``; values are floats and a non-finite one is written as ``null``, so the file is
strict JSON. ``samples.jsonl`` holds a few of a step's samples every
``logging.samples_every`` steps, one object per sample: ``{"step", "prompt",
"completion", "reward", "advantage"}``. A resumed run first drops the rows of both after
its checkpoint, so the files of a run that was killed and resumed match those of an
uninterrupted one. TensorBoard, W&B and the like are loggers that plugins register
(``register_loggers``); ``logging.tensorboard`` and ``logging.loggers`` choose them.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from rlx.config import LoggingConfig
from rlx.errors import ConfigError, RegistryError, RunError

# shown in the progress bar when a step reports them, under these short names
_BAR = {"loss": "loss", "loss/policy": "loss", "reward/mean": "reward", "tokens_per_s": "tok/s"}


def add_shares(into: dict[str, float], values: dict[str, float]) -> None:
    """Adds each rank's or micro-batch's share of a metric; a ``*_max`` metric keeps the largest."""
    for k, v in values.items():
        into[k] = max(into.get(k, float(v)), float(v)) if k.endswith("_max") else into.get(k, 0.0) + float(v)


def add_tensors(into: dict, values: dict) -> None:
    """``add_shares`` for a micro-batch's metrics kept on the device until the step ends (a
    host read after each would stall the GPU while Python queues the next forward)."""
    for k, v in values.items():
        v = v.detach().float()
        into[k] = v if k not in into else into[k].maximum(v) if k.endswith("_max") else into[k] + v


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


def chosen_loggers(cfg: LoggingConfig) -> list[str]:
    """The loggers a run opens: TensorBoard when ``logging.tensorboard``, then ``logging.loggers``."""
    return list(dict.fromkeys((["tensorboard"] if cfg.tensorboard else []) + list(cfg.loggers)))


def logger_factory(name: str, host):
    """The factory of logger ``name``; an unknown one names the package that provides it."""
    from rlx.loggers import FIRST_PARTY

    try:
        return host.get("register_loggers", name)
    except RegistryError as e:
        package = FIRST_PARTY.get(name)
        install = f" It is provided by {package}: pip install {package}." if package else ""
        raise ConfigError(f"logging.loggers: {e}{install}") from e


def check_loggers(cfg: LoggingConfig, host) -> None:
    """Fail before a run starts when a chosen logger is not installed, or when
    ``logging.logger_options`` names a logger that is not chosen."""
    chosen = chosen_loggers(cfg)
    for name in chosen:
        logger_factory(name, host)
    for name in cfg.logger_options:
        if name not in chosen:
            raise ConfigError(f"logging.logger_options.{name}: no logger {name!r} is chosen "
                              f"(logging.loggers: {', '.join(chosen) or 'none'})")


def pick_samples(prompts: list[str], completions: list[str], rewards: list[float], advantages: list[float],
                 count: int) -> list[dict]:
    """``count`` samples spread evenly over a step's batch, so over its prompts' groups."""
    n = len(completions)
    picked = sorted({i * n // count for i in range(min(count, n))})
    return [{"prompt": prompts[i], "completion": completions[i], "reward": _number(rewards[i]),
             "advantage": _number(advantages[i])} for i in picked]


class RunLogger:
    """Writes the metrics of each step; only rank 0 writes anything.

    ``log`` writes every ``cfg.log_every`` steps and on the last step; the progress
    bar moves every step. ``host`` provides the loggers (the process-wide host when
    None). Use as a context manager or call ``close``.
    """

    def __init__(self, output_dir: str | Path, cfg: LoggingConfig, total_steps: int, start_step: int = 0,
                 rank: int = 0, host=None):
        self.cfg = cfg
        self.total_steps = total_steps
        self.active = rank == 0
        self._file = self._bar = None
        self._loggers: list[tuple[str, object]] = []
        if not self.active:
            return
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        if host is None:
            from rlx.plugins import get_host

            host = get_host()
        try:
            for name in chosen_loggers(cfg):
                factory = logger_factory(name, host)
                self._loggers.append((name, factory(out, dict(cfg.logger_options.get(name, {})),
                                                    start_step=start_step)))
        except BaseException:
            self.close()  # the loggers opened so far
            raise
        # after the loggers: a logger's bad option leaves no metrics.jsonl, so the same
        # command, fixed, may run into the same folder
        self.path, self.samples_path = out / "metrics.jsonl", out / "samples.jsonl"
        truncate_after(self.path, start_step)
        truncate_after(self.samples_path, start_step)
        self._file = open(self.path, "a")
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
            for name, logger in self._loggers:
                self._call(name, step, logger.log, values)
        if self._bar is not None:
            shown = {short: f"{values[k]:.4g}" for k, short in _BAR.items() if values.get(k) is not None}
            self._bar.set_postfix(shown, refresh=False)
            self._bar.update(step - self._bar.n)

    def samples_due(self, step: int) -> bool:
        """Whether step ``step`` logs samples: every ``logging.samples_every`` steps and the last."""
        every = self.cfg.samples_every
        return self.active and every > 0 and (step % every == 0 or step == self.total_steps)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        """Append ``rows`` (from ``pick_samples``) to ``samples.jsonl`` and give them to the loggers."""
        if not self.active or not rows:
            return
        with open(self.samples_path, "a") as f:
            f.write("".join(json.dumps({"step": step, **row}) + "\n" for row in rows))
        for name, logger in self._loggers:
            if hasattr(logger, "log_samples"):  # a logger may take scalars only
                self._call(name, step, logger.log_samples, rows)

    @staticmethod
    def _call(name: str, step: int, method, payload) -> None:
        try:
            method(step, payload)
        except Exception as e:
            raise RunError(f"logger {name!r} failed at step {step} (metrics.jsonl holds the step): "
                           f"{type(e).__name__}: {e}") from e

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        loggers, self._loggers = self._loggers, []
        for _, logger in loggers:
            logger.close()
        if self._bar is not None:
            self._bar.close()
        self._file = self._bar = None

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
