"""Where things are: trace files, reftrain run directories, cache folders.

Only the standard library and orjson, so that ``analyzer report`` can find
a cached report, and the CLI can start parsing traces, before numpy or
pandas is imported (analyzer/ingest/jobs.py says why).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Any

import orjson

from analyzer.errors import AnalyzerError
from analyzer.ingest.formats import LEGACY_TRACE_RE, TRACE_WINDOW_DIR_RE

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
    Paths named like traces that cannot be read as one (:func:`scan_trace_files`
    says why) are left out.

    Raises AnalyzerError when the path does not exist or a folder holds no
    trace file; the message points at subfolders that do.
    """
    return scan_trace_files(path)[0]


def scan_trace_files(path: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(trace files, [(path, why it is skipped)]) for ``path``, as
    :func:`find_trace_files` finds them: a FIFO, socket, device, directory,
    symlink loop, broken symlink or unreadable file named like a trace is
    skipped with its reason (opening a FIFO would block for ever).

    Raises AnalyzerError when the path does not exist or a folder holds
    neither trace files nor skipped ones.
    """
    path = Path(path)
    if not path.is_dir():
        reason = unusable_reason(path)
        if reason is None:
            return [path], []
        if not os.path.lexists(path):
            raise AnalyzerError(f"{path}: no such file or directory")
        return [], [(path, reason)]
    if is_run_dir(path):
        # Its run.json is not a trace, and its traces/ may hold several
        # profiler windows per rank: the run-directory reader sorts that out.
        raise AnalyzerError(
            f"{path}: a reftrain run directory; read it with analyzer.rundir.read_run_dir, or pass {path / 'traces'}"
        )
    files: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    for p in path.iterdir():
        if not _is_trace_name(p.name):
            continue
        reason = unusable_reason(p)
        if reason is None:
            files.append(p)
        else:
            skipped.append((p, reason))
    if not files and not skipped:
        windows = [d for d in path.iterdir() if _WINDOW_DIR_RE.match(d.name) and d.is_dir()]
        if len(windows) == 1:
            # A run's traces/ folder with one profiler window (docs/rundir.md): that window.
            return scan_trace_files(windows[0])
        deeper = sorted(p for p in path.rglob("*") if _is_trace_name(p.name) and p.is_file() and not _hidden(p, path))
        hint = f" ({len(deeper)} in subfolders, e.g. {deeper[0].parent}; pass that folder)" if deeper else ""
        raise AnalyzerError(f"{path}: no trace files (*.json, *.json.gz){hint}")
    return sorted(files, key=_natural_key), sorted(skipped, key=lambda s: _natural_key(s[0]))


_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe), not a regular file"),
    (stat.S_ISSOCK, "a socket, not a regular file"),
    (stat.S_ISCHR, "a character device, not a regular file"),
    (stat.S_ISBLK, "a block device, not a regular file"),
    (stat.S_ISDIR, "a directory, not a trace file"),
)


def unusable_reason(path: Path) -> str | None:
    """Why ``path`` cannot be read as a file (None when it can): not a
    regular file (FIFO, socket, device, directory), a symlink loop or a
    broken symlink, or no read permission. Only stats the path: a FIFO is
    never opened."""
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop (too many levels of symbolic links)"
        if exc.errno == errno.ENOENT and os.path.islink(path):
            return f"a broken symlink (to {os.readlink(path)})"
        return f"cannot stat ({exc.strerror or exc})"
    for test, what in _KINDS:
        if test(st.st_mode):
            return what
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if not os.access(path, os.R_OK):
        return "cannot read file: permission denied"
    return None


# --------------------------------------------------------------------------
# What a cache entry's key says about a file


# Bytes hashed at each end of a file for its content fingerprint.
FINGERPRINT_EDGE_BYTES = 1 << 20


def file_key(path: Path, st: os.stat_result | None = None) -> list:
    """What identifies this version of a file, for the cache keys: size,
    mtime and ctime in ns, device and inode, and :func:`content_fingerprint`.

    Size and mtime alone go stale when a file is edited in place and its
    mtime restored (``touch -d``, ``cp -p``, an archive restore, a checkout).
    The ctime cannot be set from user space and moves on every write or
    rename onto the path; the inode changes when a file is replaced; the
    fingerprint covers the content itself where ctime is coarse or the
    file system reuses inodes. docs/loading.md has the cost of each.
    Raises OSError when the file cannot be read.
    """
    st = st or os.stat(path)
    fingerprint = content_fingerprint(path, st.st_size) if stat.S_ISREG(st.st_mode) else ""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_dev, st.st_ino, fingerprint]


def content_fingerprint(path: Path, size: int | None = None) -> str:
    """BLAKE2b (128 bits) of the size, the first and the last
    :data:`FINGERPRINT_EDGE_BYTES` of a regular file (the whole file when it
    is no larger than two of them). Reads at most 2 MiB whatever the size:
    a whole-file hash of a 1 GB trace would cost more than the cache saves
    (figures in docs/loading.md)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size if size is None else size
        h.update(size.to_bytes(8, "little"))
        if size <= 2 * FINGERPRINT_EDGE_BYTES:
            h.update(f.read())
        else:
            h.update(f.read(FINGERPRINT_EDGE_BYTES))
            f.seek(size - FINGERPRINT_EDGE_BYTES)
            h.update(f.read(FINGERPRINT_EDGE_BYTES))
    return h.hexdigest()


def _is_trace_name(name: str) -> bool:
    return not name.startswith(".") and name.endswith(TRACE_SUFFIXES)


def _hidden(p: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in p.relative_to(root).parts)


def _natural_key(p: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p))]


