"""Rollouts made ahead of training (``rollout.overlap``).

With overlap on, the rollout of step k+1 is generated in a thread while the policy
trains on step k's, so the engine and the trainer work at the same time. The price is
staleness: a sample is made by the weights of an earlier update. ``max_staleness``
bounds it: before a rollout starts, the engine takes the policy's weights whenever its
own would be more than that many updates older than the policy that will train on the
rollout. The update corrects for the lag with the engine's log-probs
(``algorithm.off_policy_correction``).

Weights move between two rollouts, and with partial rollouts (``rollout.partial_tokens``,
``rlx.partial``) also between two segments of one: once the policy has finished an update
(``publish``), the rollout in flight loads those weights at its next segment boundary and
its unfinished responses go on under them. Each token then records its own policy version.
The policy's weights are read only while it rests, from ``publish`` until the next
``take``, which waits for the rollout anyway.

Without overlap (``max_staleness`` 0) a rollout runs when it is taken, with the current
weights: the synchronous loop.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from rlx.rollout import Completion


class RolloutsAhead:
    """``take(step)`` gives step ``step``'s rollout and the policy version it started with.

    ``make(step)`` generates and scores a step's rollout; ``sync()`` copies the policy's
    weights into the engine; ``steps`` is the run's last step (none is made beyond it);
    ``prompts`` the run's prompt rows (a saved rollout names its prompts by index);
    ``version`` is the engine's version to start with (the policy's after a resume) and
    ``pending`` a rollout restored from a checkpoint.
    """

    def __init__(self, make: Callable[[int], Any], sync: Callable[[], None], max_staleness: int, steps: int,
                 prompts: list[dict], version: int = 0, pending: dict | None = None):
        self.make, self.sync, self.max_staleness, self.steps = make, sync, max_staleness, steps
        self.prompts = prompts
        self.engine_version = version
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="rlx-rollout") if max_staleness else None
        self.pending: tuple[int, int, Future] | None = None  # (step, engine version, its rollout)
        self.offered: int | None = None  # the policy's version while it rests, else None
        if pending is not None:
            done: Future = Future()
            done.set_result((self._from_json(pending["rollout"]), pending["seconds"]))
            self.pending = (pending["step"], pending["version"], done)

    def take(self, step: int) -> tuple[Any, int, float]:
        """The rollout of ``step`` (the policy has made ``step`` updates), the version it
        started with (a partial rollout's later tokens may be newer) and the seconds its
        generation took; with overlap, step+1's is started."""
        if self.pending is None:
            self._start(step, policy_version=step)
        started, version, future = self.pending
        if started != step:
            raise RuntimeError(f"rollout of step {started} is pending, but step {step} asked for one")
        rollout, seconds = future.result()
        self.pending = None
        self.offered = None  # the policy trains next: its weights are in flux
        if self.pool is not None and step + 1 < self.steps:
            self._start(step + 1, policy_version=step)
        return rollout, version, seconds

    def _start(self, step: int, policy_version: int) -> None:
        # the weights that will train on this rollout are at least `step`'s
        if self.engine_version < step - self.max_staleness:
            self.sync()
            self.engine_version = policy_version

        def timed():
            started = time.perf_counter()
            rollout = self.make(step)
            return rollout, time.perf_counter() - started

        if self.pool is None:
            future: Future = Future()
            future.set_result(timed())
        else:
            future = self.pool.submit(timed)
        self.pending = (step, self.engine_version, future)

    def publish(self, version: int) -> None:
        """The policy has made ``version`` updates and rests until the next ``take``: the
        rollout in flight may load its weights at a segment boundary."""
        self.offered = version

    def boundary(self) -> int:
        """Before each segment of a partial rollout: the resting policy's newer weights go
        into the engine; returns the version the engine holds."""
        offered = self.offered  # read once: take() clears it only while no rollout runs
        if offered is not None and offered > self.engine_version:
            self.sync()
            self.engine_version = offered
        return self.engine_version

    def synced(self, policy_version: int) -> None:
        """The engine now holds the policy's weights of ``policy_version``."""
        self.engine_version = policy_version

    def drain(self) -> None:
        """Wait for the rollout in flight (its result is kept), so the engine is idle."""
        if self.pending is not None:
            self.pending[2].result()

    def state(self) -> dict | None:
        """The rollout in flight, finished, as JSON for a checkpoint (each token's policy
        version with it): a resumed run trains on the same samples as one that went on."""
        if self.pending is None:
            return None
        step, version, future = self.pending
        rollout, seconds = future.result()
        return {"step": step, "version": version, "seconds": seconds, "rollout": self._to_json(rollout)}

    def close(self) -> None:
        """Stop the thread, after the rollout in flight (a generation cannot be cut short)."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


    # prompts by index: a row may hold what JSON cannot (encoded images)
    def _to_json(self, rollout) -> dict:
        prompts, completions, rewards, metrics = rollout
        index = {id(row): i for i, row in enumerate(self.prompts)}
        return {"prompts": [index[id(p)] for p in prompts], "completions": [dataclasses.asdict(c) for c in completions],
                "rewards": list(rewards), "metrics": metrics}

    def _from_json(self, data: dict):
        return ([self.prompts[i] for i in data["prompts"]], [Completion(**c) for c in data["completions"]],
                data["rewards"], data["metrics"])
