"""Errors the engine raises for bad input; the CLI prints them as one clear line and exits non-zero."""


class PoiseError(Exception):
    """Base class: a user-facing error with a one-line message."""


class ConfigError(PoiseError):
    """poise.toml is malformed or holds an unknown / invalid setting."""


class ArchiveError(PoiseError):
    """The archive cannot do what was asked (unknown node, existing name, not an archive...)."""


class EditError(PoiseError):
    """An edit of algorithm.py is rejected (syntax error, interface dropped or re-signed...)."""


class EvaluationError(PoiseError):
    """The evaluation could not run (unknown backend or preset, the proxy's warm start failed...)."""
