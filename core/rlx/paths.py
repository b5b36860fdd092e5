"""Where a run's models and data are. These checks need neither torch nor transformers,
so that a run given a wrong path says so in a second (``check_run``), before the model
libraries load; the loaders make the same checks."""

from __future__ import annotations

import os
import re
from pathlib import Path

from rlx.data import check_path
from rlx.errors import ModelError


def model_path(path: str | Path) -> str:
    """A model folder or hub name. ``builtin:NAME`` models are resolved to their folders
    when a run starts (``rlx.run.with_builtin_models``), or with ``rlx.tiny.builtin_model``.

    A path that names no local folder and cannot be a hub name (an absolute path, one
    starting with ``./``, ``../`` or ``~``, or more than one ``/``) fails here with
    ``ModelError``, rather than with the hub's rules for repository names.
    """
    path = str(path)
    if path.startswith("builtin:"):
        raise ModelError(f"{path!r} is a built-in model name: resolve it to its folder with "
                         f"rlx.tiny.builtin_model({path!r}) first (a run does this itself)")
    local = Path(path).expanduser()
    if local.is_file():
        raise ModelError(f"model path {path!r} is a file; give the folder that holds config.json and the weights")
    if not local.exists() and not _could_be_hub_name(path):
        raise ModelError(f"model folder {path!r} does not exist (and it is not a hub name)")
    return str(local) if path.startswith("~") else path  # transformers does not expand ~


# A hub name is "name" or "owner/name": letters, digits, "-", "_" and "." (see
# huggingface_hub's validate_repo_id), at most 96 characters.
_HUB_PART = r"\w(?:[\w.-]*\w)?"
_HUB_NAME = re.compile(rf"^(?:{_HUB_PART}/)?{_HUB_PART}$")


def _could_be_hub_name(path: str) -> bool:
    if os.path.isabs(path) or path.startswith("~") or (os.sep != "/" and os.sep in path):
        return False
    return bool(_HUB_NAME.match(path)) and len(path) <= 96 and "--" not in path and ".." not in path


def check_model_folder(source: str) -> None:
    """A local folder must hold a config.json: without one nothing can be loaded from it."""
    local = Path(source).expanduser()
    if local.is_dir() and not (local / "config.json").is_file():
        raise ModelError(
            f"model folder {source!r} holds no config.json, so it is not a Hugging Face model folder "
            f"(a folder written by save_pretrained, such as a run's final/)")


def check_run(config) -> None:
    """The run's model folders and data files, as the loaders will find them."""
    for path in (config.model.path, config.reward.model):
        if path and not path.startswith("builtin:"):
            check_model_folder(model_path(path))
    for key, path in (("data.path", config.data.path), ("data.eval_path", config.data.eval_path)):
        if path:
            check_path(path, key)
