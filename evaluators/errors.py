"""Errors of the evaluators. They do not import the engine (layers point one way); the engine turns a
:class:`SuiteError` into its own user-facing error."""


class SuiteError(Exception):
    """A suite evaluation cannot run as asked (unknown suite/backend, missing model, no server...)."""
