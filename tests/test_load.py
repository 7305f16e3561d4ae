"""Loader tests: exact tables from synthetic traces, rank detection, bad
input, set-level warnings, the cache, and the real sample traces (with a
live cross-check against HTA's own parser)."""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path

import orjson
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from synth import KinetoTrace

from analyzer.ingest import cache as trace_cache
from analyzer.ingest import jobs, load, parse
from analyzer.errors import AnalyzerError, TraceError
from analyzer.ingest.load import find_trace_files, load_trace, load_traces, rank_from_filename
from analyzer.ingest.tables import COLUMNS, KINDS, text_id

DATA = Path(__file__).parent / "data"


def _gpu_trace(rank: int = 1, **kw) -> KinetoTrace:
    t = KinetoTrace(rank=rank, world_size=2, **kw)
    t.step(1, 1000, 1000)
    t.cpu_op("aten::mm", 1010.125, 50.25, input_dims=[[4, 8], [8, 16]], input_types=["float", "float"])
    t.cpu_op("aten::relu", 1070, 5)
    t.kernel("void sgemm_kernel<float>(float const*)", 1100.5, 200, launch_us=1020)
    t.kernel(
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        1250,
        100,
        stream=20,
        args=t.comm_args("allreduce", 1024, dtype="Float"),
    )
    t.record_param_comms(1240, 8, args=t.comm_args("allreduce", 1024, dtype="Float"))
    t.memcpy(1400, 10, kind="HtoD")
    t.memset(1420, 2)
    t.annotation("forward", 1100, 300, gpu=True, stream=7)
    t.instant("[memory]", 1500)
    return t


def test_exact_rows_from_synthetic_gpu_trace(tmp_path: Path) -> None:
    path = _gpu_trace().write(tmp_path / "t.json.gz")
    rt = load_trace(path)
    ev = rt.events
    assert (rt.rank, rt.rank_source, rt.has_device) == (1, "distributedInfo", True)
    assert list(ev.columns) == list(COLUMNS)
    assert {c: str(ev[c].dtype) for c in COLUMNS if COLUMNS[c] != "category"} == {
        c: t for c, t in COLUMNS.items() if t != "category"
    }
    assert list(ev["kind"].cat.categories) == list(KINDS)
    # Sorted by start; instant, flow, metadata and the Trace span are not rows.
    got = list(zip(ev["name"].astype(str), ev["kind"].astype(str), ev["start_ns"], ev["end_ns"], ev["stream"]))
    assert got == [
        ("ProfilerStep#1", "annotation", 1_000_000, 2_000_000, -1),
        ("aten::mm", "cpu_op", 1_010_125, 1_060_375, -1),
        ("cudaLaunchKernel", "runtime", 1_020_000, 1_025_000, -1),
        ("aten::relu", "cpu_op", 1_070_000, 1_075_000, -1),
        ("forward", "annotation", 1_100_000, 1_400_000, 7),
        ("void sgemm_kernel<float>(float const*)", "compute", 1_100_500, 1_300_500, 7),
        ("record_param_comms", "cpu_comm", 1_240_000, 1_248_000, -1),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm", 1_250_000, 1_350_000, 20),
        ("Memcpy HtoD (Pageable -> Device)", "memcpy", 1_400_000, 1_410_000, 7),
        ("Memset (Device)", "memset", 1_420_000, 1_422_000, 7),
    ]
    by = ev.set_index(ev["name"].astype(str))
    assert by.loc["aten::mm", "input_dims"] == "[[4,8],[8,16]]"
    assert by.loc["aten::mm", "input_types"] == '["float","float"]'
    assert by.loc["aten::relu", "input_dims"] is None
    sgemm = by.loc["void sgemm_kernel<float>(float const*)"]
    launch = by.loc["cudaLaunchKernel"]
    assert sgemm["correlation"] == launch["correlation"] == 1
    assert (sgemm["pid"], sgemm["tid"], launch["pid"], launch["tid"]) == (1, 7, 4242, 4242)
    nccl = by.loc["ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"]
    rpc = by.loc["record_param_comms"]
    for row in (nccl, rpc):
        assert (
            row["coll_name"],
            row["msg_in_nelems"],
            row["msg_out_nelems"],
            row["msg_dtype"],
            row["group_size"],
            row["pg_name"],
        ) == ("allreduce", 1024, 1024, "Float", 2, "0")
    assert pd.isna(sgemm["coll_name"]) and sgemm["msg_in_nelems"] == -1
    assert rpc["external_id"] > 0 and rpc["correlation"] == -1
    assert (ev["rank"] == 1).all()
    assert rt.steps.to_dict("list") == {"step": [1], "start_ns": [1_000_000], "end_ns": [2_000_000]}
    assert rt.processes.set_index("pid")["labels"].to_dict() == {1: "GPU 1", 4242: "CPU"}
    assert rt.threads.set_index("tid")["name"].to_dict()[20] == "stream 20 "
    assert rt.json_bytes == len(gzip.decompress(path.read_bytes()))


