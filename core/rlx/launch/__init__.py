"""Launchers place role workers and call them: ``local`` (this process, one device) now;
a Ray launcher places the same workers as actors. Both hand the driver ``RoleGroup``
handles whose calls return futures."""

from rlx.launch.base import RoleGroup
from rlx.launch.local import LocalLauncher

__all__ = ["RoleGroup", "LocalLauncher", "make_launcher"]


def make_launcher(config, host):
    """The launcher ``config.launcher`` names."""
    cfg = config.launcher
    if cfg.name == "ray":
        from rlx.launch.ray import RayLauncher

        return RayLauncher(address=cfg.ray_address, num_cpus=cfg.ray_num_cpus, threads=config.training.threads,
                           colocate=cfg.colocate)
    return LocalLauncher(host)
