"""Stragglers: which rank makes the others wait, with the evidence.

Definitions (docs/metrics.md, "Stragglers"):

Arrivals. A collective is matched across ranks by its key: ``(pg, seq)`` in
reftrain's collective records, or its order within the process group in
traces (``arrivals_from_traces``). A rank's *arrival* is the collective's
start on that rank, on a common clock (reftrain records: ``start_ns -
clock.offsets_ns[rank]``). Per collective: ``skew = max(arrival) -
min(arrival)``; ``wait[r] = max(arrival) - arrival[r]`` is the time rank
``r`` spends waiting for the last arriver, who waits least; ``lateness[r] =
arrival[r] - min(arrival)``.

Signals, each a value per (rank, step):

* ``step_time``: the step time;
* ``lateness``: the sum of the rank's lateness over the step's collectives.

For a signal ``x``, per step ``d[r, s] = x[r, s] - median over the other
ranks of x[r', s]`` (leave-one-out, so that with two ranks each is compared
with the other, not with the mean of both). Per rank: ``excess = median_s
d``; ``slow_share`` = share of steps with ``d >= min_excess_ms``; robust
``z = excess / (sqrt(pi/2) * sigma / sqrt(n))``, the median excess over its
standard error, with ``sigma = 1.4826 * median over ranks of MAD_s(d)``
(the step-to-step noise, floored at ``0.1 * min_excess_ms``) and ``n`` the
rank's number of steps; ``sign_p`` the one-sided sign-test p-value of
being slow in that many of the steps by chance (fair coin). A rank is a
*persistent straggler* on a signal when ``slow_share >= min_slow_share``,
``sign_p <= max_sign_p``, ``z >= min_z``, ``excess >= min_excess_ms`` and
``excess >= min_excess_frac * median step time``, over at least
``min_steps`` steps; it is flagged when either signal says so. Profiled
steps and the steps right after profiler, trace or checkpoint work are left
out (:func:`disturbed_steps`).

In synchronous data parallelism the step times even out (everyone waits in
the gradient all-reduce), so the lateness signal is usually the one that
names the straggler; the step-time ratio (``step_time / median over ranks``)
is reported for every rank regardless.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from analyzer.jsontext import jsonable
from analyzer.metrics.dtypes import MESSAGE_DTYPE_BYTES
from analyzer.metrics.taxonomy import collective_kind_of as collective_kind, collective_kinds
from analyzer.metrics.text import text_map, text_mask

_MEDIAN_SE = math.sqrt(math.pi / 2)  # standard error of a sample median, in sigma / sqrt(n)

ARRIVAL_COLUMNS = ("rank", "key", "step", "kind", "bytes", "group_size", "start_ns", "end_ns")


@dataclass(frozen=True)
class StragglerConfig:
    """Thresholds of the persistent-straggler verdict (see module doc)."""

    min_slow_share: float = 0.75
    max_sign_p: float = 0.05
    min_z: float = 3.0
    min_excess_ms: float = 1.0
    min_excess_frac: float = 0.02
    min_steps: int = 5


@dataclass
class RankStraggle:
    """One rank's straggler evidence. Times in ms; None where a signal is missing."""

    rank: int
    n_steps: int
    step_time_ms: float | None
    step_time_ratio: float | None  # median over steps of step_time / median over ranks
    step_excess_ms: float | None
    step_slow_share: float | None
    step_sign_p: float | None
    step_z: float | None
    lateness_excess_ms: float | None
    lateness_slow_share: float | None
    lateness_sign_p: float | None
    lateness_z: float | None
    last_arrivals: int
    n_collectives: int
    wait_ms: float  # time this rank waited for later arrivers
    caused_wait_ms: float  # time the others waited on collectives this rank arrived at last
    flagged: bool
    signals: list[str] = field(default_factory=list)
    evidence: str = ""


@dataclass
class StragglerResult:
    """Per-rank evidence and the verdict; ``ranks`` lists the flagged ranks."""

    ranks: list[int]
    per_rank: list[RankStraggle]
    verdict: str
    step_source: str | None
    arrival_source: str | None
    config: StragglerConfig
    per_step: pd.DataFrame  # rank, step, step_time_ms, step_time_ratio, lateness_ms
    notes: list[str] = field(default_factory=list)

    def slowest(self, k: int) -> list[RankStraggle]:
        """The ``k`` slowest ranks, slowest first: by ``step_time_ratio`` (median over steps of the
        rank's step time over the median across ranks), then ``lateness_excess_ms``; ranks
        without a step-time ratio last, flagged ranks first among equals. For views of
        many ranks (a top-k table instead of one row or bar per rank)."""

        def known(x: float | None) -> float | None:
            return float(x) if x is not None and math.isfinite(float(x)) else None

        def key(r: RankStraggle) -> tuple[bool, float, float, bool, int]:
            ratio, late = known(r.step_time_ratio), known(r.lateness_excess_ms)
            return (ratio is None, -(ratio or 0.0), -(late or 0.0), not r.flagged, r.rank)

        return sorted(self.per_rank, key=key)[: max(int(k), 0)]

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": list(self.ranks),
            "verdict": self.verdict,
            "step_source": self.step_source,
            "arrival_source": self.arrival_source,
            "config": self.config.__dict__.copy(),
            "per_rank": [{k: jsonable(v) for k, v in r.__dict__.items()} for r in self.per_rank],
            "notes": list(self.notes),
        }


