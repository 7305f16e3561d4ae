"""Project exceptions for the trainer: the CLI prints the message as one line."""


class ReftrainError(Exception):
    """A user-actionable problem (bad config, missing data file, ...)."""
