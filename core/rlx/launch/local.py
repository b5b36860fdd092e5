"""The local launcher: every role in this process, on one device, with no copies."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Callable


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
    """Builds each worker in this process; ``place(role, factory)`` returns its group."""

    name = "local"

    def place(self, role: str, factory: Callable[[], Any]) -> LocalGroup:
        return LocalGroup(role, factory())
