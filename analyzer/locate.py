"""Where things are: trace files, reftrain run directories, cache folders.

Only the standard library and orjson, so that ``analyzer report`` can find
a cached report, and the CLI can start parsing traces, before numpy or
pandas is imported (analyzer/jobs.py says why).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import orjson

from analyzer.errors import AnalyzerError

MANIFEST = "run.json"
CACHE_DIRNAME = ".analyzer-cache"
TRACE_SUFFIXES = (".json", ".json.gz")


def is_run_dir(path: Path) -> bool:
    """True when ``path`` is a folder with a ``run.json`` whose schema is
    ``reftrain.run/*``, or whose run.json cannot be parsed (so that the
    run-directory reader reports the problem instead of the folder being
    taken for a folder of traces)."""
    manifest = Path(path) / MANIFEST
    if not manifest.is_file():
        return False
    try:
        data = orjson.loads(manifest.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return True
    return isinstance(data, dict) and str(data.get("schema", "")).startswith("reftrain.run/")


def usable_cache_dir(folder: Path) -> bool:
    """True when ``folder`` exists or can be created, and can be written.

    A folder (or, before it exists, its nearest existing ancestor) without
    any write permission bit counts as read-only even for root, whom the
    kernel lets write anywhere: a trace collection marked read-only (the
    shared HTA samples, say) is not the place for our cache files.
    """
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is None or not existing.stat().st_mode & 0o222:
        return False
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK | os.X_OK)


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/trainperf``, default ``~/.cache/trainperf``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainperf"


def find_trace_files(path: Path) -> list[Path]:
    """Trace files named by ``path``: the file itself, or the ``*.json`` and
    ``*.json.gz`` files directly inside a folder (one level, like HTA;
    hidden files skipped), in natural order (``rank2`` before ``rank10``).

    Raises AnalyzerError when the path does not exist or a folder holds no
    trace file; the message points at subfolders that do.
    """
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.exists():
        raise AnalyzerError(f"{path}: no such file or directory")
    if not path.is_dir():
        raise AnalyzerError(f"{path}: not a file or directory")
    if is_run_dir(path):
        # Its run.json is not a trace, and its traces/ may hold several
        # profiler windows per rank: the run-directory reader sorts that out.
        raise AnalyzerError(
            f"{path}: a reftrain run directory; read it with analyzer.rundir.read_run_dir, or pass {path / 'traces'}"
        )
    files = [p for p in path.iterdir() if _is_trace_name(p.name) and p.is_file()]
    if not files:
        deeper = sorted(p for p in path.rglob("*") if _is_trace_name(p.name) and p.is_file() and not _hidden(p, path))
        hint = f" ({len(deeper)} in subfolders, e.g. {deeper[0].parent}; pass that folder)" if deeper else ""
        raise AnalyzerError(f"{path}: no trace files (*.json, *.json.gz){hint}")
    return sorted(files, key=_natural_key)


def _is_trace_name(name: str) -> bool:
    return not name.startswith(".") and name.endswith(TRACE_SUFFIXES)


def _hidden(p: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in p.relative_to(root).parts)


def _natural_key(p: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p))]


def run_trace_files(run_dir: Path) -> list[Path]:
    """The trace files of a reftrain run directory: the manifest's
    ``files.traces``, else ``traces/*.json*`` (absolute paths, as the
    run-directory reader gives them)."""
    run_dir = Path(run_dir)
    try:
        listed = orjson.loads((run_dir / MANIFEST).read_bytes()).get("files", {}).get("traces")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        listed = None
    # Missing listed files are the run-directory reader's to report.
    return [(run_dir / rel).absolute() for rel in listed_or_found(run_dir, listed, "traces/*.json*", [])]


def listed_or_found(root: Path, listed: object, pattern: str, errors: list[str]) -> list[str]:
    """The manifest's list of a family's files (relative paths); when it
    lists none (a run still running, or one that failed early), what is on
    disk. Listed files that do not exist are reported."""
    if isinstance(listed, list) and listed:
        out = []
        for rel in listed:
            if (root / str(rel)).is_file():
                out.append(str(rel))
            else:
                errors.append(f"{rel}: listed in {MANIFEST} but missing")
        return out
    return sorted((str(p.relative_to(root)) for p in root.glob(pattern) if p.is_file()), key=lambda rel: _natural_key(Path(rel)))


def trace_files_of(path: Path) -> list[Path]:
    """Every trace file an analysis of ``path`` reads (a run directory, a
    folder of traces, or one file); [] when there is none or the path is
    unusable (the analysis itself reports why)."""
    path = Path(path)
    try:
        if path.is_dir() and is_run_dir(path):
            return run_trace_files(path)
        return find_trace_files(path)
    except (AnalyzerError, OSError):
        return []
