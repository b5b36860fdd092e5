"""Every error rlx raises on purpose, in one leaf module that imports nothing of rlx.

Each names what was wrong (the file, row, key, path or plugin), so a run stops with one
clear line instead of a traceback. The modules that raise them re-export their own
(``rlx.config.ConfigError`` is ``rlx.errors.ConfigError``).
"""


class RlxError(Exception):
    """Base of the errors below: what ``rlx train`` reports as one line."""


class ConfigError(RlxError, ValueError):
    """A config key or value is wrong; the message names the key."""


class DataError(RlxError, ValueError):
    """Bad data: the message names the source, the row and the key."""


class ModelError(RlxError, RuntimeError):
    """A model or tokenizer could not be loaded or built; the message names the path."""


class PluginError(RlxError):
    """A plugin failed to import or to register; the message names the plugin."""


class RegistryError(RlxError):
    """A component name is unknown or registered twice; the message names the providers."""


class RewardError(RlxError):
    """A reward function or model failed or returned something unusable; the message names it."""


class RunError(RlxError):
    """A run cannot start or continue (output folder, resume, a missing part)."""
