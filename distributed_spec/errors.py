"""The package's configuration error, in a module that imports nothing (every layer may raise it)."""


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key to change."""
