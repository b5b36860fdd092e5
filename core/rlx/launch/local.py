"""The local launcher: every role in this process, on one device, with no copies (but for
an engine that generates while the policy trains, which needs weights of its own)."""

from __future__ import annotations

import inspect
from concurrent.futures import Future
from typing import Any


class LocalGroup:
    """A role with one rank: the worker object itself. A call runs now and returns a
    finished future, so a driver written for futures runs unchanged (and, in order)."""

    size = 1

    def __init__(self, role: str, worker: Any):
        self.role, self.worker = role, worker

    def call_each(self, method: str, calls: list[tuple]) -> list[Future]:
        (args,) = calls
        return self.call(method, *args)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Future]:
        future: Future = Future()
        try:
            future.set_result(getattr(self.worker, method)(*args, **kwargs))
        except BaseException as e:  # the driver sees it when it waits, as with a remote rank
            future.set_exception(e)
        return [future]

    def wait(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.call(method, *args, **kwargs)[0].result()

    def call_split(self, method: str, batch, *args: Any, **kwargs: Any) -> list[Future]:
        """``method`` on each rank's share of ``batch``: here the one rank takes it all."""
        return self.call(method, batch, *args, **kwargs)


class LocalLauncher:
    """Builds each worker in this process, sharing the driver's plugin host;
    ``place(role, cls, *args)`` returns the role's group."""

    name = "local"

    def __init__(self, host):
        self.host = host
        self.own_copy = False  # whether the rollout engine holds weights of its own

    def reserve(self, roles: dict) -> None:
        """Nothing to reserve: every role runs here."""

    def place(self, role: str, cls: type, *args: Any, ranks: int = 1, **kwargs: Any) -> LocalGroup:
        if ranks != 1:
            raise ValueError(f"the local launcher runs one rank per role, not {ranks}: use --launcher ray")
        if "host" in inspect.signature(cls).parameters:
            kwargs["host"] = self.host
        return LocalGroup(role, cls(*args, **kwargs))

    def place_rollout(self, policy: LocalGroup, config, tokenizer, engine: str) -> LocalGroup:
        """The native engine samples with the policy's own module, unless rollouts overlap
        training (then, like vLLM, it loads a copy that ``sync_weights`` keeps in step)."""
        from rlx.workers.rollout import RolloutWorker

        self.own_copy = engine == "vllm" or config.rollout.overlap
        if engine == "vllm":
            return LocalGroup("rollout", RolloutWorker.vllm(config, tokenizer))
        shared = None if self.own_copy else policy.worker.module()
        return LocalGroup("rollout", RolloutWorker.native(config, tokenizer, module=shared))

    def sync_weights(self, policy: LocalGroup, rollout: LocalGroup) -> None:
        """The policy's new weights into an engine with its own copy (none to send otherwise)."""
        if self.own_copy:
            rollout.worker.update_weights(policy.worker.rollout_weights())

    def shutdown(self) -> None:
        """Nothing to stop: the workers go with the driver."""