_CHECKPOINT_RE = re.compile(r"step(\d+)/?$")


def disturbed_steps(profiled_steps: Sequence[int], checkpoint_paths: Sequence[str] = ()) -> set[int]:
    """Steps that start right after work done between two steps.

    torch.profiler changes state between steps: it prepares Kineto before a
    window's warm-up, starts tracing before its active steps and writes the
    trace after its last step; reftrain writes a checkpoint
    ``checkpoints/stepK`` after step ``K - 1``. All of it runs outside any
    step's timing and each rank resumes when its own part is done, so the
    next step's first collective measures that work, not training speed (a
    test run saw the slow rank arrive 2 ms *early* on the step after the
    profiler's start). Left out: every profiled step (the profiler starts
    before the first and switches from warm-up to active inside the window),
    the step after each run of consecutive profiled steps, and step ``K`` for
    each checkpoint.
    """
    out: set[int] = set()
    profiled = sorted(set(int(s) for s in profiled_steps))
    out.update(profiled)
    for i, s in enumerate(profiled):
        if i + 1 == len(profiled) or profiled[i + 1] != s + 1:
            out.add(s + 1)
    for path in checkpoint_paths:
        m = _CHECKPOINT_RE.search(str(path))
        if m:
            out.add(int(m.group(1)))
    return out


# ---------------------------------------------------------------------------
# Arrivals: one row per (rank, collective)
# ---------------------------------------------------------------------------


def arrivals_from_records(collectives: pd.DataFrame, offsets_ns: Sequence[int] | None) -> pd.DataFrame:
    """Arrivals from reftrain's collective records (``reftrain.collectives/1`` plus ``rank``).

    Start and end are shifted onto rank 0's clock with the manifest's
    ``clock.offsets_ns`` (that rank's clock minus rank 0's).
    """
    if collectives is None or collectives.empty:
        return _empty_arrivals()
    frame = collectives
    offsets = np.zeros(len(frame), dtype=np.int64)
    if offsets_ns:
        table = np.asarray(list(offsets_ns), dtype=np.int64)
        ranks = frame["rank"].to_numpy(np.int64)
        known = ranks < len(table)
        offsets[known] = table[ranks[known]]
    pg = frame["pg"].astype(str) if "pg" in frame.columns else pd.Series("0", index=frame.index)
    return pd.DataFrame(
        {
            "rank": frame["rank"].to_numpy(np.int64),
            "key": (pg + ":" + frame["seq"].astype(np.int64).astype(str)).to_numpy(),
            "step": frame["step"].to_numpy(np.int64) if "step" in frame.columns else -1,
            "kind": frame["kind"].astype(str).to_numpy() if "kind" in frame.columns else "unknown",
            "bytes": pd.to_numeric(frame["bytes"], errors="coerce").to_numpy(np.float64)
            if "bytes" in frame.columns
            else np.nan,
            "group_size": frame["group_size"].to_numpy(np.int64) if "group_size" in frame.columns else -1,
            "start_ns": frame["start_ns"].to_numpy(np.int64) - offsets,
            "end_ns": frame["end_ns"].to_numpy(np.int64) - offsets,
        }
    )


def _empty_arrivals() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="object" if c in ("key", "kind") else "int64") for c in ARRIVAL_COLUMNS})


