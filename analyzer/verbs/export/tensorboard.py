"""Export to TensorBoard event files (``analyzer export RUN --to tensorboard DIR``).

Written with TensorBoard's own event writer (``tensorboard`` package, extra
``trackers``), so TensorBoard, tbparse and EventAccumulator read it: the
training curves as scalars ``train/<metric>`` at their optimizer step, and
the analysis as scalars at step 0: ``analysis/mfu``, ``analysis/hfu``,
``analysis/step_time_ms``, and per rank ``rank<R>/<column>`` of the ranks
table (docs/cli.md, export). Scalars are float32 in the event format.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import pandas as pd

from analyzer.errors import AnalyzerError
from analyzer.verbs.export import curve_points

EXTRA_LINE = "export to tensorboard needs the tensorboard package: pip install 'trainperf[trackers]'"


def write_tensorboard(tables: dict[str, pd.DataFrame], out_dir: Path) -> Path:
    """Write one event file into ``out_dir``; its path."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise AnalyzerError(EXTRA_LINE) from None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AnalyzerError(f"{out_dir}: cannot create the export folder ({exc.strerror or exc})") from None
    writer = EventFileWriter(str(out_dir))
    wall = time.time()

    def scalar(tag: str, value, step: int) -> None:
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=float(value))])
        writer.add_event(event_pb2.Event(wall_time=wall, step=int(step), summary=summary))

    for tag, step, value in curve_points(tables):
        scalar(tag, float(value), step)
    summary = tables["summary"].iloc[0]
    for col in ("mfu", "hfu", "step_time_ms", "flop_coverage"):
        v = summary.get(col)
        scalar(f"analysis/{col}", None if v is None or pd.isna(v) else float(v), 0)
    ranks = tables.get("ranks")
    if ranks is not None:
        for row in ranks.to_dict("records"):
            for col, v in row.items():
                if col not in ("rank", "timeline", "device_name", "n_steps") and v is not None and not pd.isna(v):
                    scalar(f"rank{row['rank']}/{col}", float(v), 0)
    writer.flush()
    path = Path(writer.get_logdir())
    writer.close()
    return path