@pytest.mark.parametrize(
    ("cat", "name", "kind"),
    [
        ("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "comm"),
        ("kernel", "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm"),
        ("kernel", "void rcclGenericKernel<1, false>(ncclDevComm*)", "comm"),
        ("kernel", "RCCL_allreduce_kernel", "comm"),
        ("kernel", "void at::native::vectorized_elementwise_kernel<4>()", "compute"),
        ("gpu_memcpy", "Memcpy DtoD (Device -> Device)", "memcpy"),
        ("gpu_memset", "Memset (Device)", "memset"),
        ("cpu_op", "c10d::allreduce_", "cpu_comm"),
        ("user_annotation", "gloo:all_reduce", "cpu_comm"),
        ("user_annotation", "nccl:all_reduce", "cpu_comm"),
        ("cpu_op", "record_param_comms", "cpu_comm"),
        ("cpu_op", "aten::addmm", "cpu_op"),
        ("user_annotation", "ProfilerStep#3", "annotation"),
        ("gpu_user_annotation", "backward", "annotation"),
        ("cuda_runtime", "cudaLaunchKernel", "runtime"),
        ("cuda_runtime", "hipLaunchKernel", "runtime"),
        ("cuda_sync", "Stream Sync", "other"),
        ("python_function", "torch/nn/modules/module.py(1750): _call_impl", "other"),
    ],
)
def test_kind_classification(tmp_path: Path, cat: str, name: str, kind: str) -> None:
    t = KinetoTrace()
    pid, tid = (
        (t.device, 7)
        if cat in ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync")
        else (t.pid, t.tid)
    )
    t.raw({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": 5.0, "dur": 1.0, "args": {"stream": tid}})
    ev = load_trace(t.write(tmp_path / "k.json", gz=False)).events
    assert ev["kind"].astype(str).tolist() == [kind]


def test_integer_microseconds_of_old_traces_are_exact(tmp_path: Path) -> None:
    # Old PyTorch writes epoch microseconds as integers (df_index_resolver:
    # 1669783687464181); 1.67e18 ns is beyond float64's exact integers, so
    # the loader must scale integers, not floats.
    t = KinetoTrace(time_format="int")
    t.cpu_op("aten::add", 1669783687464181, 45)
    t.kernel("k", 1669783687464199, 3)
    ev = load_trace(t.write(tmp_path / "old.json.gz")).events
    assert ev["start_ns"].tolist() == [1669783687464181000, 1669783687464199000]
    assert ev["end_ns"].tolist() == [1669783687464226000, 1669783687464202000]


def test_float_microseconds_round_to_the_ns(tmp_path: Path) -> None:
    # Newer Kineto: µs with three decimals since some base, e.g. 4458676522690.655.
    t = KinetoTrace()
    t.cpu_op("a", 4458676522690.655, 156.777)
    t.cpu_op("b", 4458676522690.001, 0.001)
    ev = load_trace(t.write(tmp_path / "f.json.gz")).events
    assert ev["start_ns"].tolist() == [4458676522690001, 4458676522690655]
    assert ev["end_ns"].tolist() == [4458676522690002, 4458676522847432]


def test_gloo_annotation_message_size_from_input_dims(tmp_path: Path) -> None:
    t = KinetoTrace(gpu=False, backend="gloo")
    t.step(1, 0, 100)
    t.cpu_op("c10d::allreduce_", 10, 5, input_dims=[[[10384]], [], []], input_types=["TensorList", "", ""])
    t.annotation("gloo:all_reduce", 12, 30, tid=t.comm_tid, args={"Input Dims": [[10384]], "Input type": ["float"]})
    rt = load_trace(t.write(tmp_path / "g.json.gz"))
    assert not rt.has_device
    ev = rt.events.set_index(rt.events["name"].astype(str))
    gloo = ev.loc["gloo:all_reduce"]
    assert (gloo["kind"], gloo["coll_name"], gloo["msg_in_nelems"], gloo["msg_dtype"], gloo["tid"]) == (
        "cpu_comm",
        "all_reduce",
        10384,
        "float",
        t.comm_tid,
    )
    c10d = ev.loc["c10d::allreduce_"]
    assert (c10d["kind"], c10d["input_dims"], c10d["msg_in_nelems"]) == ("cpu_comm", "[[[10384]],[],[]]", -1)
    assert (ev["stream"] == -1).all()


def test_real_gloo_cpu_trace_fixture() -> None:
    # Written by tests/data/make_gloo_trace.py with torch 2.13 (2 ranks, gloo).
    ts = load_traces(DATA / "gloo_cpu", cache=False, workers=1)
    assert (sorted(ts.ranks), ts.errors, ts.warnings) == ([0, 1], [], [])
    for rank, rt in ts.ranks.items():
        ev = rt.events
        assert rt.rank_source == "distributedInfo" and not rt.has_device
        assert rt.steps["step"].tolist() == [1, 2]
        comm = ev[ev["kind"] == "cpu_comm"]
        assert comm.groupby(comm["name"].astype(str)).size().to_dict() == {
            "c10d::allreduce_": 4,
            "c10d::broadcast_": 4,
            "gloo:all_reduce": 4,
            "gloo:broadcast": 4,
        }
        gloo_ar = comm[comm["name"] == "gloo:all_reduce"]
        # DDP's single bucket: 64*128 + 128 + 128*16 + 16 = 10384 floats; the explicit all_reduce: 10.
        assert sorted(gloo_ar["msg_in_nelems"].tolist()) == [10, 10, 10384, 10384]
        runloop = set(rt.threads.loc[rt.threads["name"].str.contains("pt_gloo_runloop"), "tid"])
        assert set(comm.loc[comm["name"].astype(str).str.startswith("gloo:"), "tid"]) <= runloop | set(
            rt.threads["tid"]
        )
        assert {"data", "forward", "backward", "optimizer"} <= set(
            ev.loc[ev["kind"] == "annotation", "name"].astype(str)
        )


@pytest.mark.parametrize("layout", ["kineto", "compact", "pretty"])
@pytest.mark.parametrize("gz", [True, False])
def test_layout_and_block_size_do_not_change_the_table(tmp_path: Path, monkeypatch, layout: str, gz: bool) -> None:
    t = _gpu_trace()
    # Names that look like event boundaries must not fool the splitter.
    t.cpu_op('tricky }, {"ph": "X", "name": "fake"}', 1600, 1)
    t.cpu_op("tricky2 },\n  {", 1601, 1)
    t.cpu_op("ünïcødé ✓", 1602, 1)
    reference = load_trace(t.write(tmp_path / "ref.json", gz=False, layout="compact")).events
    path = t.write(tmp_path / ("t.json.gz" if gz else "t.json"), gz=gz, layout=layout)
    for block in (64, 1000, 1 << 22):
        monkeypatch.setattr(parse, "BLOCK_BYTES", block)
        pd.testing.assert_frame_equal(load_trace(path).events, reference)


def test_bare_array_form_and_odd_ids(tmp_path: Path) -> None:
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": "stream 9", "ts": 10, "dur": 2, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "op", "pid": "host", "tid": "main", "ts": 1, "dur": 2},
        {"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 3, "ts": 11, "dur": 1, "args": {"stream": "5"}},
        {"ph": "X", "cat": "cpu_op", "name": "no dur", "pid": 1, "tid": 1, "ts": 1},
        {"ph": "X", "cat": "cpu_op", "name": "negative", "pid": 1, "tid": 1, "ts": 1, "dur": -3},
        {"ph": "i", "name": "instant", "pid": 1, "tid": 1, "ts": 1},
        5,  # not an event: skipped
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "args not an object",
            "pid": 1,
            "tid": 1,
            "ts": 20,
            "dur": 1,
            "args": [1, 2],
        },
    ]
    path = tmp_path / "array.json"
    path.write_bytes(orjson.dumps(events))
    rt = load_trace(path)
    ev = rt.events
    assert ev["name"].astype(str).tolist() == ["op", "k", "k2", "args not an object"]
    assert ev["pid"].tolist() == [text_id("host"), 0, 0, 1]
    assert ev["tid"].tolist() == [text_id("main"), text_id("stream 9"), 3, 1]
    assert text_id("main") < -1 and text_id("main") == text_id("main")
    assert ev["stream"].tolist() == [-1, 9, 5, -1]
    # One note for every event dropped for its times, with the first as an example.
    assert rt.notes == [
        "2 complete events dropped for a missing or invalid ts/dur (ts and dur must be finite numbers >= 0 "
        "whose end fits int64 ns; first: 'no dur' with ts=1, dur=None)"
    ]
    assert (rt.rank, rt.rank_source) == (0, "default")


# ---------------------------------------------------------------- ranks


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rank-3.json.gz", 3),
        ("rank3.json", 3),
        ("rank_3.pt.trace.json.gz", 3),
        ("RANK12.json", 12),
        ("trace_8_rank_1.json", 1),
        ("rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", 34),
        ("rank0.step20.json.gz", 0),
        ("host_1234.1700000000.pt.trace.json", None),
        ("crank3.json", None),
        ("rank_non_gpu.json.gz", None),
    ],
)
def test_rank_from_filename(name: str, rank: int | None) -> None:
    assert rank_from_filename(name) == rank


