"""The plugin host: entry-point discovery, selection and the component registries.

Every first-party feature is a plugin found through the ``rlx`` entry-point group, the
same way a third-party one is. ``RLX_LOAD_PLUGINS`` (comma-separated distribution
names) loads only those; ``RLX_DISABLE_PLUGINS`` skips some. ``RLX_TRACE_PLUGINS=1``
prints every hook call.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pluggy

from rlx import hookspecs
from rlx.registry import Registry, RegistryError
from rlx.errors import PluginError

GROUP = "rlx"

# Core modules that register built-in components through the same hooks plugins use.
DEFAULT_PLUGINS = ["rlx.tasks", "rlx.losses"]

# registration hook name -> registry kind
REGISTRIES = {
    "register_algorithms": "algorithm",
    "register_advantage_estimators": "advantage estimator",
    "register_policy_losses": "policy loss",
    "register_off_policy_corrections": "off-policy correction",
    "register_value_losses": "value loss",
    "register_preference_losses": "preference loss",
    "register_reward_functions": "reward function",
    "register_reward_models": "reward model",
    "register_samplers": "sampler",
    "register_vlm_processors": "VLM processor",
    "register_tasks": "task",
}


@dataclass
class PluginInfo:
    name: str  # distribution name, or module:attr for a local plugin
    version: str | None
    hooks: list[str] = field(default_factory=list)
    components: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class Host:
    pm: pluggy.PluginManager
    registries: dict[str, Registry]
    plugins: dict[str, PluginInfo]
    failures: dict[str, str]  # distribution -> error text

    def registry(self, hook: str) -> Registry:
        return self.registries[hook]

    @property
    def algorithms(self) -> Registry:
        return self.registries["register_algorithms"]

    def get(self, hook: str, name: str) -> Any:
        return self.registries[hook].get(name)

    @property
    def hook(self):
        return self.pm.hook


def _split_env(name: str) -> set[str] | None:
    value = os.environ.get(name)
    if value is None:
        return None
    return {v.strip() for v in value.split(",") if v.strip()}


def _entry_points():
    return sorted(metadata.entry_points(group=GROUP), key=lambda ep: (ep.dist.name if ep.dist else "", ep.name))


def load_object(spec: str, what: str = "local plugin") -> Any:
    """Import ``module:attr`` or ``path/to/file.py:attr`` (``:attr`` optional for a module).

    The working directory is importable, as it is under ``python -m``.
    """
    target, _, attr = spec.partition(":")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise PluginError(f"{what} {spec!r}: file {target!r} does not exist")
            module_spec = importlib.util.spec_from_file_location(f"rlx_local_{path.stem}", path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(target)
    except PluginError:
        raise
    except Exception as e:
        raise PluginError(f"{what} {spec!r} failed to import: {type(e).__name__}: {e}") from e
    obj = module
    for part in filter(None, attr.split(".")):
        if not hasattr(obj, part):
            raise PluginError(f"{what} {spec!r}: {target!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def build_host(local_plugins: list[str] | tuple[str, ...] = ()) -> Host:
    """Load every selected plugin and fill the registries.

    A plugin that fails to import is recorded under its distribution name and the
    rest still load. Duplicate component names raise, naming both providers.
    """
    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(hookspecs)
    if os.environ.get("RLX_TRACE_PLUGINS"):
        pm.trace.root.setwriter(lambda msg: print(msg, end="", file=sys.stderr))
        pm.enable_tracing()

    only, disabled = _split_env("RLX_LOAD_PLUGINS"), _split_env("RLX_DISABLE_PLUGINS") or set()
    plugins: dict[str, PluginInfo] = {}
    failures: dict[str, str] = {}
    owner: dict[int, str] = {}

    for module in DEFAULT_PLUGINS:
        obj = importlib.import_module(module)
        pm.register(obj, name=module)
        owner[id(obj)] = "rlx"
    plugins["rlx"] = PluginInfo("rlx", metadata.version("rlx"))

    for ep in _entry_points():
        dist = ep.dist.name if ep.dist else ep.value
        if (only is not None and dist not in only) or dist in disabled:
            continue
        try:
            obj = ep.load()
        except Exception as e:
            failures[dist] = f"{type(e).__name__}: {e}"
            continue
        if pm.is_registered(obj):
            continue
        pm.register(obj, name=f"{dist}:{ep.name}")
        owner[id(obj)] = dist
        plugins.setdefault(dist, PluginInfo(dist, ep.dist.version if ep.dist else None))

    for spec in local_plugins:
        obj = load_object(spec)
        if not pm.is_registered(obj):
            pm.register(obj, name=spec)
            owner[id(obj)] = spec
            plugins.setdefault(spec, PluginInfo(spec, None))

    try:
        pm.check_pending()
    except pluggy.PluginValidationError as e:
        name = owner.get(id(e.plugin), pm.get_name(e.plugin))
        raise PluginError(f"plugin {name} implements an unknown hook: {e}") from e

    for plugin in pm.get_plugins():
        info = plugins[owner[id(plugin)]]
        info.hooks.extend(sorted(h.name for h in pm.get_hookcallers(plugin) or []))

    registries = {hook: Registry(kind) for hook, kind in REGISTRIES.items()}
    for hook, registry in registries.items():
        caller = getattr(pm.hook, hook)
        for impl in caller.get_hookimpls():
            provider = owner[id(impl.plugin)]

            def register(name: str, component: Any, _r=registry, _p=provider, _h=hook) -> None:
                _r.add(name, component, _p)
                plugins[_p].components.setdefault(_h.removeprefix("register_"), []).append(name)

            try:
                impl.function(register=register)
            except RegistryError:
                raise
            except Exception as e:
                raise PluginError(f"plugin {provider} failed in {hook}: {type(e).__name__}: {e}") from e
    return Host(pm, registries, plugins, failures)


_host: Host | None = None
_host_key: tuple | None = None


def get_host(local_plugins: list[str] | tuple[str, ...] = ()) -> Host:
    """The process-wide host; rebuilt when the local plugins or selection change."""
    global _host, _host_key
    key = (tuple(local_plugins), os.environ.get("RLX_LOAD_PLUGINS"), os.environ.get("RLX_DISABLE_PLUGINS"))
    if _host is None or _host_key != key:
        _host, _host_key = build_host(local_plugins), key
    return _host


def reset_host() -> None:
    global _host, _host_key
    _host = _host_key = None
