"""The configuration error, in a module of its own so torch-free config modules can share it.

`distributed_spec.config` re-exports it; the CLI turns it into one line and exit code 2.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key to change."""


def require(ok: bool, message: str) -> None:
    """Raise ConfigError(message) unless ok."""
    if not ok:
        raise ConfigError(message)