def test_rank_sources_in_order(tmp_path: Path) -> None:
    with_info = KinetoTrace(rank=5, world_size=8)
    with_info.cpu_op("a", 0, 1)
    no_info = KinetoTrace(rank=5, distributed=False)
    no_info.cpu_op("a", 0, 1)
    # distributedInfo wins over the file name and the argument.
    rt = load_trace(with_info.write(tmp_path / "rank-2.json.gz"), rank=7)
    assert (rt.rank, rt.rank_source) == (5, "distributedInfo")
    rt = load_trace(no_info.write(tmp_path / "rank-2.json.gz"), rank=7)
    assert (rt.rank, rt.rank_source) == (2, "filename")
    rt = load_trace(no_info.write(tmp_path / "worker.json.gz"), rank=7)
    assert (rt.rank, rt.rank_source) == (7, "argument")
    rt = load_trace(tmp_path / "worker.json.gz")
    assert (rt.rank, rt.rank_source) == (0, "default")


# ---------------------------------------------------------------- bad input


def _error(path: Path) -> str:
    with pytest.raises(TraceError) as info:
        load_trace(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(path.name + ": ")
    return msg[len(path.name) + 2 :]


def test_truncated_gzip(tmp_path: Path) -> None:
    t = _gpu_trace()
    for i in range(3000):
        t.cpu_op(f"op{i}", 2000 + i, 1)
    data = gzip.compress(t.dumps(), compresslevel=1)
    path = tmp_path / "rank-1.json.gz"
    path.write_bytes(data[: len(data) // 2])
    problem = _error(path)
    assert problem.startswith("truncated gzip stream after ") and problem.endswith(" MB")
    # The size is the JSON decompressed before the cut: about half of it.
    mb = float(problem.split()[-2])
    assert 0.2 * len(t.dumps()) / 1e6 < mb < len(t.dumps()) / 1e6


def test_corrupt_gzip(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(_gpu_trace().dumps()))
    data[len(data) // 2 : len(data) // 2 + 20] = b"\xff" * 20
    path = tmp_path / "bad.json.gz"
    path.write_bytes(bytes(data))
    assert _error(path).startswith("corrupt gzip data after ")


def test_invalid_json_names_line_and_column(tmp_path: Path, monkeypatch) -> None:
    text = _gpu_trace().dumps().decode()
    for i in range(200):  # make the error land in a late block
        text = text.replace(
            '"traceEvents": [\n',
            '"traceEvents": [\n  {"ph": "X", "cat": "cpu_op", "name": "pad", "pid": 1, "tid": 1, "ts": 1, "dur": 1},\n',
            1,
        )
    lines = text.split("\n")
    target = max(i for i, line in enumerate(lines) if '"name": "aten::relu"' in line)
    lines[target] = lines[target].replace('"name": "aten::relu"', '"name" "aten::relu"')
    path = tmp_path / "broken.json"
    path.write_text("\n".join(lines))
    col = lines[target].index('"name" "aten::relu"') + len('"name" ') + 1
    for block in (256, 1 << 22):
        monkeypatch.setattr(parse, "BLOCK_BYTES", block)
        assert _error(path) == f"invalid JSON at line {target + 1}, column {col}: expected ':'"


def test_json_cut_off_without_gzip(tmp_path: Path) -> None:
    data = _gpu_trace().dumps()
    path = tmp_path / "cut.json"
    path.write_bytes(data[: int(len(data) * 0.7)])
    problem = _error(path)
    assert problem.startswith("invalid JSON: the text ends early, after ") and "file cut off?" in problem


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "empty file"),
        (b"  \n\t ", "empty file (only whitespace)"),
        (
            b'{"schemaVersion": 1, "deviceProperties": []}',
            "no traceEvents array (top-level keys: schemaVersion, deviceProperties)",
        ),
        (b'{"traceEvents": {"ph": "X"}}', "traceEvents is a dict, not an array"),
        (b'{"schemaVersion": 1, "traceEvents": null}', "traceEvents is a null, not an array"),
        (b'{"traceEvents": []}', "traceEvents is empty"),
        (b'"just a string"', "not a Kineto trace: the JSON is a str, not an object"),
        (
            b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": "abc", "dur": 1}]}',
            "no valid events: the 1 complete event has a missing or invalid ts/dur (first: 'a' with ts='abc', dur=1)",
        ),
        (
            b'{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "x"}}, {"ph": "i", "ts": 1}]}',
            'no timed events: none of the 2 events is a complete event ("ph": "X") with ts and dur',
        ),
    ],
)
def test_bad_documents(tmp_path: Path, content: bytes, problem: str) -> None:
    for gz in (False, True):
        path = tmp_path / ("rank-0.json.gz" if gz else "rank-0.json")
        path.write_bytes(gzip.compress(content) if gz else content)
        assert _error(path) == problem


def test_bad_files_are_errors_and_the_other_ranks_still_load(tmp_path: Path) -> None:
    for r in (0, 1, 2):
        t = KinetoTrace(rank=r, world_size=5)
        t.step(1, 0, 100)
        t.kernel("k", 10, 10)
        t.write(tmp_path / f"rank{r}.json.gz")
    (tmp_path / "rank3.json.gz").write_bytes(gzip.compress(b"")[:-4])  # cut before the trailer
    (tmp_path / "rank4.json").write_bytes(b"")
    ts = load_traces(tmp_path, cache=False, workers=1)
    assert sorted(ts.ranks) == [0, 1, 2]
    assert [str(e) for e in ts.errors] == [
        "rank3.json.gz: truncated gzip stream after 0.0 MB",
        "rank4.json: empty file",
    ]
    assert ts.warnings == ["world_size is 5 but 2 ranks have no trace: 3-4"]


# ---------------------------------------------------------------- set warnings


def test_set_warnings(tmp_path: Path) -> None:
    def rank_trace(rank: int, steps: int, name: str) -> None:
        t = KinetoTrace(rank=rank, world_size=4)
        for s in range(steps):
            t.step(s + 1, s * 100, 100)
        t.kernel("k", 10, 10)
        t.write(tmp_path / name)

    rank_trace(0, 3, "a_rank0.json.gz")
    rank_trace(0, 3, "b_rank0.json.gz")  # duplicate of rank 0
    rank_trace(1, 3, "rank1.json.gz")
    rank_trace(2, 2, "rank2.json.gz")  # fewer steps
    rank_trace(3, 0, "rank3.json.gz")  # no ProfilerStep markers
    ts = load_traces(tmp_path, cache=False, workers=1)
    assert sorted(ts.ranks) == [0, 1, 2, 3] and ts.errors == []
    assert ts.ranks[0].path.name == "b_rank0.json.gz"
    assert ts.warnings == [
        "duplicated rank 0: kept b_rank0.json.gz, ignored a_rank0.json.gz (the file sorting last is kept)",
        "rank3.json.gz: no ProfilerStep markers; per-step metrics unavailable for rank 3",
        "rank2.json.gz: 2 ProfilerSteps (#1..#2) while most ranks have 3; rank 2's per-step comparison covers different steps",
    ]


def test_default_rank_is_warned_about_with_several_files(tmp_path: Path) -> None:
    for name in ("x.json.gz", "y.json.gz"):
        t = KinetoTrace(distributed=False)
        t.step(1, 0, 10)
        t.write(tmp_path / name)
    ts = load_traces(tmp_path, cache=False, workers=1)
    assert list(ts.ranks) == [0]
    assert ts.warnings[:3] == [
        "x.json.gz: no rank in distributedInfo or the file name; assumed rank 0",
        "y.json.gz: no rank in distributedInfo or the file name; assumed rank 0",
        "duplicated rank 0: kept y.json.gz, ignored x.json.gz (the file sorting last is kept)",
    ]


# ---------------------------------------------------------------- files


def test_find_trace_files(tmp_path: Path) -> None:
    for name in ("rank10.json.gz", "rank2.json", "rank1.json.gz", ".hidden.json", "notes.txt", "a.tar.gz"):
        (tmp_path / name).write_bytes(b"{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "rank5.json").write_bytes(b"{}")
    assert [p.name for p in find_trace_files(tmp_path)] == ["rank1.json.gz", "rank2.json", "rank10.json.gz"]
    assert find_trace_files(tmp_path / "notes.txt") == [tmp_path / "notes.txt"]
    with pytest.raises(
        AnalyzerError,
        match=r"no trace files \(\*\.json, \*\.json\.gz\) \(1 in subfolders, e\.g\. .*sub; pass that folder\)",
    ):
        find_trace_files(_only_sub(tmp_path))
    with pytest.raises(AnalyzerError, match="no such file or directory"):
        find_trace_files(tmp_path / "missing")
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_bytes(b'{"schema": "reftrain.run/1"}')
    with pytest.raises(
        AnalyzerError,
        match=r"a reftrain run directory; read it with analyzer\.rundir\.read_run_dir, or pass .*run/traces",
    ):
        find_trace_files(run)


def _only_sub(tmp_path: Path) -> Path:
    root = tmp_path / "outer"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "rank0.json").write_bytes(b"{}")
    return root


@pytest.mark.parametrize("threaded", [False, True])
def test_parallel_workers_give_the_same_tables(tmp_path: Path, monkeypatch, threaded: bool) -> None:
    for r in range(3):
        t = _gpu_trace(rank=r)
        t.write(tmp_path / f"rank{r}.json.gz")
    (tmp_path / "rank3.json").write_bytes(b"{")
    serial = load_traces(tmp_path, cache=False, workers=1)
    # A multi-threaded caller (a Streamlit server) gets forkserver workers.
    monkeypatch.setattr(jobs, "_single_threaded", lambda: not threaded)
    assert jobs._mp_context().get_start_method() == ("forkserver" if threaded else "fork")
    parallel = load_traces(tmp_path, cache=tmp_path / "cache", workers=3)
    assert sorted(parallel.ranks) == [0, 1, 2]
    assert [str(e) for e in parallel.errors] == [
        "rank3.json: invalid JSON: the text ends early, after 0.0 MB (line 1, column 2; file cut off?)"
    ]
    for r in range(3):
        pd.testing.assert_frame_equal(serial.ranks[r].events, parallel.ranks[r].events)
    assert serial.ranks[2].events["rank"].eq(2).all()
    # Parsed and cached by the workers.
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 3


# ---------------------------------------------------------------- cache


@pytest.fixture
def counted_parse(monkeypatch):
    calls: list[Path] = []
    real = parse.parse_columns

    def counting(path):
        calls.append(Path(path))
        return real(path)

    # analyzer.cache.parse_and_store looks it up in analyzer.parse at each call.
    monkeypatch.setattr(parse, "parse_columns", counting)
    return calls


def _assert_same(a, b) -> None:
    assert sorted(a.ranks) == sorted(b.ranks)
    for r in a.ranks:
        x, y = a.ranks[r], b.ranks[r]
        for attr in ("events", "steps", "processes", "threads"):
            pd.testing.assert_frame_equal(getattr(x, attr), getattr(y, attr))
        for attr in (
            "rank",
            "rank_source",
            "distributed_info",
            "device_properties",
            "has_device",
            "json_bytes",
            "notes",
        ):
            assert getattr(x, attr) == getattr(y, attr)


def test_cache_hit_skips_parsing_and_returns_identical_tables(tmp_path: Path, counted_parse) -> None:
    folder = tmp_path / "traces"
    for r in (0, 1):
        _gpu_trace(rank=r).write(folder / f"rank{r}.json.gz")
    cold = load_traces(folder, workers=1)
    assert len(counted_parse) == 2
    entries = sorted((folder / ".analyzer-cache").glob("*.npz"))
    assert [e.name.split(".")[0] for e in entries] == ["rank0", "rank1"]
    warm = load_traces(folder, workers=1)
    assert len(counted_parse) == 2, "second load parsed again"
    _assert_same(cold, warm)
    assert warm.warnings == cold.warnings and warm.errors == []
    # A changed file (new mtime) is parsed again and its old entry replaced.
    path = folder / "rank1.json.gz"
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000_000))
    load_traces(folder, workers=1)
    assert counted_parse[2:] == [path]
    assert len(list((folder / ".analyzer-cache").glob("rank1.json.gz.*.npz"))) == 1


