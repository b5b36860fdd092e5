"""Named components, filled once per process by the registration hooks."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any
from rlx.errors import RegistryError


@dataclass
class Registry:
    """Components of one kind (algorithms, policy losses ...), each with its provider."""

    kind: str
    items: dict[str, Any] = field(default_factory=dict)
    providers: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, component: Any, provider: str) -> None:
        if not isinstance(name, str) or not name:
            raise RegistryError(f"{provider} registered a {self.kind} with an invalid name {name!r}")
        if name in self.items:
            raise RegistryError(
                f"{self.kind} {name!r} is registered twice: by {self.providers[name]} and by {provider}"
            )
        self.items[name] = component
        self.providers[name] = provider

    def get(self, name: str) -> Any:
        if name not in self.items:
            known = ", ".join(sorted(self.items)) or "none"
            hint = difflib.get_close_matches(name, self.items, n=1)
            did_you_mean = f" Did you mean {hint[0]!r}?" if hint else ""
            raise RegistryError(f"unknown {self.kind} {name!r}.{did_you_mean} Installed: {known}")
        return self.items[name]

    def __contains__(self, name: str) -> bool:
        return name in self.items

    def __iter__(self):
        return iter(sorted(self.items))
