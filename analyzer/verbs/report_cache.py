"""Finished reports of ``analyzer report``, so an unchanged run is answered
without analyzing it again.

The Parquet cache (:mod:`analyzer.ingest.cache`) skips the JSON parse, but an
analysis still imports pandas (about 1 s on a 2-core machine) and computes
every metric. When nothing the report depends on has changed, this cache
replays the previous report instead: its text, its stderr lines (skipped
files, warnings) and its JSON document, whose ``generator.created_at`` is
stamped anew. Nothing here imports pandas.

What the key covers (any change gives a new key, so a stale entry is
never read):

* the input: for every file an analysis of the path can read, its path
  relative to the input and its :func:`~analyzer.locate.file_key` (size,
  mtime and ctime in ns, device, inode, BLAKE2 of the first and last MiB),
  so an edit in place with the mtime set back is a miss. A reftrain run directory is
  walked recursively (manifest, metrics, collectives, telemetry, traces);
  a folder of traces contributes its top-level files; hidden folders (the
  caches themselves) are left out;
* the code: size, mtime, ctime and inode of every ``.py`` file of the ``analyzer`` and
  ``reftrain`` packages (analyzer reads reftrain's FLOP and peak tables),
  the Python version and :data:`REPORT_CACHE_VERSION`;
* the options that change the output: ``--peak-flops``, ``--top``, the limits and
  ``--critical-path`` (set by ``--critical-path-trace`` too): a report with
  the critical paths and one without are two entries (the newer replaces the
  older, as for any key change).

Where: ``.analyzer-cache/`` inside the input folder (beside the input file)
when writable, else the user cache folder (``$XDG_CACHE_HOME/trainperf``).
One file per input, ``report.<path hash>.<key hash>.json``; writing a new
entry deletes the input's older ones. An unreadable entry is ignored (and
overwritten by the next report).
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence, cast

import orjson

from analyzer.ingest.formats import REPORT_TOP_LEVEL, ReportDocument

from analyzer.ingest.locate import (
    CACHE_DIRNAME,
    CAPTURE_DIR,
    capture_fingerprint,
    file_key,
    is_run_dir,
    usable_cache_dir,
    user_cache_dir,
)

# Bump when the entry's layout changes.
REPORT_CACHE_VERSION = 2  # 2: inputs keyed on file_key (ctime, inode, fingerprint)
_CODE_PACKAGES = ("analyzer", "reftrain")


@dataclass
class CachedReport:
    """What ``analyzer report`` printed and wrote for one run."""

    text: str
    messages: list[tuple[str, str]]  # (kind, message) lines for stderr, in order
    document: ReportDocument  # the --json report

    def stamped_document(self) -> ReportDocument:
        """The JSON report with ``generator.created_at`` set to now."""
        doc = self.document.copy()
        # read() keeps only documents with this top level, generator included
        doc["generator"] = {**doc["generator"], "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        return doc


def entry_path(path: Path, options: dict[str, Any], outputs: Sequence[Path] = ()) -> Path | None:
    """Where the report of ``path`` with ``options`` is (or would be)
    cached; None when the input cannot be read or nothing is writable.

    ``outputs`` (the --json/--html files) are left out of the input's
    files: a report written into the run directory must not make its own
    next run a miss."""
    path = Path(path).absolute()
    skip = {Path(o).absolute() for o in outputs}
    try:
        inputs = _input_fingerprint(path, skip)
    except OSError:
        return None
    folder = _folder_for(path)
    if folder is None:
        return None
    key = orjson.dumps(
        {
            "version": REPORT_CACHE_VERSION,
            "python": sys.version,
            "code": _code_fingerprint(),
            "inputs": inputs,
            "options": options,
        },
        option=orjson.OPT_SORT_KEYS,
    )
    path_hash = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    key_hash = hashlib.sha1(key).hexdigest()[:16]
    return folder / f"report.{path_hash}.{key_hash}.json"


def read(entry: Path) -> CachedReport | None:
    """The cached report, or None when there is none or it is unusable."""
    try:
        data = orjson.loads(entry.read_bytes())
        document = data["document"]
        # A document of another top level (an older analyzer's) is not this report.
        if not isinstance(document, dict) or tuple(document) != REPORT_TOP_LEVEL:
            return None
        return CachedReport(
            text=str(data["text"]),
            messages=[(str(k), str(m)) for k, m in data["messages"]],
            document=cast(ReportDocument, document),
        )
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def write(entry: Path, report: CachedReport) -> None:
    """Write atomically and delete the input's older entries; a folder
    that turns out unwritable only costs the next run its shortcut."""
    payload = orjson.dumps(
        {"text": report.text, "messages": report.messages, "document": report.document},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(payload)
        os.replace(tmp, entry)
    except OSError:
        tmp.unlink(missing_ok=True)
        return
    prefix = entry.name.rsplit(".", 2)[0]  # report.<path hash>
    for old in entry.parent.glob(f"{prefix}.*.json"):
        if old != entry:
            old.unlink(missing_ok=True)


def _folder_for(path: Path) -> Path | None:
    base = path if path.is_dir() else path.parent
    return next((f for f in (base / CACHE_DIRNAME, user_cache_dir()) if usable_cache_dir(f)), None)


def _input_fingerprint(path: Path, skip: set[Path]) -> list[list]:
    """[relative path, *file_key] of every file the analysis may read (with the
    ``capture_traces/`` beside the traces: analyzer.ingest.graph_capture)."""
    captures = [[CAPTURE_DIR, *c] for c in capture_fingerprint(path if path.is_dir() else path.parent)]
    if not path.is_dir():
        return [[path.name, *file_key(path)], *captures]
    out: list[list] = captures
    if is_run_dir(path):
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files):
                if Path(root, name) not in skip:
                    _add(out, Path(root) / name, path)
    else:
        with os.scandir(path) as it:  # capture_traces/ is in ``captures`` above
            for e in sorted(it, key=lambda e: e.name):
                if not e.name.startswith(".") and not e.is_dir() and Path(e.path) not in skip:
                    _add(out, Path(e.path), path)
    return out


def _add(out: list[list], file: Path, root: Path, content: bool = True) -> None:
    try:
        st = os.stat(file)
        # file_key reads only regular files (a FIFO is never opened).
        key = file_key(file, st) if content else [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    except OSError as exc:
        # Deleted while we walked: the analysis will not see it either. A
        # symlink loop or unreadable file: its reason, which the analysis reports.
        if os.path.lexists(file):
            out.append([str(file.relative_to(root)), f"unreadable: {exc.strerror or exc}"])
        return
    out.append([str(file.relative_to(root)), *key])


_code: list[list] | None = None


def _code_fingerprint() -> list[list]:
    global _code
    if _code is None:
        here = Path(__file__).resolve().parent.parent
        found: list[list] = []
        for package in _CODE_PACKAGES:
            for root, dirs, files in os.walk(here / package):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                for name in sorted(files):
                    if name.endswith(".py"):
                        # Stat only: reading ~100 source files on every report would cost more than it guards.
                        _add(found, Path(root) / name, here, content=False)
        _code = found
    return _code
