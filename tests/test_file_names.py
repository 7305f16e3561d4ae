"""A run directory's file names have one definition each, in
analyzer.ingest.formats: the names reftrain writes are the names the readers match."""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path

import pytest

from analyzer.ingest import formats as fmt
from analyzer.ingest.locate import trace_window
from analyzer.ingest.rundir import _rank_from_name


@pytest.mark.parametrize(
    "family, rank, attempt, name",
    [
        ("metrics", 0, 0, "metrics/rank0.jsonl"),
        ("metrics", 3, 2, "metrics/attempt2/rank3.jsonl"),
        ("collectives", 12, 0, "collectives/rank12.jsonl"),
        ("collectives", 1, 1, "collectives/attempt1/rank1.jsonl"),
        ("telemetry", 5, 0, "telemetry/gpu5.jsonl"),
        ("telemetry", 5, 3, "telemetry/gpu5.jsonl"),  # one sampler file per rank across attempts
    ],
)
def test_records_files_are_read_back_with_their_rank(family, rank, attempt, name):
    assert fmt.records_file(family, rank, attempt) == name  # as reftrain has always written them
    assert _rank_from_name(name) == rank
    # The first attempt's files are found on disk by the reader's glob; later ones are listed in run.json.
    assert fnmatch(name, fmt.RECORDS_GLOB[family]) == (attempt == 0 or family == "telemetry")


def test_trace_files_are_read_back_with_their_window():
    name = fmt.trace_file(7, 1)
    assert name == "step7/rank1.pt.trace.json.gz" and fmt.trace_window_dir(7) == "step7"
    assert trace_window(Path("run/traces") / name) == 7
    assert trace_window(Path("run/traces/attempt1") / fmt.trace_file(12, 0)) == 12
    assert trace_window(Path("run/traces/rank3.step9.json.gz")) == 9  # the layout before window folders
    assert trace_window(Path("run/traces/step7/worker0.json")) is None  # not a reftrain trace


def test_attempt_folders():
    assert [fmt.attempt_folder(k) for k in range(3)] == ["", "attempt1/", "attempt2/"]
