"""Resumable, atomic checkpoints.

A checkpoint is a folder ``step_{step:08d}`` holding the engine state (``engine/``),
the loop's own state (``trainer_state.json``: data position and the like), the RNG
states of every rank (``rng/rank_{r}.pt``) and, written last, a ``COMPLETE`` marker.
Everything is written into ``step_{step:08d}.tmp-<pid>``, flushed to disk, and only
then renamed into place, so a process killed mid-write leaves a folder that never
looks complete. Under several ranks every rank must call ``save_checkpoint``; the
folder must be on storage all of them see.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from rlx.errors import RunError

COMPLETE = "COMPLETE"
_NAME = re.compile(r"step_(\d{8,})")


def rng_state() -> dict:
    """The states of python ``random``, numpy, torch CPU and every CUDA device, as
    plain data (loadable with ``weights_only=True``)."""
    version, internal, gauss = random.getstate()
    state = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached]
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what ``rng_state`` returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _step(path: Path) -> int | None:
    match = _NAME.fullmatch(path.name)
    return int(match.group(1)) if match else None


def _complete(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _step(p) is not None and (p / COMPLETE).is_file()]
    return sorted(found, key=_step)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete checkpoint with the highest step, or ``None``.

    Folders without ``COMPLETE`` and ``*.tmp-*`` leftovers of a killed save never count.
    """
    found = _complete(Path(root))
    return found[-1] if found else None


def resume_latest(root: str | Path, restore: Callable[[Path], int], log=print) -> int:
    """Restore a run from the latest complete checkpoint under ``root`` (``--resume``).

    ``restore`` loads one checkpoint folder into the run and returns its step, which
    this returns too. Resuming from nothing is an error: a fresh start would silently
    overwrite the run it was meant to continue.
    """
    path = latest_checkpoint(root)
    if path is None:
        raise RunError(f"--resume: no complete checkpoint under {root}")
    step = restore(path)
    log(f"resumed from {path} at step {step}")
    return step


def save_checkpoint(root: str | Path, step: int, engine, trainer_state: dict, keep: int, *,
                    name: str | None = None) -> Path:
    """Save ``engine`` and ``trainer_state`` as ``root/step_{step:08d}``; returns the path.

    Keeps the ``keep`` newest complete step checkpoints (all of them when ``keep`` < 1)
    and removes leftovers of earlier saves that were killed. ``name`` saves under
    another folder name instead (a second engine beside the first, say); such folders
    are never pruned and never returned by ``latest_checkpoint``.
    """
    root = Path(root)
    final = root / (name or f"step_{step:08d}")
    # every rank writes into the folder rank 0 names
    tmp = Path(engine.broadcast_object(str(root / f"{final.name}.tmp-{os.getpid()}")))
    if engine.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "rng").mkdir(parents=True)
    engine.barrier()
    engine.save(tmp / "engine")
    torch.save(rng_state(), tmp / "rng" / f"rank_{engine.rank}.pt")
    engine.barrier()
    if engine.rank == 0:
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2))
        _fsync_tree(tmp)
        with open(tmp / COMPLETE, "w") as f:
            f.write(f"{step}\n")
            f.flush()
            os.fsync(f.fileno())
        if final.exists():
            # saving the same step again (a resumed run's last save): move the old one aside first
            old = root / f"{final.name}.tmp-replaced-{os.getpid()}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
        _fsync_dir(root)
        _prune(root, keep, current=final)
    engine.barrier()
    return final


def _prune(root: Path, keep: int, current: Path) -> None:
    for leftover in root.glob("*.tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    if keep < 1:
        return
    for old in _complete(root)[:-keep]:
        if old != current:
            shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(path: str | Path, engine) -> dict:
    """Restore ``engine`` and this rank's RNG states from ``path``; returns the trainer state."""
    path = Path(path)
    if not (path / COMPLETE).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {COMPLETE} marker)")
    engine.load(path / "engine")
    rng = path / "rng" / f"rank_{engine.rank}.pt"
    if not rng.is_file():
        raise FileNotFoundError(f"{path} holds no RNG state for rank {engine.rank}: "
                                "resume with the world size it was saved with")
    set_rng_state(torch.load(rng, weights_only=True))
    return json.loads((path / "trainer_state.json").read_text())
