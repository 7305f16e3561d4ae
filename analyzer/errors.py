"""Project exceptions. The CLI turns each into one line and an exit code."""

from __future__ import annotations

from pathlib import Path


class AnalyzerError(Exception):
    """An input problem a user can act on; the message is the whole story."""

    # The one-line errors of every unusable file when the message names only the
    # first (analyze() of inputs none of which could be used); the CLI prints them.
    skipped: tuple[str, ...] | list[str] = ()


class TraceError(AnalyzerError):
    """One trace file is unusable; other ranks can still be analyzed."""

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path.name}: {problem}")

    def __reduce__(self) -> tuple:
        # Exception pickling re-calls the class with ``self.args`` (the one
        # formatted message); rebuild from the two fields instead, so a
        # TraceError raised in a parse worker arrives whole.
        return (type(self), (self.path, self.problem))