def test_corrupt_cache_entry_is_reported_and_rebuilt(tmp_path: Path, counted_parse) -> None:
    _gpu_trace(rank=0).write(tmp_path / "rank0.json.gz")
    cold = load_traces(tmp_path, workers=1)
    (entry,) = (tmp_path / ".analyzer-cache").glob("*.npz")
    entry.write_bytes(entry.read_bytes()[:100])
    again = load_traces(tmp_path, workers=1)
    assert len(counted_parse) == 2
    note = again.warnings[0]
    assert note.startswith(f"rank0.json.gz: cache entry {entry.name} unreadable (") and note.endswith("); parsed again")
    assert "\n" not in note and len(_reason(note)) > 5
    _assert_same(cold, again)
    load_traces(tmp_path, workers=1)
    assert len(counted_parse) == 2  # the rebuilt entry is good


def _reason(warning: str) -> str:
    return warning.split("unreadable (", 1)[1].rsplit("); parsed again", 1)[0]


def test_read_only_trace_folder_uses_the_user_cache(tmp_path: Path, monkeypatch, counted_parse) -> None:
    traces = tmp_path / "shared"
    _gpu_trace(rank=0).write(traces / "rank0.json.gz")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    real_usable = trace_cache._usable_dir
    monkeypatch.setattr(trace_cache, "_usable_dir", lambda d: False if d.name == ".analyzer-cache" else real_usable(d))
    load_traces(traces, workers=1)
    load_traces(traces, workers=1)
    assert len(counted_parse) == 1
    assert not (traces / ".analyzer-cache").exists()
    assert len(list((tmp_path / "xdg" / "trainperf").glob("rank0.json.gz.*.npz"))) == 1


