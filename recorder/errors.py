"""The recorder's exception: the message is one line a user can act on."""


class RecorderError(Exception):
    """A user-actionable problem (a file that cannot be written, a step marked twice, ...)."""
