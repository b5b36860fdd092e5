"""docs/plugins.md documents every hook with its exact signature."""

import inspect
from pathlib import Path

import pytest

from rlx import hookspecs

DOCS = (Path(__file__).parent.parent / "docs" / "plugins.md").read_text()
HOOKS = [fn for fn in vars(hookspecs).values() if callable(fn) and hasattr(fn, "rlx_spec")]


def signature(fn) -> str:
    sig = inspect.signature(fn)
    params = ", ".join(f"{p.name}: {p.annotation}" for p in sig.parameters.values())
    return f"{fn.__name__}({params}) -> {sig.return_annotation}"


def test_there_are_hooks():
    assert len(HOOKS) >= 15


@pytest.mark.parametrize("fn", HOOKS, ids=lambda fn: fn.__name__)
def test_hook_documented_with_signature(fn):
    assert f"### `{signature(fn)}`" in DOCS, f"docs/plugins.md lacks {signature(fn)}"
    assert fn.__doc__, f"{fn.__name__} has no docstring"


def test_api_reference_is_up_to_date():
    from rlx.apidoc import PAGE, render

    assert PAGE.read_text() == render(), "docs/api.md is out of date: run python -m rlx.apidoc"
