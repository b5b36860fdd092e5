"""Helpers for end-to-end runs: in-process through ``rlx.run.run`` (fast) or through the CLI
in a subprocess (where the command line itself is under test)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from rlx.hookspecs import hookimpl
from rlx.testing import QUIET, one_thread  # noqa: F401  (re-exported for the e2e tests)

# small, fast defaults for every end-to-end run: a few rows, a tiny eval set
SMALL = {"data.builtin_size": 96, "data.eval_size": 8, "training.batch_size": 8, "training.micro_batch_size": 4}


def tree(settings: dict) -> dict:
    from rlx.config import set_dotted

    out: dict = {}
    for key, value in settings.items():
        set_dotted(out, key, value)
    return out


def config(algo: str, **settings):
    """The resolved config of ``algo`` with dotted ``settings`` (on top of QUIET and SMALL)."""
    from rlx.config import resolve
    from rlx.plugins import get_host

    host = get_host()
    return resolve(host.algorithms.get(algo), tree({**QUIET, **SMALL, **settings})), host


def train(algo: str, out: Path, *, resume: bool = False, **settings) -> dict:
    """Train in this process, as ``rlx train`` does after parsing; returns the last metrics."""
    from rlx.run import run

    cfg, host = config(algo, output=str(out), **settings)
    return run(cfg, host, resume=resume)


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def cli_args(**settings) -> list[str]:
    """``--set key=value`` arguments (values as YAML would read them)."""
    args = []
    for key, value in {**QUIET, **SMALL, **settings}.items():
        text = json.dumps(value) if not isinstance(value, str) else value
        args += ["--set", f"{key}={text}"]
    return args


def rlx(*args: str, env: dict | None = None, cwd: str | Path | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m rlx_cli ARGS`` in a subprocess; RLX_CACHE is the session's private cache
    and torch uses one thread (see ``one_thread``)."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    assert "RLX_CACHE" in full_env, "request the tiny_model_dir fixture first: it sets RLX_CACHE"
    return subprocess.run([sys.executable, "-m", "rlx_cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd)


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root``: relative path -> (sha256, mtime_ns)."""
    files = {}
    for path in sorted(Path(root).rglob("*")):
        if path.is_file():
            files[str(path.relative_to(root))] = (hashlib.sha256(path.read_bytes()).hexdigest(),
                                                  path.stat().st_mtime_ns)
    return files


class Killed(Exception):
    pass


class KillAfter:
    """A plugin that stops the run like a kill would: after step ``step`` is logged."""

    def __init__(self, step: int):
        self.step = step

    @hookimpl
    def on_step_end(self, step, metrics):
        if step == self.step:
            raise Killed(f"killed after step {step}")
