"""Project exceptions for the trainer: the CLI prints the message as one line."""

from recorder.errors import RecorderError

# One class for the trainer and the recorder it writes its runs with, so the CLI's one
# `except` turns either's problem into one line.
ReftrainError = RecorderError
