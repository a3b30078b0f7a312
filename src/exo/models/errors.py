"""Errors raised while finding, downloading or converting a model."""


class ExoModelError(Exception):
    """Base for every model-acquisition failure; the message names the model and the reason."""


class ModelNotFoundError(ExoModelError):
    """The spec names nothing that exists locally or on the hub."""


class InvalidModelIdError(ModelNotFoundError):
    """The spec is not a usable model id (for example it tries to escape the models directory)."""


class ModelLoadError(ExoModelError):
    """The model exists but could not be fetched, verified, converted or loaded."""
