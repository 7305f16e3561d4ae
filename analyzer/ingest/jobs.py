"""Trace parsing in worker processes, started before the heavy imports.

On the 2-core development machine importing pandas takes about 1 s, as
long as parsing a 50 MB trace; the CLI therefore starts :class:`ParseJobs`
first and imports pandas while the workers parse. This module imports
neither numpy nor pandas, so that the workers can be forked from a process
that has no threads yet: numpy's import starts OpenBLAS's thread pool, and
a process with threads is only forked when nothing else is possible
(forkserver otherwise, which costs a fresh interpreter per worker). Each
worker imports :mod:`analyzer.ingest.parse` (numpy, msgspec) itself, unless
the parent imported it with OpenBLAS held to one thread, so still without
threads (the console script: analyzer.cli._one_blas_thread).

How workers start (:func:`start_method`, docs/loading.md):

* ``fork`` when this process has a single thread: workers inherit the
  imported modules and never touch ``__main__``.
* ``forkserver`` (``spawn`` where there is none) when it has threads (a
  Streamlit server, or a script that imported numpy): forking a
  multi-threaded process can deadlock on a lock another thread held.
  These workers import the main *script* again, as ``__mp_main__``.
* In-process parsing, one file after the other, when that re-import is not
  safe: ``analyze()`` called from the top level of a script without an
  ``if __name__ == "__main__":`` guard would run the script again in every
  worker, which calls ``analyze()`` again before it has finished
  bootstrapping ("An attempt has been made to start a new process before
  the current process has finished its bootstrapping phase"): the pool
  would restart its dying workers for ever. Also from a daemonic
  process (a worker of the caller's own pool), which may not have children.

Whatever a worker raises, or a worker that dies (killed by the kernel's OOM
killer, say), becomes that file's :class:`~analyzer.errors.TraceError`: one
bad file never ends the analysis of the others.
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import signal
import sys
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Sequence, cast

from analyzer.ingest import limits
from analyzer.errors import TraceError

if TYPE_CHECKING:
    from multiprocessing.context import ForkContext, ForkServerContext, SpawnContext

    from analyzer.ingest.parse import ParsedTrace


def parse_file(path: Path, entry: Path | None) -> ParsedTrace:
    """Parse one file and write its cache entry; anything that goes wrong
    is raised as a TraceError naming the file.

    The body of a parse worker and of an in-process parse. A RecursionError
    or MemoryError from a hostile file (or a bug of ours) is that file's
    problem, reported in one line, not the analysis's.
    """
    from analyzer.ingest.cache import parse_and_store  # in the worker: numpy is imported here, not in the parent

    try:
        return parse_and_store(path, entry)
    except TraceError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure is this file's error line
        raise TraceError(path, f"could not be parsed ({type(exc).__name__}: {_first_line(exc)})") from None


_parse_in_worker = parse_file  # the name earlier versions submitted to the pool

# What a worker does with one file: ``task(path, entry)``. parse_file by default; the CLI passes
# analyzer.engines.parse_and_map (parse, then the rank's whole map) when every file is a rank of its own.
Task = Callable[[Path, "Path | None"], Any]


class ParseJobs:
    """Parsing of several files, started at construction in worker
    processes; :meth:`take` waits for one file's result.

    ``task`` (default :func:`parse_file`) is what each worker runs on one
    file, ``task(path, entry)``; it must be a module-level function (it is
    pickled by name) that raises only TraceError for the file's problems.
    With :func:`analyzer.engines.parse_and_map` a worker also summarizes the
    file's rank, so that the map of many ranks runs in the workers rather
    than one rank after the other in this process (docs/loading.md).

    See the module docstring for how workers start. Forked workers only
    build numpy arrays and Python objects: they never touch Arrow, whose
    thread and memory pools are not fork-safe. Results are taken in any
    order; :meth:`close` stops the workers, also those still parsing a file
    nobody took (after an error, say), so that an early exit does not wait
    for them. When a worker dies, the pool is broken for every file still
    in it: each of those is then parsed again alone, in a process of its
    own, so that only the file that kills its worker is lost.
    """

    def __init__(
        self,
        files: Sequence[Path],
        workers: int | None = None,
        entries: Mapping[Path, Path | None] | None = None,
        task: Task = parse_file,
    ) -> None:
        """``entries``: file -> the cache entry its worker writes after parsing
        (analyzer.cache.TraceCache.entry_for); files without one are not cached."""
        self._entries = {Path(f).absolute(): e for f, e in (entries or {}).items()}
        self.task = task
        # Keyed by absolute path; each task gets the path as the caller named it, so that its
        # results (and error lines) name the file as the analysis does.
        named = {Path(f).absolute(): Path(f) for f in files}
        files = list(named)
        self._named = named
        # path -> its Future, or None: run in-process when taken.
        self._pending: dict[Path, Future | None] = {}
        self._pool: ProcessPoolExecutor | None = None
        self.method = start_method() if files else None
        if not files:
            return
        if self.method is None:
            self._pending = dict.fromkeys(files)
            return
        n = max(1, min(len(files), workers or usable_cpus()))
        # The parse bounds (analyzer/ingest/limits.py) travel in the environment; a
        # forkserver's children have the server's, so hand them over.
        self._pool = ProcessPoolExecutor(
            max_workers=n,
            mp_context=multiprocessing.get_context(self.method),
            initializer=_start_worker,
            initargs=(limits.environment(),),
        )
        for f in files:
            self._pending[f] = self._pool.submit(task, named[f], self._entries.get(f))

    def __contains__(self, path: Path) -> bool:
        return Path(path).absolute() in self._pending

    def take(self, path: Path) -> Any:
        """The task's result for ``path`` (the parsed columns, for parse_file); raises
        TraceError (and only TraceError) for a file that cannot be parsed."""
        path = Path(path).absolute()
        pending = self._pending.pop(path)
        try:
            if pending is None:
                return self.task(self._named[path], self._entries.get(path))
            try:
                return pending.result()
            except BrokenProcessPool:
                return self._alone(path)
            except TraceError:
                raise
            except Exception as exc:  # noqa: BLE001 - a result that could not travel back, say
                raise TraceError(path, f"could not be parsed ({type(exc).__name__}: {_first_line(exc)})") from None
        finally:
            if not self._pending:
                # The last result is in: stop the workers now rather than at
                # the caller's close(), so their memory is not held through
                # the analysis (it would add to the run's peak).
                self.close()

    def _alone(self, path: Path) -> Any:
        """Run the task on ``path`` in a process of its own: after a worker died we do
        not know which file killed it, and this one must not pay for another."""
        # Decided again: since the pool started, this process may have
        # gained threads (pandas' import), so fork may no longer be safe.
        method = start_method()
        named = self._named[path]
        if method is None:
            return self.task(named, self._entries.get(path))
        # typeshed types get_context() of a union of method names as BaseContext, which has
        # no Process; each of the three concrete contexts has one.
        context = cast("ForkContext | ForkServerContext | SpawnContext", multiprocessing.get_context(method))
        receive, send = context.Pipe(duplex=False)
        proc = context.Process(
            target=_parse_to_pipe,
            args=(send, named, self._entries.get(path), limits.environment(), self.task),
            daemon=True,
        )
        proc.start()
        send.close()
        try:
            ok, value = receive.recv()
        except EOFError:  # the process died before sending anything
            proc.join()
            raise TraceError(path, f"the parse worker died ({_exit_reason(proc.exitcode)})") from None
        finally:
            receive.close()
        proc.join()
        if ok:
            return value
        raise value

    def close(self) -> None:
        """Stop the workers now, abandoning files nobody took."""
        pool, self._pool = self._pool, None
        self._pending.clear()
        if pool is None:
            return
        # ProcessPoolExecutor.shutdown waits for running tasks (and Python
        # 3.11 has no terminate_workers()): stop the processes first. SIGKILL,
        # not SIGTERM: a worker blocked writing a result nobody reads (the
        # pool broke while it parsed) must die even if it runs a handler.
        processes = list((getattr(pool, "_processes", None) or {}).values())
        for proc in processes:
            if proc.is_alive():
                proc.kill()
        pool.shutdown(wait=True, cancel_futures=True)
        for proc in processes:
            proc.join()

    def __enter__(self) -> ParseJobs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _start_worker(limits_env: dict[str, str | None] | None) -> None:
    """A worker's first act: the parent's parse bounds, and SIGTERM's default action.

    A forked worker inherits the parent's Python signal handlers (a training
    job's recorder installs one for SIGTERM); under one of those a worker
    would outlive the scheduler's SIGTERM that was meant to end it.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if limits_env is not None:
        limits.use_environment(limits_env)