def _step_of(times_ns: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """Index of the last ProfilerStep starting at or before each time (its step number), -1 before the first."""
    if steps.empty:
        return np.full(len(times_ns), -1, dtype=np.int64)
    lo = steps["start_ns"].to_numpy(np.int64)
    k = np.searchsorted(lo, times_ns, side="right") - 1
    numbers = steps["step"].to_numpy(np.int64)
    return np.where(k >= 0, numbers[np.clip(k, 0, None)], -1)


def rank_collective_events(events: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The events of one rank that mark its arrival at each collective, in order.

    GPU traces: communication kernels (device arrival), ordered per stream.
    CPU traces: the ``c10d::*`` ops the training thread issues (host
    arrival); the ``gloo:*`` ranges run later on gloo's worker threads and
    ``record_param_comms`` wraps the same call, so neither is used.
    """
    columns = ["name", "coll_name", "stream", "start_ns", "end_ns", "msg_in_nelems", "msg_dtype", "group_size"]
    kind = events["kind"]
    comm = events.loc[(kind == "comm").to_numpy(), columns]
    if not comm.empty:
        return comm.sort_values(["stream", "start_ns"], kind="stable"), "device communication kernels"
    c10d = text_mask(events["name"], lambda n: n.startswith("c10d::"))
    host = events.loc[(kind == "cpu_comm").to_numpy() & c10d, columns]
    return host.sort_values("start_ns", kind="stable"), "host c10d collective ops"


def arrivals_from_traces(
    per_rank: Mapping[int, tuple[pd.DataFrame, pd.DataFrame]],
) -> tuple[pd.DataFrame, str | None, list[str]]:
    """Arrivals matched across ranks by order within the process group.

    ``per_rank`` maps rank to ``(events, steps)``. The k-th collective of a
    group on one rank is the k-th on every rank: the group is the stream
    (its position among the rank's communication streams) for kernels, the
    op name for host ops. Groups whose counts differ across ranks are left
    out with a note. Returns ``(arrivals, source, notes)``; arrivals empty
    when fewer than two ranks have collectives. Assumes the ranks' trace
    clocks agree (same host, or synchronized hosts).

    Two stages: :func:`rank_arrivals` on each rank (where its events are),
    :func:`match_arrivals` across ranks.
    """
    return match_arrivals({rank: rank_arrivals(rank, events, steps) for rank, (events, steps) in per_rank.items()})


def rank_arrivals(rank: int, events: pd.DataFrame, steps: pd.DataFrame) -> tuple[pd.DataFrame | None, str]:
    """One rank's arrival records (:data:`ARRIVAL_COLUMNS`, in its order of
    collectives; None when it has none) and their source in words."""
    sel, source = rank_collective_events(events)
    if sel.empty:
        return None, source
    if source.startswith("device"):
        streams = np.sort(sel["stream"].unique())
        group = np.searchsorted(streams, sel["stream"].to_numpy()).astype(str).astype(object)
    else:
        group = text_map(sel["name"], str)
    # Kind from the collective name when the event carries one, else from the op/kernel name;
    # device kernels first ask the host collective around their launch (analyzer.metrics.taxonomy).
    kind = text_map(sel["coll_name"], collective_kind)
    by_name = text_map(sel["name"], collective_kind)
    kind = np.where(pd.isna(kind), by_name, kind)
    if source.startswith("device"):
        kind = collective_kinds(events).loc[sel.index].to_numpy(object)
    nelems = sel["msg_in_nelems"].to_numpy(np.int64)
    elem_bytes = text_map(sel["msg_dtype"], lambda d: MESSAGE_DTYPE_BYTES.get(d, np.nan), np.nan).astype(np.float64)
    order = pd.Series(group).groupby(group).cumcount().to_numpy()
    start = sel["start_ns"].to_numpy(np.int64)
    frame = pd.DataFrame(
        {
            "rank": rank,
            "key": group + ":" + order.astype(str).astype(object),
            "step": _step_of(start, steps),
            "kind": kind,
            "bytes": np.where(nelems >= 0, nelems * elem_bytes, np.nan),
            "group_size": sel["group_size"].to_numpy(np.int64),
            "start_ns": start,
            "end_ns": sel["end_ns"].to_numpy(np.int64),
        }
    )
    return frame, source


def match_arrivals(
    per_rank: Mapping[int, tuple[pd.DataFrame | None, str]],
) -> tuple[pd.DataFrame, str | None, list[str]]:
    """The cross-rank stage of :func:`arrivals_from_traces` over each rank's
    :func:`rank_arrivals`; ``source`` is the highest rank's."""
    notes: list[str] = []
    frames = []
    source = None
    for rank, (frame, rank_source) in sorted(per_rank.items()):
        source = rank_source
        if frame is not None:
            frames.append(frame)
    if len(frames) < 2:
        return _empty_arrivals(), None, notes
    arrivals = pd.concat(frames, ignore_index=True)
    group_of = arrivals["key"].str.rsplit(":", n=1).str[0]
    counts = arrivals.groupby([group_of, arrivals["rank"]]).size().unstack(fill_value=0)
    uneven = counts.index[counts.nunique(axis=1) > 1]
    if len(uneven):
        notes.append(
            f"collective groups {sorted(map(str, uneven))} have different counts across ranks; left out of arrival matching"
        )
        arrivals = arrivals.loc[~group_of.isin(uneven)].reset_index(drop=True)
    return arrivals, source, notes


# ---------------------------------------------------------------------------
# Per-collective skew and per-rank waits
# ---------------------------------------------------------------------------


def busbw_factor(kind: str, n: int) -> float:
    """Bus bandwidth over algorithm bandwidth for a collective ``kind`` among ``n`` ranks (nccl-tests'
    PERFORMANCE.md); NaN for one rank or an unknown kind."""
    if n <= 1:
        return float("nan")
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if kind in ("broadcast", "reduce", "send", "recv", "send_recv"):
        return 1.0
    return float("nan")


def collective_table(arrivals: pd.DataFrame) -> pd.DataFrame:
    """One row per collective seen on two or more ranks.

    Columns: ``key, step, kind, bytes, n_ranks, first_arrival_ns, skew_ms,
    last_rank`` (-1 when all arrive at once), ``wait_ms`` (sum over ranks of the time waiting for the last
    arriver), ``duration_ms`` (the last arriver's start-to-end time, i.e.
    the transfer without waiting), ``algbw_gbps`` (``size / duration`` in
    GB/s, where size is the input bytes, times n for all_gather as in
    nccl-tests) and ``busbw_gbps`` (algbw times the nccl-tests factor).
    """
    if arrivals.empty:
        cols = (
            "key",
            "step",
            "kind",
            "bytes",
            "n_ranks",
            "first_arrival_ns",
            "skew_ms",
            "last_rank",
            "wait_ms",
            "duration_ms",
            "algbw_gbps",
            "busbw_gbps",
        )
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols})
    a = arrivals.sort_values(["key", "start_ns", "rank"], kind="stable")
    g = a.groupby("key", sort=False)
    last_idx = g["start_ns"].idxmax()
    last = a.loc[last_idx].set_index("key")
    agg = g.agg(
        step=("step", "min"),
        kind=("kind", "first"),
        bytes=("bytes", "max"),
        n_ranks=("rank", "nunique"),
        first_arrival_ns=("start_ns", "min"),
        last_arrival_ns=("start_ns", "max"),
        sum_start_ns=("start_ns", "sum"),
    )
    agg = agg.loc[agg["n_ranks"] >= 2]
    last = last.loc[agg.index]
    skew_ns = agg["last_arrival_ns"] - agg["first_arrival_ns"]
    wait_ns = agg["last_arrival_ns"] * agg["n_ranks"] - agg["sum_start_ns"]
    duration_ns = (last["end_ns"] - last["start_ns"]).astype(np.float64)
    n = agg["n_ranks"].to_numpy()
    size = agg["bytes"].to_numpy(np.float64) * np.where(agg["kind"].to_numpy() == "all_gather", n, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(duration_ns.to_numpy() > 0, size / duration_ns.to_numpy(), np.nan)  # bytes/ns == GB/s
    factor = np.array([busbw_factor(k, int(m)) for k, m in zip(agg["kind"], n)])
    out = pd.DataFrame(
        {
            "key": agg.index.to_numpy(),
            "step": agg["step"].to_numpy(np.int64),
            "kind": agg["kind"].to_numpy(),
            "bytes": agg["bytes"].to_numpy(np.float64),
            "n_ranks": n.astype(np.int64),
            "first_arrival_ns": agg["first_arrival_ns"].to_numpy(np.int64),
            "skew_ms": skew_ns.to_numpy() / 1e6,
            "last_rank": np.where(skew_ns.to_numpy() > 0, last["rank"].to_numpy(np.int64), -1),
            "wait_ms": wait_ns.to_numpy() / 1e6,
            "duration_ms": duration_ns.to_numpy() / 1e6,
            "algbw_gbps": algbw,
            "busbw_gbps": algbw * factor,
        }
    )
    return out.sort_values("first_arrival_ns", kind="stable").reset_index(drop=True)


def _rank_waits(arrivals: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, collective): lateness_ns, wait_ns, is_last."""
    a = arrivals.copy()
    n = a.groupby("key")["rank"].transform("nunique")
    a = a.loc[n >= 2].copy()
    g = a.groupby("key")["start_ns"]
    a["lateness_ns"] = a["start_ns"] - g.transform("min")
    a["wait_ns"] = g.transform("max") - a["start_ns"]
    # The last arriver: the latest start (lowest rank on ties); no one when all arrive together.
    ordered = a.loc[g.transform("max") > g.transform("min")].sort_values(
        ["key", "start_ns", "rank"], ascending=[True, False, True], kind="stable"
    )
    a["is_last"] = False
    a.loc[ordered.drop_duplicates("key").index, "is_last"] = True
    return a


# Host ranges of a collective's execution (gloo's or NCCL's worker threads): they
# run from the moment the work is taken up to its completion, wait included.
_HOST_WORK_PREFIXES = ("gloo:", "nccl:")


def collective_spans(per_rank: Mapping[int, pd.DataFrame]) -> pd.DataFrame:
    """Each collective's execution on each rank, matched across ranks: ``rank, key, start_ns, end_ns``.

    ``per_rank`` maps rank to its events table. GPU traces: the
    communication kernels (they start when the rank arrives and end when
    the collective completes), matched by order per stream as in
    :func:`arrivals_from_traces`. CPU traces: the ``gloo:*`` / ``nccl:*``
    ranges of the backend's worker threads, matched by order per name (the
    ``c10d::*`` op on the training thread only issues the work). Groups
    whose counts differ across ranks are left out. Times stay on each
    rank's own clock. Two stages: :func:`rank_collective_spans` per rank,
    :func:`match_collective_spans` across ranks.
    """
    return match_collective_spans({rank: rank_collective_spans(rank, events) for rank, events in per_rank.items()})


def rank_collective_spans(rank: int, events: pd.DataFrame) -> pd.DataFrame | None:
    """One rank's collective executions (``rank, key, group, start_ns, end_ns``), None without any."""
    kind = events["kind"]
    sel = events.loc[(kind == "comm").to_numpy(), ["name", "stream", "start_ns", "end_ns"]]
    if not sel.empty:
        sel = sel.sort_values(["stream", "start_ns"], kind="stable")
        streams = np.sort(sel["stream"].unique())
        group = np.searchsorted(streams, sel["stream"].to_numpy()).astype(str).astype(object)
    else:
        work = (kind == "cpu_comm").to_numpy() & text_mask(events["name"], lambda n: n.startswith(_HOST_WORK_PREFIXES))
        sel = events.loc[work, ["name", "stream", "start_ns", "end_ns"]].sort_values("start_ns", kind="stable")
        group = text_map(sel["name"], str)
    if sel.empty:
        return None
    order = pd.Series(group).groupby(group).cumcount().to_numpy()
    return pd.DataFrame(
        {
            "rank": rank,
            "key": group + ":" + order.astype(str).astype(object),
            "group": group,
            "start_ns": sel["start_ns"].to_numpy(np.int64),
            "end_ns": sel["end_ns"].to_numpy(np.int64),
        }
    )


