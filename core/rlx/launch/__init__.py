"""Launchers place role workers and call them: ``local`` (this process, one device) now;
a Ray launcher places the same workers as actors. Both hand the driver ``RoleGroup``
handles whose calls return futures."""

from rlx.launch.base import RoleGroup
from rlx.launch.local import LocalLauncher

__all__ = ["RoleGroup", "LocalLauncher"]
