"""The error every part of preprocessing raises for input or settings it cannot use."""


class PreprocessError(ValueError):
    """A one-line, user-facing reason why preprocessing cannot run."""