def test_folder_without_write_bits_is_read_only_even_for_root(tmp_path: Path, monkeypatch, counted_parse) -> None:
    """chmod 555 marks a trace collection read-only; root may write there, but the cache goes elsewhere."""
    traces = tmp_path / "shared"
    _gpu_trace(rank=0).write(traces / "rank0.json.gz")
    traces.chmod(0o555)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    try:
        load_traces(traces, workers=1)
        load_traces(traces, workers=1)
    finally:
        traces.chmod(0o755)
    assert len(counted_parse) == 1
    assert not (traces / ".analyzer-cache").exists()
    assert len(list((tmp_path / "xdg" / "trainperf").glob("rank0.json.gz.*.npz"))) == 1


def test_cache_folder_argument_and_rank_hint_resolution(tmp_path: Path, counted_parse) -> None:
    t = KinetoTrace(distributed=False)
    t.step(1, 0, 10)
    path = t.write(tmp_path / "worker.json.gz")
    store = tmp_path / "store"
    first = load_traces(path, cache=store, workers=1)
    second = load_traces(path, cache=store, workers=1)
    assert len(counted_parse) == 1 and len(list(store.glob("*.npz"))) == 1
    _assert_same(first, second)
    assert (second.ranks[0].rank_source, list(second.ranks)) == ("default", [0])
    # The cached entry does not freeze a hinted rank.
    tc = trace_cache.TraceCache(store)
    entry = tc.entry_for(path)
    assert load.rank_trace(tc.read(entry, path), rank=6).rank == 6


