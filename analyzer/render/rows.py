"""Typed rows of the tables the reports draw: one small dataclass per table, read from its columns once.

pandas types the fields of ``itertuples()`` rows as any scalar, so a renderer reading cells from them is
unchecked; :func:`table_rows` reads each named column once (``Series.tolist()``: Python scalars, the same
values ``itertuples()`` gives) into rows whose fields say what the renderer relies on. A field is
``X | None`` where the column may hold None; NaN stays a float (the formatters draw it as missing).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import pandas as pd

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

R = TypeVar("R", bound="DataclassInstance")


def table_rows(frame: pd.DataFrame, row: type[R]) -> list[R]:
    """``frame``'s rows in order as ``row`` instances, each field read from the column of its name."""
    columns = [frame[f.name].tolist() for f in dataclasses.fields(row)]
    return [row(*cells) for cells in zip(*columns)]


@dataclass(frozen=True)
class KernelRow:
    """A row of analyzer.verbs.report.top_kernels_table."""

    name: str
    kind: str
    count: int
    total_ms: float
    ms_per_rank: float
    share_pct: float


@dataclass(frozen=True)
class OpRow:
    """A row of the attribution's summed ``ops`` table (analyzer.metrics.attribution)."""

    op: str
    backward: bool
    calls: int
    device_ms: float
    device_inclusive_ms: float
    host_ms: float
    share_of_step_pct: float


@dataclass(frozen=True)
class ModuleRow:
    """A row of the attribution's summed ``modules`` table."""

    module: str
    depth: int
    backward: bool
    calls: int
    device_ms: float
    device_self_ms: float
    host_ms: float
    share_of_step_pct: float


@dataclass(frozen=True)
class AnnotationRow:
    """A row of the attribution's summed ``annotations`` table."""

    name: str
    calls: int
    device_ms: float
    host_ms: float
    gpu_calls: int
    gpu_ms: float


@dataclass(frozen=True)
class IdleRow:
    """A row of the run's idle ``ranks`` table (analyzer.metrics.idle.RunIdle)."""

    rank: int
    idle_pct: float | None
    host_wait_pct: float | None
    kernel_wait_pct: float | None
    other_pct: float | None
    n_launches: int
    cpu_duration_us_p50: float | None
    launch_delay_us_p50: float | None
    gpu_duration_us_p50: float | None
    short_share: float | None
    syncs_per_step: float | None
    sync_idle_ms: float
    n_steps: int
    pageable_htod_per_step: float | None


@dataclass(frozen=True)
class MemoryRankRow:
    """A row of the run memory's ``ranks`` table (analyzer.metrics.memory.RunMemory)."""

    rank: int
    peak_allocated_bytes: float | None
    peak_allocated_step: float | None
    peak_reserved_bytes: float | None
    peak_reserved_step: float | None
    n_steps: int


@dataclass(frozen=True)
class TracePeakRow:
    """A row of the run memory's ``trace_peaks`` table."""

    rank: int
    device: str
    peak_allocated_bytes: float | None
    peak_reserved_bytes: float | None
    n_events: int


@dataclass(frozen=True)
class RooflineOpRow:
    """A row of the roofline's ``ops`` table (analyzer.metrics.roofline)."""

    op: str
    backward: bool
    dtype: str | None
    calls: int
    device_ms: float
    achieved_flops_per_s: float | None
    achieved_bytes_per_s: float | None
    flop_per_byte: float | None
    ridge_flop_per_byte: float | None
    bound: str | None
    efficiency_pct: float | None
