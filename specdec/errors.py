"""User-facing errors: each carries one line that the CLI and the server show as is."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none), for one-line errors."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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


class ConstraintError(SpecdecError):
    """A structured-output constraint that cannot go on with this model's tokenizer: the matcher refused a token its
    own mask allowed (a text that needs a byte the vocabulary has no token for). It ends that request alone."""
