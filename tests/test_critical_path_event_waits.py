"""Event record/wait in the dependency graph: a synthesized Kineto trace with cudaEventRecord,
cudaStreamWaitEvent and cudaEventSynchronize and their cuda_sync events, loaded from its JSON (the
loader's ``wait_stream``/``record_corr`` columns) and built into exact edges."""

from __future__ import annotations

from pathlib import Path

from analyzer.ingest.load import load_trace
from analyzer.metrics.depgraph import HTA_RULES, build_step_graph
from synth import KinetoTrace
from test_depgraph import check_invariants, edges


def _cuda_sync(kt: KinetoTrace, name: str, start_us: int, dur_us: int, stream: int, corr: int, recorded: int) -> None:
    kt.raw(
        {
            "ph": "X",
            "cat": "cuda_sync",
            "name": name,
            "pid": kt.device,
            "tid": stream,
            "ts": start_us,
            "dur": dur_us,
            "args": {
                "cuda_sync_kind": name,
                "wait_on_stream": 7,
                "wait_on_cuda_event_record_corr_id": recorded,
                "wait_on_cuda_event_id": 1,
                "stream": stream,
                "correlation": corr,
                "device": kt.device,
                "context": 1,
            },
        }
    )


def record_wait_trace(tmp_path: Path) -> Path:
    """Step 1, 0..200 us. K1 (stream 7, 10..60, launched at 0) is recorded at 20; stream 20 waits on
    that record (cudaStreamWaitEvent at 30), so K2 (launched at 40) starts at 61 after K1. K3
    (stream 7, 80..105, launched at 70) is recorded at 76 and the host waits on that record in
    cudaEventSynchronize 85..110: released at K3's end, 105."""
    kt = KinetoTrace(time_format="int")
    kt.step(1, 0, 200)
    kt.kernel("K1", 10, 50, stream=7, launch_us=0)
    kt.runtime("cudaEventRecord", 20, 2, correlation=100)
    kt.runtime("cudaStreamWaitEvent", 30, 2, correlation=101)
    _cuda_sync(kt, "Stream Wait Event", 33, 1, stream=20, corr=101, recorded=100)
    kt.kernel("K2", 61, 20, stream=20, launch_us=40)
    kt.kernel("K3", 80, 25, stream=7, launch_us=70)
    kt.runtime("cudaEventRecord", 76, 2, correlation=103)
    kt.runtime("cudaEventSynchronize", 85, 25, correlation=102)
    _cuda_sync(kt, "Event Sync", 85, 20, stream=7, corr=102, recorded=103)
    return kt.write(tmp_path / "record_wait.json", gz=False)


def test_loader_keeps_the_wait_columns(tmp_path: Path) -> None:
    events = load_trace(record_wait_trace(tmp_path)).events
    waits = events[events["record_corr"] >= 0]
    assert sorted(zip(waits["name"].astype(str), waits["record_corr"], waits["wait_stream"])) == [
        ("Event Sync", 103, 7),
        ("Stream Wait Event", 100, 7),
    ]
    rest = events[events["record_corr"] < 0]
    assert (rest["record_corr"] == -1).all() and (rest["wait_stream"] == -1).all()


def test_stream_wait_and_event_sync_edges(tmp_path: Path) -> None:
    rt = load_trace(record_wait_trace(tmp_path))
    g = build_step_graph(rt, 1)
    assert check_invariants(g) == 200_000
    got = edges(g, rt.events)
    assert ("sync", "K1.end", "K2.start", 0) in got  # stream 20 waited for the work recorded on 7
    assert ("sync", "K3.end", "cudaEventSynchronize.release", 0) in got
    assert ("op", "cudaEventSynchronize.start", "cudaEventSynchronize.release", 0) in got  # waiting
    assert ("op", "cudaEventSynchronize.release", "cudaEventSynchronize.end", 5) in got  # the return
    # Ours keeps K2's launch delay (21 us, its stream was idle); HTA's rules: the sync edge alone
    # (HTA adds a launch edge only when the awaited work ended before the launch).
    assert ("launch_delay", "cudaLaunchKernel.start", "K2.start", 21) in got
    hta = edges(build_step_graph(rt, 1, rules=HTA_RULES), rt.events)
    assert [e for e in hta if e[2] == "K2.start"] == [("sync", "K1.end", "K2.start", 0)]