def _rewrite_entry(entry: Path, change) -> None:
    """Rewrite an npz cache entry with ``change(members)`` applied."""
    import numpy as np

    with np.load(entry, allow_pickle=False) as z:
        members = {k: z[k] for k in z.files}
    change(members)
    with open(entry, "wb") as f:
        np.savez(f, **members)


def _set_meta(members: dict, **fields) -> None:
    import numpy as np

    meta = orjson.loads(members["trainperf_meta"].tobytes())
    meta.update(fields)
    members["trainperf_meta"] = np.frombuffer(orjson.dumps(meta), dtype=np.uint8)


@pytest.mark.parametrize(
    "change, reason",
    [
        # A planted entry holding a pickled object is refused, never unpickled.
        (
            lambda m: m.update(pid=__import__("numpy").array([object()] * len(m["pid"]), dtype=object)),
            "Object arrays cannot be loaded",
        ),
        (lambda m: m.update(name=m["name"] + 10_000), "column name has codes outside its"),
        (lambda m: m.update(ts_ns=m["ts_ns"][:-1]), "column ts_ns is int64"),
        (
            lambda m: _set_meta(m, sparse={"input_dims": [[10**6, "[[1]]"]]}),
            "a sparse column names a row outside the table",
        ),
        (lambda m: _set_meta(m, loader_version=1), "loader version 1"),
    ],
)
def test_tampered_cache_entry_is_refused_and_parsed_again(tmp_path: Path, counted_parse, change, reason) -> None:
    _gpu_trace(rank=0).write(tmp_path / "rank0.json.gz")
    cold = load_traces(tmp_path, workers=1)
    (entry,) = (tmp_path / ".analyzer-cache").glob("*.npz")
    _rewrite_entry(entry, change)
    again = load_traces(tmp_path, workers=1)
    assert len(counted_parse) == 2
    assert reason in _reason(again.warnings[0])
    _assert_same(cold, again)


