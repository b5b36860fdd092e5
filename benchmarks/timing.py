"""Timers wrapped around a class's methods, for the benchmarks that time parts of a run."""

from __future__ import annotations

import time
from typing import Callable


def time_method(cls, name: str, record: Callable[[float], None], *, sync: Callable[[], None] | None = None,
                when: Callable[[], bool] = lambda: True) -> None:
    """Replace ``cls.name`` by a wrapper that passes each call's seconds to ``record``
    while ``when()`` holds; ``sync`` (a device synchronize) runs at both ends of the call,
    so that the queued work counts to the method that queued it."""
    method = getattr(cls, name)

    def wrapper(*args, **kwargs):
        if not when():
            return method(*args, **kwargs)
        if sync:
            sync()
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            if sync:
                sync()
            record(time.perf_counter() - start)

    setattr(cls, name, wrapper)
