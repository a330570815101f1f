"""ROSE's exceptions. Hosts map them to their own error codes once."""


class RoseError(Exception):
    """Base class for every error ROSE raises on purpose."""


class ModelLoadError(RoseError):
    """The model directory is missing, malformed, or not supported."""


class InvalidBatchError(RoseError, ValueError):
    """A batch the engine cannot run (bad ids, lengths, or output kind)."""
