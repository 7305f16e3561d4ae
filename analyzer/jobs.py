"""Trace parsing in worker processes, started before the heavy imports.

On the 2-core development machine importing pandas takes about 1 s, as
long as parsing a 50 MB trace; the CLI therefore starts :class:`ParseJobs`
first and imports pandas while the workers parse. This module imports
neither numpy nor pandas, so that the workers can be forked from a process
that has no threads yet: numpy's import starts OpenBLAS's thread pool, and
a process with threads is only forked when nothing else is possible
(forkserver otherwise, which costs a fresh interpreter per worker). Each
worker imports :mod:`analyzer.parse` (numpy, msgspec) itself.
"""
from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from analyzer.parse import ParsedTrace


def _parse_in_worker(path: Path, entry: Path | None) -> ParsedTrace:
    """Worker body: parse one file and write its cache entry (a TraceError travels back pickled)."""
    from analyzer.cache import parse_and_store  # in the worker: numpy is imported here, not in the parent

    return parse_and_store(path, entry)


class ParseJobs:
    """Parsing of several files, started at construction in worker
    processes; :meth:`take` waits for one file's result.

    Workers are forked when this process has a single thread (fast: they
    inherit the imported modules), else started with forkserver, since
    forking a multi-threaded process (a Streamlit server, say) can
    deadlock. Forked workers only build numpy arrays and Python objects:
    they never touch Arrow, whose thread and memory pools are not
    fork-safe. Results are taken in any order; :meth:`close` stops the
    workers, also those still parsing a file nobody took (after an error,
    say), so that an early exit does not wait for them.
    """

    def __init__(
        self, files: Sequence[Path], workers: int | None = None, entries: Mapping[Path, Path | None] | None = None
    ) -> None:
        """``entries``: file -> the cache entry its worker writes after parsing
        (analyzer.cache.TraceCache.entry_for); files without one are not cached."""
        self._pending: dict[Path, Any] = {}
        entry_of = {Path(f).absolute(): e for f, e in (entries or {}).items()}
        files = list(dict.fromkeys(Path(f).absolute() for f in files))
        self._pool = None
        if not files:
            return
        n = max(1, min(len(files), workers or usable_cpus()))
        self._pool = _mp_context().Pool(processes=n)
        for f in files:
            self._pending[f] = self._pool.apply_async(_parse_in_worker, (f, entry_of.get(f)))

    def __contains__(self, path: Path) -> bool:
        return Path(path).absolute() in self._pending

    def take(self, path: Path) -> ParsedTrace:
        """The parsed columns of ``path``; raises TraceError as parse_columns does."""
        pending = self._pending.pop(Path(path).absolute())
        try:
            return pending.get()
        finally:
            if not self._pending:
                # The last result is in: stop the workers now rather than at
                # the caller's close(), so their memory is not held through
                # the analysis (it would add to the run's peak).
                self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
            self._pending.clear()

    def __enter__(self) -> ParseJobs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def usable_cpus() -> int:
    """CPUs this process may run on (affinity and cpusets), not the host's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _mp_context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and _single_threaded():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _single_threaded() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        import threading

        return threading.active_count() == 1
