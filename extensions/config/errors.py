"""The config's exceptions, in a module of their own so that the sections, the loader and the
command-line flags can all raise them without importing one another."""
from __future__ import annotations


class ConfigError(ValueError):
    """A config file or override that does not match the typed config."""


class ConfigHelpRequested(Exception):
    """``--set SECTION.help``: not an error; ``str(exc)`` is the text to print."""
