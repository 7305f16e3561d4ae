"""The rank-summary cache (analyzer/rankcache.py; docs/loading.md "Cache").

A second analysis of unchanged traces must give the same whole report
without running the per-rank map (nothing reads a trace); a changed file, a
corrupt entry or a planted one must never be served.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import analyzer.engines
from analyzer import rankcache
from analyzer.api import analyze
from analyzer.metrics.overlap import OverlapResult
from tests.synth import KinetoTrace

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "traces"


def _report(a, *, warnings: bool = True) -> str:
    doc = a.to_json()
    if not warnings:
        doc.pop("warnings")
    return json.dumps(doc, sort_keys=True, default=str)


def _summaries(folder: Path) -> list[Path]:
    return sorted(folder.rglob(f"*{rankcache.SUFFIX}"))


def _forbid_map(monkeypatch) -> None:
    """From here on, fail the test if the per-rank map runs on any unit."""
    real = analyzer.engines.run_map

    def guarded(units, *args, **kwargs):
        assert list(units) == [], f"the map ran on {len(units)} unit(s)"
        return real(units, *args, **kwargs)

    monkeypatch.setattr(analyzer.engines, "run_map", guarded)


def _synth_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "synth"
    folder.mkdir()
    for rank in (0, 1):
        t = KinetoTrace(rank=rank, world_size=2)
        for i in range(3):
            t.step(i + 1, 1000 * i, 1000)
            t.kernel("sgemm", 1000 * i + 100, 300 + 50 * rank)
            t.kernel(
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                1000 * i + 450,
                200,
                stream=20,
                args=t.comm_args("allreduce", 1 << 20),
            )
        t.write(folder / f"rank{rank}.json.gz")
    return folder


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".analyzer-cache"))
    return dst


def test_codec_round_trip_keeps_types():
    frame = pd.DataFrame(
        {
            "i": np.array([1, 2, 3], dtype=np.int64),
            "f": [0.5, np.nan, np.inf],
            "b": [True, False, True],
            "cat": pd.Categorical(["a", "b", "a"]),
            "s": pd.array(["x", None, "z"], dtype="str"),
            "o": np.array([("k", 1), None, float("nan")], dtype=object),
            "n": pd.array([1, None, 3], dtype="Int64"),
            "u8": np.array([1, 2, 3], dtype=np.uint8),
        },
        index=pd.Index([10, 20, 30], name="row"),
    )
    value = {
        "frame": frame,
        "empty": pd.DataFrame({"step": np.array([], dtype=np.int64)}),
        "arr": np.arange(6, dtype=np.int32).reshape(2, 3),
        "scalar": np.float64(2.5),
        "int_keys": {3: "three", (1, 2): [1.0, -math.inf]},
        "nan": math.nan,
        "path": Path("a/b.json"),
        "dc": OverlapResult(comm_ns=1, comm_overlapped_ns=0, compute_ns=5, busy_ns=6, span_ns=9, n_device_events=2),
    }
    arrays: list[np.ndarray] = []
    back = rankcache.decode(json.loads(json.dumps(rankcache.encode(value, arrays))), arrays)
    pd.testing.assert_frame_equal(back["frame"], frame, check_exact=True)
    assert list(back["frame"].dtypes.astype(str)) == list(frame.dtypes.astype(str))
    pd.testing.assert_frame_equal(back["empty"], value["empty"], check_exact=True)
    assert back["arr"].dtype == np.int32 and back["arr"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert type(back["scalar"]) is np.float64 and back["scalar"] == 2.5
    assert back["int_keys"] == {3: "three", (1, 2): [1.0, -math.inf]}
    assert math.isnan(back["nan"]) and back["path"] == Path("a/b.json") and back["dc"] == value["dc"]


def test_codec_refuses_what_it_cannot_rebuild():
    @dataclass
    class Elsewhere:
        x: int

    with pytest.raises(TypeError, match="cannot hold"):
        rankcache.encode(Elsewhere(1), [])
    with pytest.raises(TypeError, match="cannot hold"):
        rankcache.encode({1, 2}, [])


@pytest.mark.parametrize("source", ["example-ddp-w2", "synth"])
def test_second_analysis_is_the_same_report_from_summaries(source, tmp_path, monkeypatch):
    folder = _synth_folder(tmp_path) if source == "synth" else _copy(REPO / "traces" / source, tmp_path / source)
    fresh = analyze(folder, cache=False)
    assert _summaries(folder) == []  # cache=False writes nothing
    first = analyze(folder)
    assert len(_summaries(folder)) == 2 and first.warnings == fresh.warnings
    _forbid_map(monkeypatch)
    second = analyze(folder)
    assert _report(second) == _report(first) == _report(fresh)
    assert second.warnings == fresh.warnings and [str(e) for e in second.errors] == [str(e) for e in fresh.errors]


def test_shared_nccl_trace_from_its_summary(tmp_path, monkeypatch):
    src = SHARED / "hta-samples" / "nccl_parser_config"
    if not src.is_dir():
        pytest.skip(f"{src}: shared traces not present (only in the project's CI and workspace)")
    folder = _copy(src, tmp_path / "nccl")
    fresh = analyze(folder, cache=False)
    analyze(folder)
    _forbid_map(monkeypatch)
    assert _report(analyze(folder)) == _report(fresh)


def test_a_changed_trace_is_summarized_again_and_its_old_summary_removed(tmp_path):
    folder = _synth_folder(tmp_path)
    analyze(folder)
    before = _summaries(folder)
    # Rank 0 replaced by a trace with a longer GEMM: same name, other content.
    t = KinetoTrace(rank=0, world_size=2)
    for i in range(3):
        t.step(i + 1, 1000 * i, 1000)
        t.kernel("sgemm", 1000 * i + 100, 700)
        t.kernel(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            1000 * i + 850,
            100,
            stream=20,
            args=t.comm_args("allreduce", 1 << 20),
        )
    t.write(folder / "rank0.json.gz")
    again = analyze(folder)
    assert _report(again) == _report(analyze(folder, cache=False))
    after = _summaries(folder)
    assert len(after) == 2 and len(set(after) - set(before)) == 1  # rank 0's entry replaced, rank 1's kept
    rank0 = next(r for r in again.ranks if r.rank == 0)
    assert rank0.breakdown["compute"]["median_ms"] == pytest.approx(0.7)  # the new 700 us GEMM, not the old 300 us


def test_a_corrupt_summary_is_one_warning_then_rewritten(tmp_path):
    folder = _synth_folder(tmp_path)
    fresh = analyze(folder)
    entry = _summaries(folder)[0]
    entry.write_bytes(entry.read_bytes()[:100])
    hurt = analyze(folder)
    (warning,) = [w for w in hurt.warnings if "rank summary" in w]
    assert entry.name in warning and "unreadable" in warning and warning.endswith("summarized again")
    assert _report(hurt, warnings=False) == _report(fresh, warnings=False)
    assert not [w for w in analyze(folder).warnings if "rank summary" in w]


def test_a_planted_summary_cannot_name_another_class(tmp_path):
    """An entry is data: a class outside the registry (here subprocess.Popen) is refused, never built."""
    folder = _synth_folder(tmp_path)
    fresh = analyze(folder)
    entry = _summaries(folder)[0]
    data = entry.read_bytes()
    start = len(b"trainperf rank summary\n") + 8
    n = int.from_bytes(data[start - 8 : start], "little")
    meta = json.loads(data[start : start + n])
    meta["result"] = {"$": "dc", "cls": "Popen", "v": {"args": ["touch", str(tmp_path / "pwned")]}}
    planted = json.dumps(meta).encode()
    entry.write_bytes(data[: start - 8] + len(planted).to_bytes(8, "little") + planted + data[start + n :])
    hurt = analyze(folder)
    (warning,) = [w for w in hurt.warnings if "rank summary" in w]
    assert "unreadable (unknown class 'Popen')" in warning
    assert not (tmp_path / "pwned").exists() and _report(hurt, warnings=False) == _report(fresh, warnings=False)


def test_a_rank_with_a_bad_file_is_not_stored(tmp_path):
    folder = _synth_folder(tmp_path)
    (folder / "rank1.json.gz").write_bytes(b"\x1f\x8b not really gzip")
    a = analyze(folder)
    assert len(a.errors) == 1 and "rank1.json.gz" in str(a.errors[0])
    assert [p.name.split(".")[0] for p in _summaries(folder)] == ["rank0"]
    assert len(analyze(folder).errors) == 1  # reported again, not hidden by a cache