def _parse_to_pipe(
    conn, path: Path, entry: Path | None, limits_env: dict | None = None, task: Task = parse_file
) -> None:
    _start_worker(limits_env)
    try:
        result = (True, task(path, entry))
    except TraceError as err:
        result = (False, err)
    conn.send(result)
    conn.close()


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory?)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exit status {code}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else "no message"


def usable_cpus() -> int:
    """CPUs this process may run on (affinity and cpusets), not the host's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def start_method() -> Literal["fork", "forkserver", "spawn"] | None:
    """How parse workers start here: "fork", "forkserver" or "spawn", or
    None for parsing in this process (the module docstring says when)."""
    if multiprocessing.current_process().daemon:
        return None  # "daemonic processes are not allowed to have children"
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and _single_threaded():
        return "fork"
    if not main_reimport_safe():
        return None
    return "forkserver" if "forkserver" in methods else "spawn"


def _mp_context() -> multiprocessing.context.BaseContext | None:
    method = start_method()
    return None if method is None else multiprocessing.get_context(method)


def _single_threaded() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        import threading

        return threading.active_count() == 1


def main_reimport_safe() -> bool:
    """True when a forkserver or spawn worker may import ``__main__`` again.

    A worker re-imports the main module when it is a file (``python
    script.py``, ``python -m module``); the REPL, ``python -c`` and notebooks
    have none, so nothing runs again. A file is safe unless we are being
    called from its top-level code outside an ``if __name__ ==
    "__main__":`` block, which the re-import would run again. Found by
    walking this call's frames up to the main module's own and checking
    that frame's current line against the guards in its source.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        return False  # we are that re-import, still bootstrapping
    main = sys.modules.get("__main__")
    if main is None:
        return True
    main_file = getattr(main, "__file__", None)
    if main_file is None:
        return True
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            return _under_main_guard(Path(main_file), frame.f_lineno)
        frame = frame.f_back
    return True  # main's top-level code is not running (it finished, or we are in a thread it started)


def _under_main_guard(source: Path, line: int) -> bool:
    try:
        tree = ast.parse(source.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return False  # cannot tell: assume the worst
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.body:
            if node.body[0].lineno <= line <= (node.body[-1].end_lineno or node.body[-1].lineno):
                return True
    return False


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"``, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1