# A run's trace files, both layouts: traces/step{N}/rank{R}.pt.trace.json.gz
# (one folder per profiler window) and, before it, traces/rank{R}.step{N}.json.gz.
RUN_TRACE_PATTERNS = ("traces/*.json*", "traces/*/*.json*")
_OLD_WINDOW_RE = LEGACY_TRACE_RE  # the names' one definition: analyzer.ingest.formats
_WINDOW_DIR_RE = TRACE_WINDOW_DIR_RE


def trace_window(path: Path) -> int | None:
    """The last step of the profiler window a reftrain trace file holds:
    N of ``step{N}/rank{R}.pt.trace.json.gz`` (its folder) or of
    ``rank{R}.step{N}.json.gz`` (the older flat layout); None for any other
    name (a trace not written by reftrain)."""
    path = Path(path)
    m = _OLD_WINDOW_RE.match(path.name)
    if m:
        return int(m.group(1))
    m = _WINDOW_DIR_RE.match(path.parent.name)
    if m and path.name.startswith("rank") and path.name.endswith(TRACE_SUFFIXES):
        return int(m.group(1))
    return None


def run_trace_files(run_dir: Path) -> list[Path]:
    """The trace files of a reftrain run directory: the manifest's
    ``files.traces``, else what :data:`RUN_TRACE_PATTERNS` find (absolute
    paths, as the run-directory reader gives them)."""
    run_dir = Path(run_dir)
    try:
        listed = orjson.loads((run_dir / MANIFEST).read_bytes()).get("files", {}).get("traces")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        listed = None
    # Missing listed files are the run-directory reader's to report.
    return [(run_dir / rel).absolute() for rel in listed_or_found(run_dir, listed, RUN_TRACE_PATTERNS, [])]


def listed_or_found(root: Path, listed: object, pattern: str | tuple[str, ...], errors: list[str]) -> list[str]:
    """The manifest's list of a family's files (relative paths); when it
    lists none (a run still running, or one that failed early), what is on
    disk. Listed files that do not exist are reported. Paths that exist but
    are not readable files (a FIFO, a symlink loop) are kept, so that their
    reader reports why it skips them (:func:`unusable_reason`)."""
    if isinstance(listed, list) and listed:
        out = []
        for rel in listed:
            if os.path.lexists(root / str(rel)):
                out.append(str(rel))
            else:
                errors.append(f"{rel}: listed in {MANIFEST} but missing")
        return out
    patterns = (pattern,) if isinstance(pattern, str) else pattern
    found = {
        str(p.relative_to(root)) for pat in patterns for p in root.glob(pat) if not p.is_dir() and not _hidden(p, root)
    }
    return sorted(found, key=lambda rel: _natural_key(Path(rel)))


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


# CUDA/HIP graph capture traces beside a replay trace, in TraceLens's layout (analyzer.ingest.graph_capture).
CAPTURE_DIR = "capture_traces"
DETAILS_FILE = "execution_details.json"


def capture_folder(trace: Path) -> Path | None:
    """The ``capture_traces/`` folder beside ``trace`` when it holds an ``execution_details.json``."""
    folder = Path(trace).parent / CAPTURE_DIR
    return folder if (folder / DETAILS_FILE).is_file() else None


def capture_fingerprint(traces_folder: Path) -> list[list[Any]]:
    """[name, size, mtime_ns] of every file in the capture folder of the traces in ``traces_folder`` ([]
    without one): what a cache of results derived from those traces must also key on."""
    folder = Path(traces_folder) / CAPTURE_DIR
    if not (folder / DETAILS_FILE).is_file():
        return []
    out: list[list[Any]] = []
    for p in sorted(folder.iterdir()):
        with contextlib.suppress(OSError):
            st = p.stat()
            out.append([p.name, st.st_size, st.st_mtime_ns])
    return out
