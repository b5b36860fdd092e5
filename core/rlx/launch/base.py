"""The handle a launcher gives the driver for each role."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol


class RoleGroup(Protocol):
    """One role's workers (its data-parallel ranks). ``call`` runs a method on every rank
    and returns one future per rank; ``call_split`` gives each rank its share of a batch;
    ``wait`` is the common case of calling and waiting for rank 0's result (every rank's
    call has finished when it returns)."""

    role: str

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Future]: ...

    def wait(self, method: str, *args: Any, **kwargs: Any) -> Any: ...

    def call_split(self, method: str, batch: Any, *args: Any, **kwargs: Any) -> list[Future]:
        """``method`` on every rank with that rank's share of ``batch`` (``Batch.split``)."""
        ...
