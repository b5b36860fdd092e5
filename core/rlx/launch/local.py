"""The local launcher: every role in this process, on one device, with no copies."""

from __future__ import annotations

import inspect
from concurrent.futures import Future
from typing import Any


class LocalGroup:
    """A role with one rank: the worker object itself. A call runs now and returns a
    finished future, so a driver written for futures runs unchanged (and, in order)."""

    def __init__(self, role: str, worker: Any):
        self.role, self.worker = role, worker

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Future]:
        future: Future = Future()
        try:
            future.set_result(getattr(self.worker, method)(*args, **kwargs))
        except BaseException as e:  # the driver sees it when it waits, as with a remote rank
            future.set_exception(e)
        return [future]

    def wait(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.call(method, *args, **kwargs)[0].result()


class LocalLauncher:
    """Builds each worker in this process, sharing the driver's plugin host;
    ``place(role, cls, *args)`` returns the role's group."""

    name = "local"
    shares_weights = True  # the rollout engine samples with the policy's own module

    def __init__(self, host):
        self.host = host

    def place(self, role: str, cls: type, *args: Any, **kwargs: Any) -> LocalGroup:
        if "host" in inspect.signature(cls).parameters:
            kwargs["host"] = self.host
        return LocalGroup(role, cls(*args, **kwargs))

    def place_rollout(self, policy: LocalGroup, config, tokenizer) -> LocalGroup:
        from rlx.workers.rollout import RolloutWorker

        return LocalGroup("rollout", RolloutWorker.native(config, tokenizer, module=policy.worker.module()))

    def shutdown(self) -> None:
        """Nothing to stop: the workers go with the driver."""
