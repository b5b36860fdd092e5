"""Make an installed-looking distribution (a dist-info folder) in a directory."""

from __future__ import annotations

import textwrap
from pathlib import Path


def make_dist(root: Path, name: str, modules: dict[str, str], entry_points: dict[str, str] | None = None,
              version: str = "0.1.0") -> Path:
    """Write ``modules`` (file name -> source) and a dist-info for ``name`` into ``root``.

    ``entry_points`` maps entry-point names to ``module`` targets in the ``rlx`` group;
    ``None`` writes a distribution without entry points.
    """
    root.mkdir(parents=True, exist_ok=True)
    for filename, source in modules.items():
        path = root / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if entry_points:
        lines = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
        (info / "entry_points.txt").write_text(f"[rlx]\n{lines}\n")
    return root
