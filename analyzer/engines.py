"""Where the per-rank map runs: ``local`` (this machine's worker pool) or ``ray``.

:func:`run_map` applies :func:`analyzer.rankmap.map_unit` to every unit and
returns the results in the units' order, calling ``done(unit)`` as each
unit's result arrives (in that order: the caller's progress count); both
engines return the same
:class:`~analyzer.rankmap.UnitResult` objects, so the report does not
depend on the engine (docs/loading.md, "Engines").

``local`` (the default): worker processes when the inputs are worth it
(more than one unit and at least :data:`PARALLEL_MIN_BYTES` of trace
files), started as :func:`analyzer.ingest.jobs.start_method` says (fork in
a single-threaded process; forkserver, with the map module preloaded, when
this process has threads); else in this process, one unit after the other.
A worker that dies (the OOM killer, say) costs only its unit: that unit is
run again alone in a fresh process, and if that dies too its files become
one error line each.

``ray``: one Ray task per unit. ``address`` None starts a local Ray instance
with this machine's cores (``ray.init(num_cpus=os.cpu_count(),
include_dashboard=False)``); ``"auto"`` joins the cluster this machine
belongs to, ``"ray://HOST:PORT"`` a remote one through Ray Client. Tasks
read the traces by path, so the nodes must see the same files (a shared
filesystem) and have this package installed. Ray is an optional extra
(``pip install 'trainperf[ray]'``); without it ``engine="ray"`` is one
AnalyzerError line.
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, Sequence

from analyzer.errors import AnalyzerError, TraceError
from analyzer.ingest import limits
from analyzer.ingest.jobs import start_method, usable_cpus

if TYPE_CHECKING:
    from analyzer.rankmap import MapUnit, UnitResult

# The map's modules (pandas and every metric) are imported where a map runs, not here: the CLI
# imports this module for parse_and_map before it starts its parse workers, and those are forked
# while the process has no threads yet (analyzer.ingest.jobs), which importing pandas would end.

Engine = Literal["local", "ray"]
ENGINES: tuple[str, ...] = ("local", "ray")
# Below this much trace data, starting worker processes costs more than it
# saves (a process start plus imports is ~0.2-1 s); as analyzer.ingest.load.
PARALLEL_MIN_BYTES = 8 << 20


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


Done = Callable[["MapUnit"], None]


def _ignore(unit: MapUnit) -> None:
    return None


def run_map(
    units: Sequence[MapUnit],
    engine: str = "local",
    *,
    ray_address: str | None = None,
    workers: int | None = None,
    done: Done | None = None,
) -> list[UnitResult]:
    """``map_unit`` of each unit, in order; ``done(unit)`` after each (module docstring)."""
    if engine not in ENGINES:
        raise AnalyzerError(f"unknown engine {engine!r} (choose from {', '.join(ENGINES)})")
    if not units:
        return []
    if engine == "ray":
        return _run_ray(units, ray_address, done or _ignore)
    if ray_address is not None:
        raise AnalyzerError("--ray-address needs --engine ray")
    return _run_local(units, workers, done or _ignore)


# ---------------------------------------------------------------------------
# local


def parse_and_map(path: Path, entry: Path | None, critical_path: bool = False) -> UnitResult:
    """Parse one trace file (writing its cache entry) and map it as a rank of its own: the
    task of the CLI's early parse workers (:class:`analyzer.ingest.jobs.ParseJobs`) when every
    file of the analysis is its own map unit. A folder of many ranks is then parsed *and*
    summarized in the workers, in parallel, instead of parsed there and summarized here one rank
    after the other (about 0.25 s per rank of a 50 MB trace). The file's problems are its
    outcome's TraceError, as in :func:`analyzer.rankmap.map_unit` (which parses an uncached file
    itself); this never raises for them. ``critical_path``: as :attr:`analyzer.rankmap.MapUnit.critical_path`."""
    from analyzer.rankmap import MapUnit, UnitFile, map_unit

    return map_unit(MapUnit((UnitFile(path, entry),), critical_path))


def _worth_a_pool(units: Sequence[MapUnit], workers: int | None) -> int:
    """How many worker processes to use (0 or 1: none)."""
    if len(units) < 2:
        return 0
    if workers is None:
        if sum(_size(f.path) for u in units for f in u.files) < PARALLEL_MIN_BYTES:
            return 0
        workers = usable_cpus()
    return min(len(units), workers)


def _context() -> multiprocessing.context.BaseContext | None:
    method = start_method()
    if method is None:
        return None
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        # The server imports the map's modules once; each worker forks from it with them loaded.
        context.set_forkserver_preload(["analyzer.rankmap"])
    return context


def _pool(n: int, context: multiprocessing.context.BaseContext) -> ProcessPoolExecutor:
    # The parse bounds travel in the environment; a forkserver's children have the server's, so hand them over.
    return ProcessPoolExecutor(
        max_workers=n, mp_context=context, initializer=limits.use_environment, initargs=(limits.environment(),)
    )


def _run_local(units: Sequence[MapUnit], workers: int | None, done: Done) -> list[UnitResult]:
    from analyzer.rankmap import map_unit

    n = _worth_a_pool(units, workers)
    context = _context() if n > 1 else None
    out = []
    if context is None:
        for unit in units:
            out.append(map_unit(unit))
            done(unit)
        return out
    pool = _pool(n, context)
    try:
        futures = [pool.submit(map_unit, u) for u in units]
        for unit, future in zip(units, futures):
            try:
                out.append(future.result())
            except BrokenProcessPool:
                out.append(_alone(unit, context))
            done(unit)
        return out
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _alone(unit: MapUnit, context: multiprocessing.context.BaseContext) -> UnitResult:
    """A unit whose pool broke, run again in a process of its own: we do not
    know which unit killed the worker, and this one must not pay for another."""
    from analyzer.rankmap import UnitResult, map_unit

    pool = _pool(1, context)
    try:
        return pool.submit(map_unit, unit).result()
    except BrokenProcessPool:
        return UnitResult(
            outcomes=[(f.path, TraceError(f.path, "the map worker died (out of memory?)"), []) for f in unit.files]
        )
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# ---------------------------------------------------------------------------
# ray


def _ray_task(unit: MapUnit, limits_env: dict) -> UnitResult:
    from analyzer.rankmap import map_unit

    limits.use_environment(limits_env)
    return map_unit(unit)


def _quiet_token_notice() -> None:
    """Drop Ray's notice that a new local instance turned token authentication on.

    It is a WARNING on every start of the private instance this process owns
    (nothing else can reach it, and auth stays on); on our stderr it reads as
    a problem with the user's traces. Every other Ray message is kept.
    """
    import logging

    logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(
        lambda record: "Token authentication is enabled" not in record.getMessage()
    )


def _run_ray(units: Sequence[MapUnit], address: str | None, done: Done) -> list[UnitResult]:
    from analyzer.rankmap import UnitResult

    try:
        import ray
    except ImportError:
        raise AnalyzerError("--engine ray needs Ray, which is not installed (pip install 'trainperf[ray]')") from None
    if not ray.is_initialized():
        try:
            if address is None:
                _quiet_token_notice()
                ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)
            else:
                # Ray Client warns before it raises on a timeout: the error line below says it once.
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ray.init(address=address, log_to_driver=False, configure_logging=False)
        except Exception as exc:  # noqa: BLE001 - any failure to start or join is one line
            where = "a local Ray instance" if address is None else f"the Ray cluster at {address}"
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise AnalyzerError(f"could not start or join {where}: {first[:200]}") from None
    task = ray.remote(_ray_task)
    env = limits.environment()
    refs = [task.remote(u, env) for u in units]
    out = []
    for unit, ref in zip(units, refs):
        try:
            out.append(ray.get(ref))
        except Exception as exc:  # noqa: BLE001 - a task or worker that failed costs its unit only
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            out.append(
                UnitResult(
                    outcomes=[
                        (f.path, TraceError(f.path, f"the Ray task failed ({first[:200]})"), []) for f in unit.files
                    ]
                )
            )
        done(unit)
    return out
