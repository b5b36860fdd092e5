"""Built-in synthetic tasks (placeholder registration; filled in by the data work)."""
from rlx.hookspecs import hookimpl


@hookimpl
def register_tasks(register):
    pass
