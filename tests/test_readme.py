"""README.md's list of installed algorithms is what `rlx algos list` reports for the
first-party plugins, offline and online apart."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def first_party_distributions() -> set[str]:
    names = (re.search(r'^name = "([^"]+)"', p.read_text(), re.M) for p in ROOT.glob("plugins/*/*/pyproject.toml"))
    return {m.group(1) for m in names if m}


def listed_by_the_cli() -> dict[str, set[str]]:
    """loop -> names of the first-party algorithms, from `rlx algos list`."""
    result = subprocess.run([sys.executable, "-m", "rlx_cli", "algos", "list"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    first_party = first_party_distributions()
    loops: dict[str, set[str]] = {}
    for line in result.stdout.splitlines():
        name, loop = line.split()[:2]
        provider = line.rsplit("[", 1)[1].rstrip("]")
        if provider in first_party:
            loops.setdefault(loop, set()).add(name)
    return loops


def listed_in_the_readme() -> dict[str, set[str]]:
    """loop -> names from the README paragraph "Installed algorithms: `a`, `b` (offline); ... (online)"."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"Installed algorithms:(.*?)(?:\n\s*\n|$)", readme, re.DOTALL)
    assert found, "README.md has no 'Installed algorithms:' paragraph"
    paragraph = found.group(1)
    groups = re.findall(r"((?:`[^`]+`[\s,]*(?:and\s+)?)+)\((offline|online)\)", paragraph)
    assert groups, f"no '`name`, ... (offline)' / '(online)' groups in: {paragraph!r}"
    loops: dict[str, set[str]] = {}
    for names, loop in groups:
        loops.setdefault(loop, set()).update(re.findall(r"`([^`]+)`", names))
    return loops


def test_readme_lists_the_installed_algorithms():
    readme, cli = listed_in_the_readme(), listed_by_the_cli()
    problems = []
    for loop in sorted(set(readme) | set(cli)):
        missing = sorted(cli.get(loop, set()) - readme.get(loop, set()))
        extra = sorted(readme.get(loop, set()) - cli.get(loop, set()))
        if missing or extra:
            problems.append(f"({loop}) missing {missing}, not installed {extra}")
    assert not problems, "README.md 'Installed algorithms': " + "; ".join(problems)
