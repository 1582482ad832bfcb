"""The one error a checkpoint raises: it could not be found, read or understood."""


class ModelLoadError(RuntimeError):
    """A checkpoint could not be found, read or understood; the message says what is missing."""
