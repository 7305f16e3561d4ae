"""What a step's forward and backward do: tokens from the input shapes, and activation recompute.

One row per step window of a rank (:func:`rank_workload`); docs/metrics.md
and docs/suggestions.md ("Recompute", "Tokens per step") define the columns.

**Tokens** (``tokens``, ``tokens_source``): the token ids the step embeds.
``aten::embedding`` records ``Input Dims`` ``[weight, ids]`` with
``record_shapes=True``: the step's tokens are the element count of ``ids``
(``[batch, seq]``, or ``[n]`` for packed sequences), summed over the calls
outside backward whose weight has the shape of the window's first call
(the token embedding: a position or token-type embedding of another shape
takes the same ids and is not counted again; a grad-accumulation step
embeds each micro-batch once, so each is counted). Without an embedding,
the first ``aten::linear`` of the window with a 3-D input ``[batch, seq,
hidden]`` gives ``batch x seq`` (one micro-batch: later forwards are not
told apart from the model's other layers). Otherwise NaN.

**Recompute** (activation checkpointing): a forward op run during backward
(:func:`analyzer.metrics.passes.recompute_ops` defines it for both of
``torch.utils.checkpoint``'s implementations). Per window:

* ``recompute_ranges``: disjoint host ranges the outermost recompute ops cover;
* ``recompute_host_ms``: their union;
* ``recompute_device_ms``: device kernels (compute and memcpy/memset, not
  communication) whose launch call lies inside those ranges on the same
  thread, summed; on a trace without device events, the host union (the
  ops are the compute);
* ``recompute_flop_ms``: the part of it in GEMM, attention and convolution
  kernels (:data:`analyzer.metrics.taxonomy.FLOP_CLASSES`); without
  device events, the union of the recompute ops named in FLOP_OPS;
* ``recompute_flop_ops``: outermost recomputed matmul-like ops
  (MATMUL_OPS; a linear's inner addmm is not counted again), and
  ``recompute_out_bytes`` their outputs' bytes (shape from ``Input Dims``,
  element size from ``Input type``; ``recompute_shaped`` of them had a
  known size): what saving those outputs instead of recomputing them
  holds in memory until backward;
* ``reentrant``: the window's recompute runs inside ``CheckpointFunctionBackward``.

A window is the step's ``[start_ns, end_ns)``; an op or a launch belongs to
the window its start lies in.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

from analyzer.ingest.tables import DEVICE_KINDS, FLOP_OPS, MATMUL_OPS
from analyzer.metrics.dtypes import INPUT_TYPES
from analyzer.metrics.launch import launches
from analyzer.metrics.passes import in_backward, inside, recompute_ops, thread_ranges
from analyzer.metrics.taxonomy import FLOP_CLASSES, kernel_class
from analyzer.metrics.text import is_in, text_mask

EMBEDDING_OP = "aten::embedding"
REENTRANT_NODE = "CheckpointFunctionBackward"

COLUMNS = {
    "step": np.int64,
    "tokens": np.float64,
    "tokens_source": object,
    "recompute_ranges": np.int64,
    "recompute_host_ms": np.float64,
    "recompute_device_ms": np.float64,
    "recompute_flop_ms": np.float64,
    "recompute_flop_ops": np.int64,
    "recompute_shaped": np.int64,
    "recompute_out_bytes": np.float64,
    "reentrant": bool,
}


def empty_workload() -> pd.DataFrame:
    """The table of a rank without windows (COLUMNS, no rows)."""
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in COLUMNS.items()})


def _dims(text: object) -> list[Any] | None:
    if not isinstance(text, str):
        return None
    try:
        dims = json.loads(text)
    except json.JSONDecodeError:
        return None
    return dims if isinstance(dims, list) else None


def _shape(d: object) -> list[int] | None:
    if not isinstance(d, list) or not d or not all(isinstance(x, int) and x >= 0 for x in d):
        return None
    return d


def output_numel(name: str, dims: list[Any] | None) -> int | None:
    """Elements of a matmul-like op's output from its input dims; None when the dims do not say.

    ``aten::linear`` ``[..., k] x [n, k]``: ``prod(...) n``; ``aten::mm``,
    ``aten::addmm`` (bias first), ``aten::bmm``, ``aten::baddbmm``:
    ``[.., m, k] x [.., k, n]`` -> ``prod(batch) m n``; ``aten::matmul`` the
    same with broadcast batch dims; ``aten::scaled_dot_product_attention``
    ``q [..., L, E]``, ``v [..., S, Ev]`` -> ``prod(...) L Ev``.
    """
    if not dims:
        return None
    shapes = [_shape(d) for d in dims]
    try:
        if name == "aten::linear":
            a, w = shapes[0], shapes[1]
            return math.prod(a[:-1]) * w[0] if a and w and len(w) == 2 else None
        if name in ("aten::addmm", "aten::baddbmm"):
            shapes = shapes[1:]
        if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul"):
            a, b = shapes[0], shapes[1]
            if not a or not b or len(a) < 2 or len(b) < 2:
                return None
            batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
            return math.prod(batch) * a[-2] * b[-1]
        if name == "aten::scaled_dot_product_attention":
            q, v = shapes[0], shapes[2]
            return math.prod(q[:-1]) * v[-1] if q and v else None
    except (IndexError, TypeError, ValueError):  # ValueError: batch dims that do not broadcast
        return None
    return None


def _element_bytes(types: object) -> int | None:
    t = _dims(types)
    if not t:
        return None
    return INPUT_TYPES[t[0]][0] if isinstance(t[0], str) and t[0] in INPUT_TYPES else None


def _window_of(t: np.ndarray, w_start: np.ndarray, w_end: np.ndarray) -> np.ndarray:
    """Per instant: the position of the window it lies in, -1 for none (windows sorted, disjoint)."""
    k = np.searchsorted(w_start, t, side="right") - 1
    ok = (k >= 0) & (t < w_end[np.clip(k, 0, None)])
    return np.where(ok, k, -1)


def _outermost(frame: pd.DataFrame) -> np.ndarray:
    """Per row of ``frame``: no other row of the same thread contains it (ops nest like a call stack)."""
    out = np.ones(len(frame), dtype=bool)
    if frame.empty:
        return out
    key = frame["pid"].to_numpy(np.int64), frame["tid"].to_numpy(np.int64)
    start, end = frame["start_ns"].to_numpy(np.int64), frame["end_ns"].to_numpy(np.int64)
    order = np.lexsort((-end, start, key[1], key[0]))
    same = np.r_[False, (key[0][order][1:] == key[0][order][:-1]) & (key[1][order][1:] == key[1][order][:-1])]
    # The latest end among earlier rows of the thread: a row ending no later than it is inside one of them.
    group = np.cumsum(~same)
    prev_end = pd.Series(end[order]).groupby(group).cummax().shift(1).to_numpy()
    nested = same & (np.nan_to_num(prev_end, nan=-np.inf) >= end[order])
    out[order[nested]] = False
    return out


def _tokens(
    events: pd.DataFrame, backward: np.ndarray, w_start: np.ndarray, w_end: np.ndarray
) -> tuple[np.ndarray, list[str | None]]:
    n = len(w_start)
    tokens = np.full(n, np.nan)
    sources: list[str | None] = [None] * n
    if n == 0:
        return tokens, sources
    names = events["name"]
    for op in (EMBEDDING_OP, "aten::linear"):
        rows = np.flatnonzero(is_in(names, (op,)) & ~backward & events["input_dims"].notna().to_numpy())
        if rows.size == 0:
            continue
        start = events["start_ns"].to_numpy(np.int64)[rows]
        dims_text = events["input_dims"].to_numpy(object)[rows]
        win = _window_of(start, w_start, w_end)
        # The rows by window, then start (lexsort is stable: ties in table order); one selection and
        # sort per window of the frame cost 0.3 ms a step.
        order = np.lexsort((start, win))
        for k in range(n):
            if not np.isnan(tokens[k]):
                continue
            mine = order[win[order] == k]
            calls = [d for d in (_dims(x) for x in dims_text[mine]) if d and len(d) >= 2]
            if op == EMBEDDING_OP:
                calls = [d for d in calls if _shape(d[0]) and _shape(d[1])]
                if not calls:
                    continue
                weight = calls[0][0]
                same = [d for d in calls if d[0] == weight]
                tokens[k] = float(sum(math.prod(d[1]) for d in same))
                sources[k] = (
                    f"aten::embedding input ids {calls[0][1]} (weight {weight}), {len(same)} call(s) in the step"
                )
            else:
                first = next((d for d in calls if _shape(d[0]) and len(d[0]) == 3), None)
                if first is None:
                    continue
                tokens[k] = float(first[0][0] * first[0][1])
                sources[k] = f"first aten::linear input {first[0]} (batch x seq of one micro-batch)"
    return tokens, sources


def rank_workload(events: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per step window of one rank: tokens from the input shapes and the recompute figures (module doc)."""
    if steps is None or steps.empty:
        return empty_workload()
    w = steps.sort_values("start_ns", kind="stable")
    w_start, w_end = w["start_ns"].to_numpy(np.int64), w["end_ns"].to_numpy(np.int64)
    n = len(w)
    out = {c: np.zeros(n, dtype=t if t is not object else object) for c, t in COLUMNS.items()}
    out["step"] = w["step"].to_numpy(np.int64)
    out["recompute_out_bytes"] = np.zeros(n)

    names = events["name"]
    backward = in_backward(events)

    tokens, sources = _tokens(events, backward, w_start, w_end)
    out["tokens"], out["tokens_source"] = tokens, np.array(sources, dtype=object)

    rec = recompute_ops(events, backward)
    if rec.any():
        ops = events.loc[rec, ["name", "pid", "tid", "start_ns", "end_ns", "input_dims", "input_types"]]
        rec_ranges = thread_ranges(ops)
        op_win = _window_of(ops["start_ns"].to_numpy(np.int64), w_start, w_end)
        for (p, q), (s, e) in rec_ranges.items():
            win = _window_of(s, w_start, w_end)
            for k in range(n):
                mine = win == k
                out["recompute_ranges"][k] += int(mine.sum())
                out["recompute_host_ms"][k] += float((e[mine] - s[mine]).sum()) / 1e6
        reentrant_nodes = events.loc[text_mask(names, lambda s: s.endswith(REENTRANT_NODE)), "start_ns"]
        for k in _window_of(reentrant_nodes.to_numpy(np.int64), w_start, w_end):
            if k >= 0:
                out["reentrant"][k] = True

        device = is_in(events["kind"], DEVICE_KINDS) & ~is_in(events["kind"], ("comm",))
        if device.any():
            link = launches(events)
            link = link.loc[link.index.isin(events.index[device])]
            launched = inside(
                rec_ranges,
                link["pid"].to_numpy(np.int64),
                link["tid"].to_numpy(np.int64),
                link["start_ns"].to_numpy(np.int64),
            )
            link = link.loc[launched]
            dur = (events.loc[link.index, "end_ns"] - events.loc[link.index, "start_ns"]).to_numpy(np.float64) / 1e6
            cls = kernel_class(events.loc[link.index])
            flop = np.isin(cls.astype(str), list(FLOP_CLASSES))
            win = _window_of(link["start_ns"].to_numpy(np.int64), w_start, w_end)
            for k in range(n):
                out["recompute_device_ms"][k] = float(dur[win == k].sum())
                out["recompute_flop_ms"][k] = float(dur[(win == k) & flop].sum())
        else:
            out["recompute_device_ms"] = out["recompute_host_ms"].copy()
            flop_ops = ops.loc[is_in(ops["name"], FLOP_OPS)]
            for (p, q), (s, e) in thread_ranges(flop_ops).items():
                win = _window_of(s, w_start, w_end)
                for k in range(n):
                    out["recompute_flop_ms"][k] += float((e[win == k] - s[win == k]).sum()) / 1e6

        mm = is_in(ops["name"], MATMUL_OPS)
        mm_ops = ops.loc[mm]
        top = _outermost(mm_ops)
        for (name, dims, types), k in zip(
            mm_ops.loc[top, ["name", "input_dims", "input_types"]].itertuples(index=False), op_win[mm][top]
        ):
            if k < 0:
                continue
            out["recompute_flop_ops"][k] += 1
            numel, size = output_numel(str(name), _dims(dims)), _element_bytes(types)
            if numel is not None and size is not None:
                out["recompute_shaped"][k] += 1
                out["recompute_out_bytes"][k] += float(numel * size)
    table = pd.DataFrame(out)
    return table.astype({c: t for c, t in COLUMNS.items() if t is not object}).reset_index(drop=True)
