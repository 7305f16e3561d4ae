"""Export to TensorBoard event files (``analyzer export RUN --to tensorboard DIR``).

Written with TensorBoard's own event writer (``tensorboard`` package, extra
``trackers``), so TensorBoard, tbparse and EventAccumulator read it, into
``DIR/<run name>/`` so that each exported run is its own TensorBoard run
(as the trainer's live logger writes ``<tensorboard_dir>/<run id>/``): the
training curves as scalars ``run/<metric>`` at their optimizer step (over
all ranks), and the analysis as scalars at step 0: ``analysis/<figure>`` of
the summary and per rank ``rank<R>/<column>`` of the ranks table
(docs/export.md). Scalars are float32 in the event format; TensorBoard has
no artifacts, so the report is not attached.

Re-exporting a run replaces its earlier export: the event files this export
writes end in ``.analyzer``, and those already in the run's folder are
removed first (a TensorBoard run that holds two exports shows every point
twice). Other event files there (the trainer's own) are left alone.

``--run-id RUN`` names the TensorBoard run to attach the analysis to: the
folder ``DIR/RUN/`` (a TensorBoard run is named by its folder under the
log root), which must already hold the live run's event files, so that the
analysis is the same TensorBoard run as the trainer's scalars. reftrain
with ``--tensorboard-dir DIR`` writes ``DIR/<run id>/`` (the default
without ``--run-id``); without it, ``RUN_DIR/tb/``: ``--to tensorboard
RUN_DIR --run-id tb``. The trainer's tags are ``train/*`` and ``summary/*``,
the export's ``run/*``, ``analysis/*`` and ``rank<R>/*``: they never mix.
"""

from __future__ import annotations

import time
from pathlib import Path

from analyzer.errors import AnalyzerError
from analyzer.verbs.export import Export, curve_points, finite, summary_figures

EXTRA_LINE = "export to tensorboard needs the tensorboard package: pip install 'trainperf[trackers]'"
SUFFIX = ".analyzer"


def write_tensorboard(export: Export, out_dir: Path, run_id: str | None = None) -> Path:
    """Write one event file into ``out_dir/<run name>/``, or into the live run's ``out_dir/<run_id>/`` (replacing
    an earlier export's); that folder."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise AnalyzerError(EXTRA_LINE) from None
    run_dir = out_dir / export.run_name if run_id is None else live_run_dir(out_dir, run_id)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        for old in run_dir.glob(f"events.out.tfevents.*{SUFFIX}"):
            old.unlink()
    except OSError as exc:
        raise AnalyzerError(f"{run_dir}: cannot write the export folder ({exc.strerror or exc})") from None
    writer = EventFileWriter(str(run_dir), filename_suffix=SUFFIX)
    wall = time.time()

    def scalar(tag: str, value: object, step: int) -> None:
        v = finite(value)
        if v is None:
            return
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=v)])
        writer.add_event(event_pb2.Event(wall_time=wall, step=int(step), summary=summary))

    for tag, step, value in curve_points(export.tables):
        scalar(tag, value, step)
    for tag, value in summary_figures(export.tables).items():
        scalar(tag, value, 0)
    writer.flush()
    writer.close()
    return run_dir


def live_run_dir(out_dir: Path, run_id: str) -> Path:
    """``out_dir/run_id``, the TensorBoard run a live logger wrote; AnalyzerError when ``run_id`` leaves
    ``out_dir`` or the folder holds no event file but an export's."""
    rel = Path(run_id)
    if rel.is_absolute() or ".." in rel.parts:
        raise AnalyzerError(f"--run-id {run_id!r}: a TensorBoard run is a folder under {out_dir}, named relative to it")
    run_dir = out_dir / rel
    if not any(not p.name.endswith(SUFFIX) for p in run_dir.glob("events.out.tfevents.*")):
        raise AnalyzerError(f"{run_dir}: no TensorBoard event files of a live run there (--run-id names its folder)")
    return run_dir
