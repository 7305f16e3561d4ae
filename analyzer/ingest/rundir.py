"""Read a reftrain run directory (docs/rundir.md) into tables.

``read_run_dir`` is tolerant: a missing, unreadable or partly corrupt
JSON-lines file of one rank becomes one line in ``RunDir.errors`` and
everything else is still read (a run killed mid-write leaves a torn last
line; the records before it are good). Only a missing or unreadable
``run.json`` or a schema this analyzer does not know raises AnalyzerError.

Schemas: ``run.json`` must be ``reftrain.run/<major>[.<minor>]`` with a
major version in :data:`SUPPORTED_MAJOR`; each JSON-lines family names its
schema in the manifest's ``schemas`` (a family with an unknown major is
skipped with an error line). Minor versions may add fields: unknown fields
are kept as extra columns.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pandas as pd

from analyzer.errors import AnalyzerError
from analyzer.ingest.formats import RECORDS_GLOB, RECORDS_RANK_RE, MetricsLine, RunManifest
from analyzer.ingest.locate import MANIFEST, RUN_TRACE_PATTERNS, is_run_dir, listed_or_found, unusable_reason

SUPPORTED_MAJOR = {"run": 1, "metrics": 1, "collectives": 1, "telemetry": 1}
_SCHEMA_RE = re.compile(r"^reftrain\.(\w+)/(\d+)(?:\.\d+)?$")

# Documented columns per family and their dtypes (docs/rundir.md); a
# file's records may carry more fields, kept as they come.
METRICS_COLUMNS: dict[str, str] = dict(MetricsLine.DTYPES)  # the fields of the typed metrics line (formats.py)
COLLECTIVES_COLUMNS: dict[str, str] = {
    "step": "int64",
    "rank": "int64",
    "seq": "int64",
    "kind": "category",
    "bytes": "int64",
    "dtype": "category",
    "pg": "category",
    "group_size": "int64",
    "start_ns": "int64",
    "end_ns": "int64",
    "clock": "category",
}
# ``rank`` is not in the records: it comes from the file name (gpu{R}).
TELEMETRY_COLUMNS: dict[str, str] = {
    "rank": "int64",
    "time_ns": "int64",
    "gpu_util_pct": "float64",
    "mem_util_pct": "float64",
    "sm_clock_mhz": "float64",
    "power_w": "float64",
    "mem_used_bytes": "float64",
    "temp_c": "float64",
    "throttle_reasons": "object",
}
# Ranges of the metrics fields that enter a table: a line with a value
# outside them is dropped and counted, not averaged in. Otherwise one corrupt
# line (step 1e308, step_time_ms -5, mfu 1e308) would add a step and make
# `check` fail on "MFU must be positive", disabling the CI gate.
# Absent or null fields are not checked (older writers omit some).
_INT64_MAX = 2**63 - 1
_DAY_MS = 86_400_000.0  # no step lasts a day; a larger value is corruption
METRICS_RANGES: dict[str, tuple[str, float, float, bool]] = {
    # field: (kind, low, high, low inclusive)
    "step": ("int", 0, _INT64_MAX, True),
    "rank": ("int", 0, _INT64_MAX, True),
    "tokens": ("int", 0, _INT64_MAX, True),
    "mem_bytes": ("int", 0, _INT64_MAX, True),
    "mem_reserved_bytes": ("int", 0, _INT64_MAX, True),
    "time_ns": ("int", 0, _INT64_MAX, True),
    "step_time_ms": ("float", 0.0, _DAY_MS, False),
    "data_wait_ms": ("float", 0.0, _DAY_MS, True),
    "forward_ms": ("float", 0.0, _DAY_MS, True),
    "backward_ms": ("float", 0.0, _DAY_MS, True),
    "optimizer_ms": ("float", 0.0, _DAY_MS, True),
    "grad_sync_ms": ("float", 0.0, _DAY_MS, True),
    "comm_ms": ("float", 0.0, _DAY_MS, True),
    "tokens_per_s": ("float", 0.0, 1e15, True),
    # A fraction of the stated peak. Above 1 the peak is underestimated (a
    # CPU peak is measured, docs/mfu.md), so up to 10x is kept; beyond that
    # the value is not a measurement.
    "mfu": ("float", 0.0, 10.0, False),
    "hfu": ("float", 0.0, 10.0, False),
}
# Ratios the writer derived from the step's own fields and from run.json (a
# peak, a FLOP count): out of range, they say the derivation was wrong (a CPU
# peak measured on a loaded machine reads 1000x low), not that the step is.
# Such a value is withheld (null) and the step kept; any other field out of
# range drops the line.
DERIVED_FIELDS = frozenset({"tokens_per_s", "mfu", "hfu"})


def _out_of_range(
    rec: dict, ranges: dict[str, tuple[str, float, float, bool]], skip: frozenset[str] = frozenset()
) -> tuple[str, str] | None:
    """The first field of ``rec`` (not in ``skip``) outside its range, as (field, description); None when all fit."""
    for name, (kind, low, high, low_inclusive) in ranges.items():
        v = rec.get(name)
        if v is None or name in skip:
            continue
        if kind == "int":
            # An integral float (4e8, as json.dumps writes a float count) is an
            # integer; 1e308 is one too, and fails the int64 range below.
            if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())):
                return name, f"{name} {_show(v)} is not an integer"
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            return name, f"{name} {_show(v)} is not a number"
        elif not math.isfinite(v):
            return name, f"{name} {_show(v)} is not finite"
        if v > high or v < low or (v == low and not low_inclusive):
            bracket = "[" if low_inclusive else "("
            return name, f"{name} {_show(v)} is outside {bracket}{low:g}, {high:g}]"
    return None


def _show(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


_FAMILIES = {
    "metrics": (RECORDS_GLOB["metrics"], METRICS_COLUMNS),  # values checked against METRICS_RANGES
    "collectives": (RECORDS_GLOB["collectives"], COLLECTIVES_COLUMNS),
    "telemetry": (RECORDS_GLOB["telemetry"], TELEMETRY_COLUMNS),
}


@dataclass
class RunDir:
    """A run directory's contents as tables.

    ``metrics``, ``collectives`` and ``telemetry`` hold all ranks, sorted by
    rank then step (telemetry: rank then time), with the documented columns
    (:data:`METRICS_COLUMNS`, ...) always present, even when empty. Integer
    columns that have missing values become float64. ``trace_paths`` are
    absolute paths of the Kineto traces that exist; ``errors`` one line per
    problem found on the way (a file or family not read, unreadable
    lines); ``warnings`` one line per file whose lines had values out of
    range (:data:`METRICS_RANGES`), with the count and the first example.
    ``manifest`` is ``run.json`` as decoded; ``run`` the same, typed.
    """

    path: Path
    manifest: dict
    run: RunManifest
    metrics: pd.DataFrame
    collectives: pd.DataFrame
    telemetry: pd.DataFrame
    trace_paths: list[Path]
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int | None:
        return self.run.world_size


def read_run_dir(path: Path) -> RunDir:
    """Read the manifest, the per-rank JSON-lines files and the trace list.

    Raises AnalyzerError when ``run.json`` is missing, not valid JSON, or
    of an unknown schema major version.
    """
    path = Path(path)
    manifest = _read_manifest(path)
    run = RunManifest.from_json(manifest)
    errors: list[str] = []
    warnings: list[str] = []
    tables: dict[str, pd.DataFrame] = {}
    for family, (pattern, columns) in _FAMILIES.items():
        frames: list[pd.DataFrame] = []
        problem = _schema_problem(run.family_schema(family), family)
        if problem:
            errors.append(f"{family}: {problem}; {family} not read")
        else:
            for rel in listed_or_found(path, getattr(run.files, family), pattern, errors):
                frame = _read_jsonl(path, rel, errors, warnings, METRICS_RANGES if family == "metrics" else None)
                if frame is None:
                    continue
                rank = _rank_from_name(rel)
                if "rank" not in frame.columns or frame["rank"].isna().any():
                    if rank is None:
                        errors.append(f"{rel}: no rank in the records or the file name; file skipped")
                        continue
                    frame["rank"] = frame["rank"].fillna(rank) if "rank" in frame.columns else rank
                frames.append(frame)
        tables[family] = _conform(frames, columns, "time_ns" if family == "telemetry" else "step")
    traces = []
    for rel in listed_or_found(path, run.files.traces, RUN_TRACE_PATTERNS, errors):
        traces.append((path / rel).absolute())
    return RunDir(
        path=path,
        manifest=manifest,
        run=run,
        metrics=tables["metrics"],
        collectives=tables["collectives"],
        telemetry=tables["telemetry"],
        trace_paths=traces,
        errors=errors,
        warnings=warnings,
    )


def _read_manifest(path: Path) -> dict:
    manifest = path / MANIFEST
    try:
        raw = manifest.read_bytes()
    except FileNotFoundError:
        raise AnalyzerError(f"{path}: not a run directory (no {MANIFEST})") from None
    except OSError as exc:
        raise AnalyzerError(f"{manifest}: cannot read ({exc.strerror or exc})") from None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise AnalyzerError(f"{manifest}: invalid JSON ({str(exc).split(': line')[0]})") from None
    if not isinstance(data, dict):
        raise AnalyzerError(f"{manifest}: expected a JSON object, found a {type(data).__name__}")
    problem = _schema_problem(data.get("schema"), "run")
    if problem:
        raise AnalyzerError(f"{manifest}: {problem}")
    return data


def _schema_problem(schema: object, family: str) -> str | None:
    m = _SCHEMA_RE.match(str(schema)) if schema is not None else None
    if m is None or m.group(1) != family:
        return f"schema {schema!r} is not reftrain.{family}/<version>"
    major = int(m.group(2))
    if major != SUPPORTED_MAJOR[family]:
        return (
            f"schema {schema} is not supported (this analyzer reads reftrain.{family}/{SUPPORTED_MAJOR[family]}); "
            "upgrade the analyzer"
        )
    return None


def _rank_from_name(rel: str) -> int | None:
    m = RECORDS_RANK_RE.search(rel)
    return int(m.group(1)) if m else None


def _read_jsonl(
    root: Path, rel: str, errors: list[str], warnings: list[str], ranges: dict | None = None
) -> pd.DataFrame | None:
    """Records of one JSON-lines file; bad lines are skipped and reported
    (a torn last line is what a killed writer leaves behind), and with
    ``ranges`` records with a value out of range are dropped and counted
    in one warning (a derived ratio, :data:`DERIVED_FIELDS`, is withheld
    instead and the record kept, counted in a warning per field)."""
    reason = unusable_reason(root / rel)
    if reason is not None:  # a FIFO would block the read for ever
        errors.append(f"{rel}: {reason}; not read")
        return None
    try:
        raw = (root / rel).read_bytes()
    except OSError as exc:
        errors.append(f"{rel}: cannot read ({exc.strerror or exc})")
        return None
    records = []
    bad: list[tuple[int, str]] = []
    out_of_range: list[tuple[int, str]] = []
    withheld: dict[str, list[tuple[int, str]]] = {}
    lines = raw.split(b"\n")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            bad.append((i, str(exc).split(": line")[0]))
            continue
        if not isinstance(rec, dict):
            bad.append((i, f"a {type(rec).__name__}, not an object"))
            continue
        if ranges:
            problem = _out_of_range(rec, ranges, DERIVED_FIELDS)
            if problem is not None:
                out_of_range.append((i, problem[1]))
                continue
            while (derived := _out_of_range(rec, {k: ranges[k] for k in DERIVED_FIELDS if k in ranges})) is not None:
                withheld.setdefault(derived[0], []).append((i, derived[1]))
                rec[derived[0]] = None
        records.append(rec)
    if out_of_range:
        first_line, first = out_of_range[0]
        n = len(out_of_range)
        warnings.append(
            f"{rel}: {n} line{'s' if n > 1 else ''} with out-of-range values dropped (first: line {first_line}, {first})"
        )
    for name, found in sorted(withheld.items()):
        first_line, first = found[0]
        n = len(found)
        warnings.append(
            f"{rel}: {name} withheld on {n} line{'s' if n > 1 else ''}, steps kept (first: line {first_line}, {first})"
        )
    if bad:
        last_line = max(i for i, line in enumerate(lines, 1) if line.strip())
        torn = len(bad) == 1 and bad[0][0] == last_line
        bad_line, bad_reason = bad[0]
        if torn:
            errors.append(
                f"{rel}: last line {bad_line} is incomplete ({bad_reason}; run killed while writing?); {len(records)} records read"
            )
        else:
            errors.append(
                f"{rel}: {len(bad)} unreadable lines skipped (first: line {bad_line}, {bad_reason}); {len(records)} records read"
            )
    if not records:
        if not bad and not out_of_range:
            errors.append(f"{rel}: empty")
        return None
    return pd.DataFrame.from_records(records)


def _conform(frames: list[pd.DataFrame], columns: dict[str, str], order: str) -> pd.DataFrame:
    """One table with the documented columns first, in their dtypes."""
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    for col in columns:
        if col not in frame.columns:
            frame[col] = pd.Series([None] * len(frame), dtype=object)
    extra = [c for c in frame.columns if c not in columns]
    frame = frame[list(columns) + extra]
    for col, dtype in columns.items():
        frame[col] = _as_dtype(frame[col], dtype)
    if len(frame):
        frame = frame.sort_values(["rank", order], kind="stable").reset_index(drop=True)
    return frame


def _as_dtype(s: pd.Series, dtype: str) -> pd.Series:
    if dtype == "int64":
        num = pd.to_numeric(s, errors="coerce")
        if num.isna().any():
            return num.astype("float64")
        return num.astype("int64")
    if dtype == "float64":
        return pd.to_numeric(s, errors="coerce").astype("float64")
    if dtype == "bool":
        if s.isna().any():
            return s.astype(object)
        return s.astype(bool)
    if dtype == "category":
        return s.astype(object).where(s.notna(), None).astype("category")
    return pd.Series(s.to_numpy(dtype=object), index=s.index, dtype=object)


__all__ = [
    "COLLECTIVES_COLUMNS",
    "METRICS_COLUMNS",
    "TELEMETRY_COLUMNS",
    "RunDir",
    "is_run_dir",
    "read_run_dir",
]
