"""Where each rank of each role runs under Ray: the bundles of one placement group, and
each actor's bundle and resource share. Pure bookkeeping, so that it is testable without
a cluster.

Every rank needs one device slot: a GPU when the cluster has GPUs (a vLLM engine with
tensor parallelism takes that many), else one logical CPU. Roles named together in
``launcher.colocate`` share slots: rank ``i`` of each goes to the group's slot ``i``, and
the actors on one slot split it evenly (two roles on a GPU take 0.5 each, the fractional
share Ray schedules by). A role left out of every group gets slots of its own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Slot:
    bundle: int
    cpus: float
    gpus: float


def parse_colocate(groups: list[str], roles: list[str]) -> list[list[str]]:
    """``["policy,reference", "critic,reward"]`` or ``["all"]`` as lists of the roles this
    run has; an unknown role name or a role in two groups is an error."""
    from rlx.errors import ConfigError

    known = ("policy", "reference", "critic", "reward", "rollout")
    out, seen = [], set()
    for group in groups:
        names = list(known) if group.strip() == "all" else [n.strip() for n in group.split(",") if n.strip()]
        for name in names:
            if name not in known:
                raise ConfigError(f"launcher.colocate: unknown role {name!r} (roles: {', '.join(known)}, or all)")
            if name in seen:
                raise ConfigError(f"launcher.colocate: {name} is in two groups")
            seen.add(name)
        names = [n for n in names if n in roles]
        if names:
            out.append(names)
    return out


def plan(roles: dict[str, tuple[int, float]], colocate: list[list[str]], gpus: bool) -> tuple[list[dict], dict]:
    """``roles`` maps each role to (ranks, devices per rank). Returns the bundles (Ray
    resource dicts) and ``{role: [Slot per rank]}``."""
    groups = [g for g in colocate if any(r in roles for r in g)]
    grouped = {r for g in groups for r in g}
    groups += [[r] for r in roles if r not in grouped]
    bundles: list[dict] = []
    slots: dict[str, list[Slot]] = {}
    for group in groups:
        members = [r for r in group if r in roles]
        width = max(roles[r][0] for r in members)
        devices = max(roles[r][1] for r in members)
        first = len(bundles)
        bundles += [{"CPU": 1.0, "GPU": float(devices)} if gpus and devices else {"CPU": 1.0} for _ in range(width)]
        for i in range(width):
            here = [r for r in members if i < roles[r][0]]
            for r in here:
                share = 1.0 / len(here)
                slots.setdefault(r, []).append(Slot(first + i, share, roles[r][1] * share if gpus else 0.0))
    return bundles, slots
