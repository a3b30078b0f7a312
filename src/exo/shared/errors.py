"""Errors the master and the worker raise for conditions their callers must handle.

They say what went wrong in the node's own terms; the API (or any other front end) decides what that means on its
wire, so it imports these and never the classes of the layers that raise them.
"""


class ModelNotLoadedError(Exception):
    """No runner serves the requested model."""


class QueueFullError(Exception):
    """More tasks are waiting for the model than the configured queue limit allows."""


class RunnerUnavailableError(Exception):
    """The model's runner failed and cannot take tasks (for example, its model does not load)."""


class NoMasterError(Exception):
    """No cluster master answered: the task could not be placed (the cluster is electing one, or split)."""


class ExoModelError(Exception):
    """Base for every model-acquisition failure; the message names the model and the reason (the kinds are in
    exo.models.errors)."""


class InstancePlacementError(ValueError):
    """The master cannot place the model; the message names the memory needed and available, or (`code`
    indivisible_heads) the head counts a tensor split cannot divide."""

    def __init__(self, message: str, code: str = "insufficient_memory") -> None:
        super().__init__(message)
        self.code = code


class PeerUnreachableError(Exception):
    """Nothing answered at the endpoint."""


class ClusterSettingsError(ValueError):
    """A cluster flag or EXO_PEERS entry is malformed."""
