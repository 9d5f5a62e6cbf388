"""The error every configuration check raises (torch-free, so any config module can import it)."""


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key to change."""
