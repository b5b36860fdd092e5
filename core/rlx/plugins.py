"""The plugin host: entry-point discovery, selection and the component registries.

Every first-party feature is a plugin found through the ``rlx`` entry-point group, the
same way a third-party one is. ``RLX_LOAD_PLUGINS`` (comma-separated distribution
names) loads only those; ``RLX_DISABLE_PLUGINS`` skips some. ``RLX_TRACE_PLUGINS=1``
prints every hook call.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pluggy

from rlx import hookspecs
from rlx.registry import Registry
from rlx.errors import PluginError

GROUP = "rlx"

# Core modules that register built-in components through the same hooks plugins use.
DEFAULT_PLUGINS = ["rlx.tasks", "rlx.losses", "rlx.loggers"]

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
    "register_environments": "environment",
    "register_agents": "agent",
    "register_loggers": "logger",
}

HOOKS = {name for name, fn in vars(hookspecs).items() if hasattr(fn, "rlx_spec")}


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


def check_file(spec: str, what: str = "local plugin") -> None:
    """A ``path/to/file.py:attr`` spec's file must be there (checked without importing it)."""
    target = spec.partition(":")[0]
    if target.endswith(".py") and not Path(target).is_file():
        raise PluginError(f"{what} {spec!r}: file {target!r} does not exist")


def load_object(spec: str, what: str = "local plugin") -> Any:
    """Import ``module:attr`` or ``path/to/file.py:attr`` (``:attr`` optional for a module).

    The working directory is importable, as it is under ``python -m``.
    """
    check_file(spec, what)
    target, _, attr = spec.partition(":")
    try:
        if target.endswith(".py"):
            path = Path(target)
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


def _hint(word: str, choices) -> str:
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" Did you mean {match[0]!r}?" if match else ""


def _hook_problem(pm: pluggy.PluginManager, obj: Any) -> str | None:
    """Why ``obj`` cannot be registered as it is (an unknown hook, a misspelt argument, a
    hook function left unmarked), or None. pluggy would only raise a bare validation error
    for the first two and silently ignore the third."""
    options = {name: pm.parse_hookimpl_opts(obj, name) for name in dir(obj)}
    marked = {name: opts.get("specname") or name for name, opts in options.items() if opts is not None}
    for attr, hook in marked.items():
        if hook not in HOOKS:
            return f"implements an unknown hook {hook!r}.{_hint(hook, HOOKS)}"
        spec_args = getattr(pm.hook, hook).spec.argnames
        try:
            impl_args = [a for a in inspect.signature(getattr(obj, attr)).parameters if a != "self"]
        except (TypeError, ValueError):
            continue
        for arg in impl_args:
            if arg not in spec_args:
                return (f"{attr}({', '.join(impl_args)}) takes {arg!r}, which the hook does not pass; it passes "
                        f"({', '.join(spec_args)}).{_hint(arg, spec_args)}")
    for hook in sorted(HOOKS - set(marked.values())):
        if callable(getattr(obj, hook, None)):
            return f"defines {hook} without @hookimpl, so it would be ignored: mark it with @rlx.hookimpl"
    return None


def _register(pm: pluggy.PluginManager, obj: Any, name: str) -> str | None:
    """Register ``obj`` with pluggy; the reason it cannot be, or None."""
    problem = _hook_problem(pm, obj)
    if problem:
        return problem
    try:
        pm.register(obj, name=name)
    except (pluggy.PluginValidationError, ValueError) as e:
        return str(e)
    return None


def _collect(pm: pluggy.PluginManager, obj: Any) -> list[tuple[str, str, Any]]:
    """(hook, name, component) for everything ``obj``'s registration hooks register."""
    staged: list[tuple[str, str, Any]] = []
    for hook in REGISTRIES:
        for impl in getattr(pm.hook, hook).get_hookimpls():
            if impl.plugin is not obj:
                continue

            def register(name: str, component: Any, _h=hook) -> None:
                if not isinstance(name, str) or not name:
                    raise PluginError(f"{_h}: a component name must be a non-empty string, got {name!r}")
                staged.append((_h, name, component))

            try:
                impl.function(**{arg: register for arg in impl.argnames})
            except Exception as e:
                raise PluginError(f"{hook} raised {type(e).__name__}: {e}") from e
    return staged