def test_rewriting_an_entry_removes_older_formats_of_that_trace_only(tmp_path: Path) -> None:
    _gpu_trace(rank=0).write(tmp_path / "rank0.json.gz")
    _gpu_trace(rank=1).write(tmp_path / "rank1.json.gz")
    store = tmp_path / ".analyzer-cache"
    store.mkdir()
    tc = trace_cache.TraceCache()
    new = tc.entry_for(tmp_path / "rank0.json.gz")
    path_hash = new.name.split(".")[3]
    old_format = store / f"rank0.json.gz.{path_hash}.0123456789abcdef.parquet"
    other_trace = (
        store / f"rank1.json.gz.{tc.entry_for(tmp_path / 'rank1.json.gz').name.split('.')[3]}.0123456789abcdef.parquet"
    )
    report = store / "report.0123456789.0123456789abcdef.json"
    for f in (old_format, other_trace, report):
        f.write_bytes(b"x")
    load_traces(tmp_path / "rank0.json.gz", workers=1)
    assert sorted(f.name for f in store.iterdir()) == sorted([new.name, other_trace.name, report.name])


# ---------------------------------------------------------------- real traces

# Counts from our loader, equal to HTA's own parse of the same files
# (TraceAnalysis(include_last_profiler_step=True): same rows per cat and
# name; see test_rows_match_hta_parser for the live check on the smaller
# ones). "comm" = kernels with nccl/rccl in the name: HTA's parse of
# df_index_resolver has 2020 kernels matching "nccl".
SAMPLES = {
    "df_index_resolver/df_index_resolver.json.gz": dict(
        rows=123378, rank=1, steps=5, comm=2020, compute=17350, memcpy=2040, memset=880, cpu_comm=8080
    ),
    "trace_diff/control/control.json.gz": dict(
        rows=74936, rank=3, steps=6, comm=60, compute=8508, memcpy=228, memset=654, cpu_comm=180
    ),
    "trace_diff/test/test.json.gz": dict(
        rows=68323, rank=1, steps=6, comm=64, compute=9812, memcpy=4856, memset=900, cpu_comm=180
    ),
    "nccl_parser_config/nccl_data.json.gz": dict(
        rows=26932, rank=0, steps=3, comm=21, compute=2679, memcpy=960, memset=114, cpu_comm=90
    ),
    "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz": dict(
        rows=112, rank=0, steps=2, comm=0, compute=14, memcpy=2, memset=0, cpu_comm=0
    ),
    "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz": dict(
        rows=867, rank=0, steps=0, comm=0, compute=79, memcpy=16, memset=3, cpu_comm=0
    ),
    "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": dict(
        rows=15, rank=34, steps=1, comm=0, compute=0, memcpy=0, memset=0, cpu_comm=10
    ),
    "mixed_files/rank_non_gpu.json.gz": dict(
        rows=2467, rank=0, steps=1, comm=0, compute=0, memcpy=0, memset=0, cpu_comm=18
    ),
    "distributed_info_unavailable/distributed_info_not_found.json.gz": dict(
        rows=2467, rank=0, steps=1, comm=0, compute=0, memcpy=0, memset=0, cpu_comm=18
    ),
}


