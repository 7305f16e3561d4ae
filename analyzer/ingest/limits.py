"""Bounds on what reading one trace file may cost (docs/loading.md, "Bounds").

A trace is read as a stream, so memory does not grow with a legitimate
trace's size; these bounds stop the inputs that a stream alone cannot: a
small gzip file that inflates to terabytes, and one JSON value (a string, an
event) so long that holding it is the problem. A file over a bound is one
``skipped:`` line naming the bound and the option that raises it.

Pure Python, no numpy: the CLI sets the bounds before it starts the parse
workers. They travel to the workers in the environment
(``TRAINPERF_MAX_*``), which forked, forkserver and spawned processes all
inherit, so every process that parses a file applies the same bounds
without each caller threading them through.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

_GIB = 1 << 30
_MIB = 1 << 20


@dataclass(frozen=True)
class ParseLimits:
    """Per-file bounds of :func:`analyzer.ingest.parse.parse_columns`.

    ``max_gzip_ratio``: decompressed bytes per compressed byte of a gzip
    file; real Kineto traces compress 8-25x (trace_diff/control: 19x), so
    64 leaves room. Files below ``gzip_floor_bytes`` of decompressed text
    are never stopped by the ratio (a tiny synthetic trace may compress
    better; 64 MiB inflate in well under a second). ``max_json_bytes``: the
    ceiling on any file's JSON text, compressed or not (CLI
    ``--max-json-gb``). ``max_event_bytes``: the longest piece of JSON the
    reader must hold whole: one element of ``traceEvents`` (with its
    strings), or the top-level keys before it (CLI ``--max-event-mb``).
    Kineto's largest events are a few KB.
    """

    max_gzip_ratio: float = 64.0
    gzip_floor_bytes: int = 64 * _MIB
    max_json_bytes: int = 32 * _GIB
    max_event_bytes: int = 64 * _MIB

    def max_decompressed(self, compressed_bytes: int) -> int:
        """Bound on the JSON text of a gzip file of ``compressed_bytes``."""
        by_ratio = max(int(self.max_gzip_ratio * compressed_bytes), self.gzip_floor_bytes)
        return min(by_ratio, self.max_json_bytes)


_ENV = {f.name: "TRAINPERF_" + f.name.upper() for f in fields(ParseLimits)}
# The flag (or option) that raises each bound, named in the skipped line.
FLAGS = {
    "max_gzip_ratio": "--max-gzip-ratio",
    "max_json_bytes": "--max-json-gb",
    "max_event_bytes": "--max-event-mb",
}


def current() -> ParseLimits:
    """The bounds in force: the environment's ``TRAINPERF_MAX_*`` values
    (set by :func:`apply`), else the defaults. A value that does not parse
    falls back to its default."""
    values = {}
    default = ParseLimits()
    for name, var in _ENV.items():
        text = os.environ.get(var)
        if text is None:
            continue
        kind = type(getattr(default, name))
        try:
            value = kind(float(text)) if kind is int else kind(text)
        except ValueError:
            continue
        if value > 0:
            values[name] = value
    return ParseLimits(**values)


def apply(limits: ParseLimits) -> None:
    """Make ``limits`` the bounds of this process and of every parse worker
    it starts from now on (through the environment)."""
    for name, var in _ENV.items():
        os.environ[var] = repr(getattr(limits, name))


def from_options(
    max_gzip_ratio: float | None = None, max_json_gb: float | None = None, max_event_mb: float | None = None
) -> ParseLimits:
    """The defaults with the CLI's options applied (None keeps a default)."""
    base = ParseLimits()
    return ParseLimits(
        max_gzip_ratio=base.max_gzip_ratio if max_gzip_ratio is None else float(max_gzip_ratio),
        gzip_floor_bytes=base.gzip_floor_bytes,
        max_json_bytes=base.max_json_bytes if max_json_gb is None else int(max_json_gb * _GIB),
        max_event_bytes=base.max_event_bytes if max_event_mb is None else int(max_event_mb * _MIB),
    )


def environment() -> dict[str, str | None]:
    """This process's ``TRAINPERF_MAX_*`` settings (None: unset), for a
    worker started from a forkserver, whose environment is the server's,
    taken when it started (:func:`use_environment` in the worker)."""
    return {var: os.environ.get(var) for var in _ENV.values()}


def use_environment(env: dict[str, str | None]) -> None:
    """Adopt the settings :func:`environment` returned in the parent."""
    for var, value in env.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
