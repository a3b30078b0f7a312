"""Errors raised while finding, downloading or converting a model (their base lives in exo.shared.errors, so the
API catches it without importing this layer)."""

from exo.shared.errors import ExoModelError


class ModelNotFoundError(ExoModelError):
    """The spec names nothing that exists locally or on the hub."""


class InvalidModelIdError(ModelNotFoundError):
    """The spec is not a usable model id (for example it tries to escape the models directory)."""


class ModelLoadError(ExoModelError):
    """The model exists but could not be fetched, verified, converted or loaded."""
