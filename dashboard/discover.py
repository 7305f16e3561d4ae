"""Find the runs below RUNS_DIR and resolve run names safely.

A *run* is either a reftrain run directory (``run.json``; or the reftrain
layout without its manifest, listed so that the missing manifest shows as
that run's error) or a *trace folder*: a folder holding PyTorch profiler
(Kineto) traces, ``*.json`` / ``*.json.gz``, as HTA reads them. Runs are
looked for in RUNS_DIR itself and two levels below it; a run's own
subfolders are not searched again.

Run names are paths relative to RUNS_DIR in POSIX form (``"."`` for RUNS_DIR
itself). A name coming from a URL is only accepted if it is one of the
discovered names and resolves below RUNS_DIR: nothing else is ever read.
Whether a path lies below RUNS_DIR is :func:`dashboard.boundary.inside`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from dashboard.boundary import inside, run_refusal

MANIFEST = "run.json"
TRACE_SUFFIXES = (".json", ".json.gz")
# Subfolders of a reftrain run whose presence marks one even without run.json.
REFTRAIN_SUBDIRS = ("metrics", "traces", "collectives")
# Files below a run that matter for its analysis (cache fingerprint); the
# checkpoints folder can be large and never changes an analysis.
_FINGERPRINT_SKIP = frozenset({"checkpoints"})
MAX_DEPTH = 2

RunKind = Literal["reftrain", "traces"]


class RunLookupError(Exception):
    """A run name that is not a run below RUNS_DIR (the message says why)."""


@dataclass(frozen=True)
class RunEntry:
    """One run found below RUNS_DIR."""

    name: str
    path: Path  # absolute, symlinks resolved
    kind: RunKind
    root: Path  # RUNS_DIR, resolved: the boundary of everything read for this run

    def refusal(self) -> str | None:
        """One line saying why nothing of this run is read (a path below it links outside RUNS_DIR), or None."""
        return run_refusal(self.root, self.path, self.name)


def _is_trace_file(entry: os.DirEntry) -> bool:
    return entry.name != MANIFEST and entry.name.endswith(TRACE_SUFFIXES) and entry.is_file()


def classify_dir(path: Path) -> RunKind | None:
    """What kind of run `path` is, or None when it is not a run."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return None
    names = {e.name for e in entries}
    if MANIFEST in names:
        return "reftrain"
    if any(e.name in REFTRAIN_SUBDIRS and e.is_dir() for e in entries):
        return "reftrain"
    if any(_is_trace_file(e) for e in entries):
        return "traces"
    return None


def discover_runs(runs_dir: Path) -> list[RunEntry]:
    """Every run in `runs_dir` (itself, and up to two levels below), by name.

    Hidden folders (``.name``) are skipped, as are folders whose real path
    lies outside `runs_dir` (a symlink out of it).
    """
    root = runs_dir.resolve()
    found: dict[str, RunEntry] = {}

    def visit(path: Path, depth: int) -> None:
        kind = classify_dir(path)
        if kind is not None:
            rel = path.relative_to(root).as_posix() if path != root else "."
            found.setdefault(rel, RunEntry(name=rel, path=path, kind=kind, root=root))
            return
        if depth >= MAX_DEPTH:
            return
        try:
            children = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError:
            return
        for child in children:
            if child.name.startswith(".") or not child.is_dir():
                continue
            if not inside(root, Path(child.path)):
                continue
            real = Path(child.path).resolve()
            if real == root:
                continue
            visit(real, depth + 1)

    visit(root, 0)
    return [found[name] for name in sorted(found)]


def check_run_name(name: str) -> None:
    """Refuse names that could point outside RUNS_DIR, before any lookup."""
    if not name or "\x00" in name or "\\" in name:
        raise RunLookupError(f"run name {name!r} refused: empty or contains a forbidden character")
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts:
        raise RunLookupError(f"run name {name!r} refused: it must be a folder below the runs directory")


def resolve_run(runs: list[RunEntry], root: Path, name: str) -> RunEntry:
    """The discovered run called `name`, after checking it stays below `root`."""
    check_run_name(name)
    for run in runs:
        if run.name == name:
            if not inside(root, run.path):
                raise RunLookupError(f"run name {name!r} refused: it resolves outside the runs directory")
            return run
    raise RunLookupError(f"no run named {name!r} in {root}")


def safe_file(root: Path, path: Path) -> Path:
    """`path` with symlinks resolved, if it is a regular file below `root`."""
    if not inside(root, path) or not path.resolve().is_file():
        raise RunLookupError(f"{path.name}: not a file below the runs directory")
    return path.resolve()


def fingerprint(run: RunEntry) -> tuple[tuple[str, int, int], ...]:
    """(relative path, size, mtime_ns) of the files that make up `run`.

    The cache key of everything parsed from a run: any file added, removed,
    rewritten or touched changes it. Looks two levels deep, skipping
    checkpoints and hidden folders (the analyzer's own caches live there).
    """
    items: list[tuple[str, int, int]] = []

    def walk(path: Path, depth: int) -> None:
        try:
            entries = list(os.scandir(path))
        except OSError:
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_symlink() and not inside(run.root, Path(entry.path)):
                continue  # never read; a run holding one is refused (RunEntry.refusal)
            if entry.is_dir():
                if depth < 1 and entry.name not in _FINGERPRINT_SKIP:
                    walk(Path(entry.path), depth + 1)
            elif entry.is_file():
                st = entry.stat()
                items.append((Path(entry.path).relative_to(run.path).as_posix(), st.st_size, st.st_mtime_ns))

    walk(run.path, 0)
    return tuple(sorted(items))


def trace_files(run: RunEntry) -> list[Path]:
    """The run's Kineto trace files whose real path lies below RUNS_DIR: a reftrain run's as the
    analyzer finds them (``traces/`` and ``traces/step{N}/``, docs/rundir.md), else the folder's own."""
    from analyzer.ingest.locate import run_trace_files

    if run.refusal() is not None:  # a path in it leads outside RUNS_DIR: read nothing of it, run.json included
        return []
    if run.kind == "reftrain":
        found = [p for p in run_trace_files(run.path) if p.name.endswith(TRACE_SUFFIXES)]
    else:
        try:
            found = [Path(e.path) for e in sorted(os.scandir(run.path), key=lambda e: e.name) if _is_trace_file(e)]
        except OSError:
            return []
    return [p for p in found if inside(run.root, p) and p.is_file()]
