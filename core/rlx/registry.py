"""Named components, filled once per process by the registration hooks."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any
from rlx.errors import RegistryError


@dataclass
class Registry:
    """Components of one kind (algorithms, policy losses ...), each with its provider.

    A name two plugins register is a conflict: it is left out (neither provider wins by
    load order) and looking it up names both. ``failed`` (distribution -> reason) is the
    host's record of plugins that did not load, so that a lookup can say a component may
    be missing because its package is broken rather than absent.
    """

    kind: str
    items: dict[str, Any] = field(default_factory=dict)
    providers: dict[str, str] = field(default_factory=dict)
    conflicts: dict[str, list[str]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, component: Any, provider: str) -> None:
        if not isinstance(name, str) or not name:
            raise RegistryError(f"{provider} registered a {self.kind} with an invalid name {name!r}")
        if name in self.conflicts:
            self.conflicts[name].append(provider)
            return
        if name in self.items:
            self.conflicts[name] = [self.providers.pop(name), provider]
            del self.items[name]
            return
        self.items[name] = component
        self.providers[name] = provider

    def conflict_message(self, name: str) -> str:
        providers = self.conflicts[name]
        return (f"{self.kind} {name!r} is registered twice: by {' and by '.join(providers)}; it is unusable until one "
                f"of them is uninstalled or disabled (RLX_DISABLE_PLUGINS={providers[-1]})")

    def get(self, name: str) -> Any:
        if name in self.conflicts:
            raise RegistryError(self.conflict_message(name))
        if name not in self.items:
            known = ", ".join(sorted(self.items)) or "none"
            hint = difflib.get_close_matches(name, self.items, n=1)
            did_you_mean = f" Did you mean {hint[0]!r}?" if hint else ""
            broken = "".join(f" {dist} is installed but failed to load, and may provide it: {reason}"
                             for dist, reason in self.failed.items())
            raise RegistryError(f"unknown {self.kind} {name!r}.{did_you_mean} Installed: {known}.{broken}")
        return self.items[name]

    def __contains__(self, name: str) -> bool:
        return name in self.items

    def __iter__(self):
        return iter(sorted(self.items))