def build_host(local_plugins: list[str] | tuple[str, ...] = ()) -> Host:
    """Load every selected plugin and fill the registries.

    One plugin's failure never stops the others: a distribution that fails to import,
    implements an unknown hook, takes an argument its hook does not pass, leaves a hook
    function unmarked or raises while registering is left out and recorded in
    ``failures`` (distribution -> reason). A name two plugins register is unusable, and
    both are named. ``RLX_STRICT_PLUGINS=1`` turns any of these into a ``PluginError``
    (for CI). A local plugin (``--plugin``) was asked for by name: its failure raises.
    """
    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(hookspecs)
    if os.environ.get("RLX_TRACE_PLUGINS"):
        pm.trace.root.setwriter(lambda msg: print(msg, end="", file=sys.stderr))
        pm.enable_tracing()

    only, disabled = _split_env("RLX_LOAD_PLUGINS"), _split_env("RLX_DISABLE_PLUGINS") or set()
    plugins: dict[str, PluginInfo] = {"rlx": PluginInfo("rlx", metadata.version("rlx"))}
    failures: dict[str, str] = {}
    loaded: list[tuple[str, Any]] = []  # (provider, plugin object), in load order

    def admit(provider: str, obj: Any, name: str, version: str | None, strict: bool) -> None:
        if pm.is_registered(obj):
            return
        problem = _register(pm, obj, name)
        if problem is None:
            loaded.append((provider, obj))
            plugins.setdefault(provider, PluginInfo(provider, version))
        elif strict:
            raise PluginError(f"plugin {provider} {problem}")
        else:
            failures[provider] = problem

    for module in DEFAULT_PLUGINS:
        admit("rlx", importlib.import_module(module), module, None, strict=True)

    for ep in _entry_points():
        dist = ep.dist.name if ep.dist else ep.value
        if (only is not None and dist not in only) or dist in disabled:
            continue
        try:
            obj = ep.load()
        except Exception as e:
            failures[dist] = f"failed to import {ep.value}: {type(e).__name__}: {e}"
            continue
        admit(dist, obj, f"{dist}:{ep.name}", ep.dist.version if ep.dist else None, strict=False)

    for spec in local_plugins:
        admit(spec, load_object(spec), spec, None, strict=True)

    registries = {hook: Registry(kind, failed=failures) for hook, kind in REGISTRIES.items()}
    objects: dict[str, list[Any]] = {}
    for provider, obj in loaded:
        objects.setdefault(provider, []).append(obj)
    for provider, objs in objects.items():
        try:
            staged = [item for obj in objs for item in _collect(pm, obj)]
        except PluginError as e:
            if provider == "rlx" or provider in local_plugins:
                raise PluginError(f"plugin {provider}: {e}") from e
            failures[provider] = str(e)
            for obj in objs:
                pm.unregister(obj)
            del plugins[provider]
            continue
        info = plugins[provider]
        info.hooks = sorted({h.name for obj in objs for h in pm.get_hookcallers(obj) or []})
        for hook, name, component in staged:
            registries[hook].add(name, component, provider)
            info.components.setdefault(hook.removeprefix("register_"), []).append(name)

    for registry in registries.values():
        for name, providers in registry.conflicts.items():
            for provider in dict.fromkeys(providers):
                failures[provider] = "; ".join(filter(None, [failures.get(provider), registry.conflict_message(name)]))

    if failures and os.environ.get("RLX_STRICT_PLUGINS", "0") not in ("", "0"):
        raise PluginError("plugins failed (RLX_STRICT_PLUGINS is set): "
                          + "; ".join(f"{dist}: {reason}" for dist, reason in failures.items()))
    return Host(pm, registries, plugins, failures)


_reported: set[tuple[str, str]] = set()


def report_failures(host: Host) -> None:
    """Warn on stderr about each failed plugin, once per process."""
    for dist, reason in host.failures.items():
        if (dist, reason) not in _reported:
            _reported.add((dist, reason))
            left_out = "" if dist in host.plugins else " (left out; the other plugins work)"
            print(f"Warning: plugin {dist}{left_out}: {reason}", file=sys.stderr)


_host: Host | None = None
_host_key: tuple | None = None


def get_host(local_plugins: list[str] | tuple[str, ...] = ()) -> Host:
    """The process-wide host; rebuilt when the local plugins or selection change."""
    global _host, _host_key
    key = (tuple(local_plugins), os.environ.get("RLX_LOAD_PLUGINS"), os.environ.get("RLX_DISABLE_PLUGINS"))
    if _host is None or _host_key != key:
        _host, _host_key = build_host(local_plugins), key
    return _host