def match_collective_spans(per_rank: Mapping[int, pd.DataFrame | None]) -> pd.DataFrame:
    """The cross-rank stage of :func:`collective_spans`: groups with the same count on every rank."""
    frames = [frame for _rank, frame in sorted(per_rank.items()) if frame is not None]
    if len(frames) < 2:
        return pd.DataFrame(
            {
                "rank": pd.Series(dtype="int64"),
                "key": pd.Series(dtype=object),
                "start_ns": pd.Series(dtype="int64"),
                "end_ns": pd.Series(dtype="int64"),
            }
        )
    spans = pd.concat(frames, ignore_index=True)
    counts = spans.groupby(["group", "rank"]).size().unstack(fill_value=0)
    even = counts.index[(counts.nunique(axis=1) == 1) & (counts.min(axis=1) > 0)]
    spans = spans.loc[spans["group"].isin(even)]
    return spans[["rank", "key", "start_ns", "end_ns"]].reset_index(drop=True)


def wait_intervals(spans: pd.DataFrame) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per rank, its waiting at collectives: merged, sorted ``(start_ns, end_ns)`` arrays on its own clock.

    A collective runs on rank ``r`` from its arrival ``a_r`` to the common
    completion ``a_last + T`` (``T`` the transfer once everyone is there),
    so its duration exceeds the last arriver's by exactly ``a_last - a_r``:
    ``wait_r = dur_r - min over ranks of dur``, the interval ``[start_r,
    start_r + wait_r)``. Differences of durations need no common clock, so
    ranks on different hosts are fine. ``spans`` is
    :func:`collective_spans`; ranks that never wait are absent.
    """
    from analyzer.metrics.intervals import union

    if spans is None or spans.empty:
        return {}
    dur = spans["end_ns"].to_numpy(np.int64) - spans["start_ns"].to_numpy(np.int64)
    frame = spans.assign(dur=dur)
    g = frame.groupby("key")
    multi = (g["rank"].transform("nunique") >= 2).to_numpy()
    wait = dur - g["dur"].transform("min").to_numpy(np.int64)
    frame = frame.assign(wait=wait).loc[multi & (wait > 0)]
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for rank, rows in frame.groupby("rank"):
        start = rows["start_ns"].to_numpy(np.int64)
        out[int(rank)] = union(start, start + rows["wait"].to_numpy(np.int64))
    return out


# ---------------------------------------------------------------------------
# Robust per-rank scores and the verdict
# ---------------------------------------------------------------------------


def _leave_one_out_excess(values: pd.DataFrame) -> pd.DataFrame:
    """``d[r, s] = x[r, s] - median over r' != r of x[r', s]`` on a (step x rank) table.

    Vectorized through each row's sort: removing the element at sorted
    position ``i`` shifts the later ones down by one, so the others' median
    sits at a known sorted index. Missing values (NaN) are ignored.
    """
    x = values.to_numpy(np.float64)
    n_steps, n_ranks = x.shape
    order = np.argsort(x, axis=1, kind="stable")  # NaN sort last
    srt = np.take_along_axis(x, order, axis=1)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.arange(n_ranks)[None, :].repeat(n_steps, axis=0), axis=1)
    m = (np.isfinite(x).sum(axis=1, keepdims=True) - 1).repeat(n_ranks, axis=1)  # others per element
    rows = np.arange(n_steps)[:, None].repeat(n_ranks, axis=1)

    def others_at(j: np.ndarray) -> np.ndarray:
        k = np.where(j < pos, j, j + 1).clip(0, n_ranks - 1)
        at: np.ndarray = srt[rows, k]
        return at

    lo = others_at(np.maximum((m - 1) // 2, 0))
    hi = others_at(np.maximum(m // 2, 0))
    ref = np.where(m % 2 == 1, lo, (lo + hi) / 2.0)
    ref = np.where(m >= 1, ref, np.nan)
    return pd.DataFrame(x - ref, index=values.index, columns=values.columns)


# Phi^-1(0.75), the normal quantile that scales a MAD to a standard deviation (scipy's scale="normal").
_NORMAL_Q3 = 0.6744897501960817


@dataclass(frozen=True)
class _Signal:
    excess_ms: dict[int, float]
    slow_share: dict[int, float]
    sign_p: dict[int, float]
    z: dict[int, float]
    n_steps: dict[int, int]


def sign_test_p(k: int, n: int) -> float:
    """One-sided sign test: P(at least k of n fair coin flips come up "slow").

    The binomial survival function from scipy, which stays finite for any
    ``n`` (a sum of ``comb(n, i) / 2**n`` overflowed a float at n >= 1024,
    i.e. on every run of 1,024 steps or more). 1.0 when ``n`` is 0 or ``k``
    is 0 (no evidence either way).
    """
    if n <= 0 or k <= 0:
        return 1.0
    # scipy.special's binomial complement, bdtrc(k - 1, n, p) = P(X > k - 1), is what
    # scipy.stats.binomtest(..., alternative="greater") returns; importing scipy.stats
    # costs 0.8 s (its docstring machinery) on every cold report, scipy.special 0.2 s.
    from scipy.special import bdtrc

    return float(min(1.0, bdtrc(int(k) - 1, int(n), 0.5)))


def _per_rank(values: pd.Series) -> dict[int, float]:
    """A Series indexed by rank as {rank: value}."""
    return {int(r): float(v) for r, v in zip(values.index.tolist(), values.to_numpy().tolist())}


def _step_by_rank(frame: pd.DataFrame, values: str, how: str) -> pd.DataFrame:
    """``values`` aggregated (``how``) per (step, rank) as a step x rank table, both sorted; NaN where a rank
    has no row for a step. What ``pivot_table`` gives for values without NaN (the step times are dropna'd,
    the lateness sums are never NaN), at a third of its cost (~1 ms a table)."""
    table: pd.DataFrame = frame.groupby(["step", "rank"])[values].agg(how).unstack("rank")
    return table


def _stacked(table: pd.DataFrame, name: str) -> pd.Series:
    """A (step x rank) table as one Series indexed by (step, rank)."""
    stacked = table.stack()
    assert isinstance(stacked, pd.Series)  # single-level columns stack to a Series
    return stacked.rename(name)


def _score(values: pd.DataFrame, cfg: StragglerConfig) -> _Signal | None:
    """Robust per-rank scores of a (step x rank) table in ms; None with fewer than two ranks."""
    if values.shape[1] < 2:
        return None
    d = _leave_one_out_excess(values)
    excess = d.median(axis=0, skipna=True)
    n = d.notna().sum(axis=0)
    # Per-rank MAD scaled to a normal's sigma (scale="normal": times 1.4826).
    # Ranks without a single value are left out (scipy warns on empty slices).
    filled = d.loc[:, (n > 0).to_numpy()].to_numpy(np.float64)
    # scipy.stats.median_abs_deviation(scale="normal", nan_policy="omit"), written out to keep
    # scipy.stats' import (0.8 s) off the cold report: median |x - median x| / Phi^-1(3/4).
    if filled.shape[1]:
        mad = np.nanmedian(np.abs(filled - np.nanmedian(filled, axis=0)), axis=0) / _NORMAL_Q3
    else:
        mad = np.array([])
    pooled_sigma = float(np.nanmedian(mad)) if np.isfinite(mad).any() else 0.0
    sigma = max(pooled_sigma, 0.1 * cfg.min_excess_ms)
    # Standard error of a median of n draws: sqrt(pi/2) * sigma / sqrt(n).
    stderr = _MEDIAN_SE * sigma / np.sqrt(n.clip(lower=1))
    slow = (d >= cfg.min_excess_ms).where(d.notna())
    n_slow = slow.sum(axis=0, skipna=True)
    return _Signal(
        excess_ms=_per_rank(excess),
        slow_share=_per_rank(slow.mean(axis=0, skipna=True)),
        sign_p={int(r): sign_test_p(int(n_slow[r]), int(n[r])) for r in excess.index.tolist()},
        z={int(r): float(excess[r] / stderr[r]) for r in excess.index.tolist()},
        n_steps={r: int(v) for r, v in _per_rank(n).items()},
    )


def _flags(sig: _Signal | None, rank: int, step_ms: float | None, cfg: StragglerConfig) -> bool:
    if sig is None or rank not in sig.excess_ms:
        return False
    excess = sig.excess_ms[rank]
    return (
        sig.n_steps[rank] >= cfg.min_steps
        and sig.slow_share[rank] >= cfg.min_slow_share
        and sig.sign_p[rank] <= cfg.max_sign_p
        and sig.z[rank] >= cfg.min_z
        and excess >= cfg.min_excess_ms
        and (step_ms is None or excess >= cfg.min_excess_frac * step_ms)
    )


def find_stragglers(
    step_times: pd.DataFrame,
    arrivals: pd.DataFrame,
    *,
    step_source: str | None,
    arrival_source: str | None,
    config: StragglerConfig = StragglerConfig(),
) -> StragglerResult:
    """Per-rank straggler evidence and verdict (see module doc).

    ``step_times`` has ``rank, step, step_time_ms`` (steady-state steps of the
    metrics records, or ProfilerStep windows); ``arrivals`` has
    :data:`ARRIVAL_COLUMNS` on a common clock (may be empty).
    """
    cfg = config
    notes: list[str] = []
    st = step_times[["rank", "step", "step_time_ms"]].dropna() if not step_times.empty else step_times
    ranks = sorted(
        (set(st["rank"].astype(int)) if not st.empty else set())
        | (set(arrivals["rank"].astype(int)) if not arrivals.empty else set())
    )
    step_table = _step_by_rank(st, "step_time_ms", "mean") if not st.empty else pd.DataFrame()
    step_sig = _score(step_table, cfg) if not step_table.empty else None
    median_step_ms = float(st["step_time_ms"].median()) if not st.empty else None

    waits = (
        _rank_waits(arrivals)
        if not arrivals.empty
        else pd.DataFrame(columns=["rank", "step", "lateness_ns", "wait_ns", "is_last", "key"])
    )
    late_table = pd.DataFrame()
    if not waits.empty:
        per = waits.loc[waits["step"] >= 0] if (waits["step"] >= 0).any() else waits.assign(step=0)
        late_table = _step_by_rank(per, "lateness_ns", "sum") / 1e6
    late_sig = _score(late_table, cfg) if not late_table.empty else None

    per_step = pd.DataFrame()
    ratio = pd.DataFrame()
    if not step_table.empty:
        ratio = step_table.div(step_table.median(axis=1), axis=0)
        per_step = _stacked(step_table, "step_time_ms").to_frame().join(_stacked(ratio, "step_time_ratio"))
        if not late_table.empty:
            per_step = per_step.join(_stacked(late_table, "lateness_ms"), how="outer")
        per_step = per_step.reset_index()

    per_rank = _rank_records(ranks, step_table, ratio, waits, step_sig, late_sig, median_step_ms, cfg)

    flagged = [r.rank for r in per_rank if r.flagged]
    if len(ranks) < 2:
        verdict = "no verdict: stragglers need two or more ranks"
    elif max((len(step_table),) + ((len(late_table),) if not late_table.empty else ())) < cfg.min_steps:
        verdict = f"no verdict: fewer than {cfg.min_steps} steps to judge persistence"
    elif flagged:
        verdict = "persistent straggler(s): " + "; ".join(r.evidence for r in per_rank if r.flagged)
    else:
        verdict = f"no persistent straggler among {len(ranks)} ranks"
    if arrivals.empty and len(ranks) >= 2:
        notes.append("no collectives matched across ranks: verdict from step times only")
    return StragglerResult(
        ranks=flagged,
        per_rank=per_rank,
        verdict=verdict,
        step_source=step_source,
        arrival_source=arrival_source if not arrivals.empty else None,
        config=cfg,
        per_step=per_step,
        notes=notes,
    )


def _rank_records(
    ranks: list[int],
    step_table: pd.DataFrame,
    ratio: pd.DataFrame,
    waits: pd.DataFrame,
    step_sig: _Signal | None,
    late_sig: _Signal | None,
    median_step_ms: float | None,
    cfg: StragglerConfig,
) -> list[RankStraggle]:
    """One :class:`RankStraggle` per rank: its step times (``step_table``, step x rank, and ``ratio`` to the
    step's median), its arrival totals (``waits``), the two signals' scores and whether they flag it."""
    # Per-rank arrival totals in one pass over the (rank, collective) rows.
    empty = pd.Series(dtype="float64")
    if not waits.empty:
        by_rank = waits.groupby("rank")
        n_colls, n_last, wait_ns = by_rank.size(), by_rank["is_last"].sum(), by_rank["wait_ns"].sum()
        # The others' wait at a collective is its total wait (the last arriver waits 0).
        coll_wait = waits.groupby("key")["wait_ns"].sum()
        last = waits.loc[waits["is_last"], ["key", "rank"]]
        caused_ns = (
            pd.Series(coll_wait.reindex(last["key"]).to_numpy(), index=last["rank"].to_numpy()).groupby(level=0).sum()
        )
    else:
        n_colls = n_last = wait_ns = caused_ns = empty
    step_n = step_table.notna().sum() if not step_table.empty else empty
    step_median = step_table.median() if not step_table.empty else empty
    ratio_median = ratio.median() if not ratio.empty else empty

    def get(series: pd.Series, r: int) -> float | None:
        return series.get(r) if len(series) else None

    def total(series: pd.Series, r: int) -> float:  # a count or sum: 0 for a rank absent from it
        value = get(series, r)
        return 0.0 if value is None else float(value)

    per_rank: list[RankStraggle] = []
    for r in ranks:  # one record per rank; every number above is already aggregated
        signals = []
        if _flags(step_sig, r, median_step_ms, cfg):
            signals.append("step_time")
        if _flags(late_sig, r, median_step_ms, cfg):
            signals.append("lateness")
        step_ms = get(step_median, r)
        ratio_r = get(ratio_median, r)
        rs = RankStraggle(
            rank=r,
            n_steps=int(total(step_n, r)),
            step_time_ms=float(step_ms) if step_ms is not None else None,
            step_time_ratio=float(ratio_r) if ratio_r is not None else None,
            step_excess_ms=step_sig.excess_ms.get(r) if step_sig else None,
            step_slow_share=step_sig.slow_share.get(r) if step_sig else None,
            step_sign_p=step_sig.sign_p.get(r) if step_sig else None,
            step_z=step_sig.z.get(r) if step_sig else None,
            lateness_excess_ms=late_sig.excess_ms.get(r) if late_sig else None,
            lateness_slow_share=late_sig.slow_share.get(r) if late_sig else None,
            lateness_sign_p=late_sig.sign_p.get(r) if late_sig else None,
            lateness_z=late_sig.z.get(r) if late_sig else None,
            last_arrivals=int(total(n_last, r)),
            n_collectives=int(total(n_colls, r)),
            wait_ms=total(wait_ns, r) / 1e6,
            caused_wait_ms=total(caused_ns, r) / 1e6,
            flagged=bool(signals),
            signals=signals,
        )
        rs.evidence = _evidence(rs)
        per_rank.append(rs)
    return per_rank


def _evidence(r: RankStraggle) -> str:
    """One sentence of numbers: arrivals, then the lateness and step-time signals."""
    parts = [f"rank {r.rank}"]
    if r.n_collectives:
        parts.append(
            f"arrived last at {r.last_arrivals}/{r.n_collectives} collectives "
            f"({100.0 * r.last_arrivals / r.n_collectives:.0f}%), the others waited {r.caused_wait_ms:.1f} ms on it in total"
        )
    if r.lateness_excess_ms is not None:
        parts.append(
            f"median lateness {r.lateness_excess_ms:+.2f} ms/step vs the other ranks "
            f"(late in {100.0 * (r.lateness_slow_share or 0):.0f}% of steps, sign-test p {r.lateness_sign_p:.3f}, "
            f"robust z {r.lateness_z:.1f})"
        )
    if r.step_excess_ms is not None and ("step_time" in r.signals or r.lateness_excess_ms is None):
        parts.append(
            f"step time {r.step_time_ms:.2f} ms, {r.step_excess_ms:+.2f} ms vs the other ranks "
            f"(ratio to median {r.step_time_ratio:.3f}, slow in {100.0 * (r.step_slow_share or 0):.0f}% of steps, "
            f"sign-test p {r.step_sign_p:.3f}, robust z {r.step_z:.1f})"
        )
    return ", ".join(parts)
