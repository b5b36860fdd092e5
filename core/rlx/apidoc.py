"""The API reference of what plugins use (docs/api.md), generated from docstrings.

``python -m rlx.apidoc`` rewrites docs/api.md; ``python -m rlx.apidoc --check`` fails
when the committed page differs from what the code says (tests/test_docs.py runs it).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Any

# (module, names) in the order the page shows them; None: every public function
SECTIONS = [
    ("rlx.algorithm", ["AlgorithmSpec", "PreferenceScores", "UnpairedScores", "call_with_accepted"]),
    ("rlx.config", ["OnlineConfig", "ONLINE_DEFAULTS", "PREFERENCE_DEFAULTS", "opt", "build"]),
    ("rlx.batch", ["Batch"]),
    ("rlx.ops", None),
    ("rlx.tasks", ["Task"]),
    ("rlx.errors", ["RlxError", "ConfigError", "PluginError", "RegistryError", "RewardError"]),
    ("rlx.contract", ["contract_tests", "checks", "run_checks", "ContractError"]),
]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def _doc(obj: Any) -> str:
    doc = (inspect.getdoc(obj) or "").strip()
    # a dataclass without a docstring gets its signature as one: not worth repeating
    return "" if inspect.isclass(obj) and doc.startswith(f"{obj.__name__}(") else doc


def _field_comments(cls: type) -> dict[str, str]:
    """``name: type  # comment`` lines of a dataclass's source: the batch documents its fields so."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    return dict(re.findall(r"^\s+(\w+):[^#\n]*#\s*(.+)$", source, flags=re.M))


def _default(f: dataclasses.Field) -> str:
    if callable(f.default) and hasattr(f.default, "__name__"):
        return f.default.__name__  # a repr would hold its address, different in every process
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return repr(f.default_factory())
    return "required"


def _fields(cls: type) -> list[str]:
    comments = _field_comments(cls)
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        meaning = f.metadata.get("help") or comments.get(f.name, "")
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        cells = [f"`{f.name}`", f"`{kind}`", f"`{_default(f)}`", meaning]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return rows


def _entry(module: str, name: str, obj: Any) -> list[str]:
    if inspect.isclass(obj):
        lines = [f"### `{module}.{name}`", ""]
        if dataclasses.is_dataclass(obj):
            bases = [b.__name__ for b in obj.__bases__ if b is not object]
            lines[0] = f"### `{module}.{name}`" + (f" ({', '.join(bases)})" if bases else "")
        lines += [_doc(obj), ""]
        if dataclasses.is_dataclass(obj):
            lines += _fields(obj) + [""]
        return lines
    if callable(obj):
        return [f"### `{module}.{name}{inspect.signature(obj)}`", "", _doc(obj), ""]
    shown = "\n".join(f"    {k!r}: {v!r}," for k, v in obj.items()) if isinstance(obj, dict) else repr(obj)
    return [f"### `{module}.{name}`", "", "```python", "{\n" + shown + "\n}" if isinstance(obj, dict) else shown,
            "```", ""]


def render() -> str:
    import importlib

    lines = ["# API reference", "",
             "What plugins import from rlx, generated from the docstrings by `python -m rlx.apidoc`",
             "(do not edit by hand; tests/test_docs.py fails when it is out of date). How the parts fit",
             "together is in [plugin-guide.md](plugin-guide.md).", ""]
    for module_name, names in SECTIONS:
        module = importlib.import_module(module_name)
        lines += [f"## `{module_name}`", "", _doc(module), ""]
        if names is None:
            names = [n for n, f in vars(module).items()
                     if not n.startswith("_") and inspect.isfunction(f) and f.__module__ == module_name]
        for name in names:
            lines += _entry(module_name, name, getattr(module, name))
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not PAGE.is_file() or PAGE.read_text() != text:
            print(f"{PAGE} is out of date: run python -m rlx.apidoc", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
