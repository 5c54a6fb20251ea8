"""User-facing errors: each carries one line that the CLI and the server show as is."""


class SpecdecError(Exception):
    """Base class for errors caused by the user's input or environment, not by a bug."""


class ConfigError(SpecdecError, ValueError):
    """An option is out of range or options contradict each other."""


class ModelLoadError(SpecdecError):
    """A model could not be found, fetched or loaded."""


class IncompatibleDraftError(SpecdecError):
    """The draft cannot speculate for this target (different tokenizer or vocabulary)."""


class ContextLengthError(SpecdecError, ValueError):
    """The prompt plus the requested tokens do not fit the model's context."""