@pytest.mark.parametrize("rel", sorted(SAMPLES))
def test_sample_traces_load_with_expected_counts(hta_samples: Path, rel: str) -> None:
    want = SAMPLES[rel]
    rt = load_trace(hta_samples / rel)
    kinds = rt.events["kind"].value_counts()
    got = dict(
        rows=len(rt.events),
        rank=rt.rank,
        steps=len(rt.steps),
        **{k: int(kinds[k]) for k in ("comm", "compute", "memcpy", "memset", "cpu_comm")},
    )
    assert got == want
    assert rt.events["start_ns"].is_monotonic_increasing
    assert (rt.events["end_ns"] >= rt.events["start_ns"]).all()
    assert rt.has_device == (want["compute"] > 0)


def test_sample_rocm_trace_streams_and_rank_source(hta_samples: Path) -> None:
    rt = load_trace(hta_samples / "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    ev = rt.events
    assert rt.rank_source == "default"  # no distributedInfo, no rank in the name
    # hipMemcpyWithStream writes "stream": "0x0" on the host: still a host event.
    assert set(ev.loc[ev["kind"].isin(["compute", "memcpy"]), "stream"]) == {0}
    assert (ev.loc[ev["cat"] == "cuda_runtime", "stream"] == -1).all()
    assert ev.loc[ev["cat"] == "cuda_runtime", "name"].astype(str).str.startswith("hip").all()


@pytest.mark.parametrize("folder", ["amd_trace", "critical_path/alexnet", "cpu_only", "nccl_parser_config"])
def test_rows_match_hta_parser(hta_samples: Path, folder: str) -> None:
    hta_trace = pytest.importorskip("hta.trace_analysis")
    import logging

    logging.getLogger("hta").setLevel(logging.ERROR)
    ta = hta_trace.TraceAnalysis(trace_dir=str(hta_samples / folder), include_last_profiler_step=True)
    sym = ta.t.symbol_table.get_sym_table()
    ((hta_rank, df),) = ta.t.traces.items()
    rt = load_trace(next((hta_samples / folder).glob("*.json.gz")))
    assert rt.rank == hta_rank
    theirs = pd.DataFrame(
        {"cat": df["cat"].map(sym.__getitem__), "name": df["name"].map(sym.__getitem__)}
    ).value_counts()
    ours = pd.DataFrame({"cat": rt.events["cat"].astype(str), "name": rt.events["name"].astype(str)}).value_counts()
    assert ours.sort_index().to_dict() == theirs.sort_index().to_dict()
    # HTA keeps args.stream for kernels, memcpy, memset (ours also puts
    # gpu_user_annotation on its stream; HTA gives it -1).
    dev = ["kernel", "gpu_memcpy", "gpu_memset"]
    theirs_streams = pd.Series(df["stream"].to_numpy(), index=df["cat"].map(sym.__getitem__))
    assert sorted(theirs_streams[theirs_streams.index.isin(dev)].tolist()) == sorted(
        rt.events.loc[rt.events["cat"].isin(dev), "stream"].tolist()
    )


def test_progress_bar_only_when_asked_or_on_a_terminal(tmp_path: Path, capsys) -> None:
    for r in range(2):
        _gpu_trace(rank=r).write(tmp_path / f"rank{r}.json.gz")
    load_traces(tmp_path, cache=False, workers=1)  # stderr is not a terminal here
    assert capsys.readouterr().err == ""
    load_traces(tmp_path, cache=False, workers=1, progress=True)
    assert "loading traces" in capsys.readouterr().err


def test_traceset_events_concatenates_ranks_with_unified_categories(tmp_path: Path) -> None:
    for r in range(2):
        t = KinetoTrace(rank=r, world_size=2)
        t.step(1, 0, 100)
        t.kernel(f"only_on_rank{r}", 10, 5)
        t.write(tmp_path / f"rank{r}.json.gz")
    ts = load_traces(tmp_path, cache=False, workers=1)
    both = ts.events()
    assert both["rank"].tolist() == [0, 0, 1, 1]
    assert both["name"].astype(str).tolist() == ["ProfilerStep#1", "only_on_rank0", "ProfilerStep#1", "only_on_rank1"]
    assert isinstance(both["name"].dtype, pd.CategoricalDtype) and isinstance(both["kind"].dtype, pd.CategoricalDtype)
    assert list(both["kind"].cat.categories) == list(KINDS)
