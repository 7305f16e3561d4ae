"""A bad-input corpus over every verb.

Generated at test time (a few MB on disk): every hostile or broken input
the readers must survive (multi-member gzip, a gzip bomb, a 1 GiB string in a 1 MB
gzip, 100,000-deep nesting in three places, ts/dur 1e308 and strings, NaN,
metrics lines out of range, a FIFO, a socket, a device, symlink loops)
plus truncated, zero-byte, invalid JSON and wrong types.

* In a folder with good ranks: exit 0, exactly one ``skipped:`` line per
  bad file, and the good ranks' report identical to the report of the good
  ranks alone (the multi-member gzip is a *good* rank: ``gzip -dc`` reads
  it, so must we).
* In a folder of only bad files: exit 2, one ``skipped:`` line per file.
* Never exit 3 (a traceback), never a hang (each command has a timeout),
  and the peak RSS of every command under :data:`PEAK_RSS_BOUND_MB`,
  measured with ``getrusage(RUSAGE_CHILDREN)`` in a wrapper process (the
  largest process of the command's tree: the CLI or one parse worker), with
  a watchdog that kills a command past :data:`KILL_RSS_MB` so that a
  regression cannot take the machine down.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import zlib
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_compare import write_run

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 300  # a hang is the failure; a loaded 2-core machine needs a few s per command
# The analyzer imports pandas (~120 MB resident) and holds the good ranks'
# tables; a hostile file must not add more than a bounded read buffer
# (docs/loading.md). The legitimate analysis of the good ranks alone peaks
# at about 170 MB here.
PEAK_RSS_BOUND_MB = 600
KILL_RSS_MB = 3000
DEEP = 100_000
GIB = 1 << 30

_WRAPPER = """
import resource, subprocess, sys
rc = subprocess.call(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(rc)
"""


def _gzip_of_repeated(prefix: bytes, byte: bytes, n: int, suffix: bytes) -> bytes:
    """One gzip member of prefix + byte * n + suffix, compressed in 16 MiB pieces (never held whole)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [c.compress(prefix)]
    piece = byte * (16 << 20)
    for _ in range(n // len(piece)):
        out.append(c.compress(piece))
    out.append(c.compress(byte * (n % len(piece))))
    out.append(c.compress(suffix))
    out.append(c.flush())
    return b"".join(out)


def _event(**over) -> dict:
    e = {
        "ph": "X",
        "cat": "kernel",
        "name": "sgemm",
        "pid": 0,
        "tid": 7,
        "ts": 100.0,
        "dur": 10.0,
        "args": {"stream": 7, "correlation": 1},
    }
    e.update(over)
    return e


def _doc(events: list) -> bytes:
    return orjson.dumps({"schemaVersion": 1, "traceEvents": events})


def _nested(depth: int, leaf: str = "1") -> bytes:
    return b"[" * depth + leaf.encode() + b"]" * depth


def _write_bad_traces(folder: Path) -> list[str]:
    """Every bad trace case, as files named like traces; returns their names."""
    cases: dict[str, bytes] = {
        "zero-byte.json": b"",
        "truncated.json.gz": gzip.compress(_doc([_event(ts=float(i)) for i in range(2000)]))[:3000],
        "not-gzip.json.gz": b"\x1f\x8b" + os.urandom(200),
        "invalid-json.json": b'{"traceEvents": [{"ph": "X",, "ts": 1}]}',
        "top-level-array.json": b"[1, 2, 3]",
        "events-not-array.json": b'{"traceEvents": {"ph": "X"}}',
        "wrong-types.json": _doc([_event(ts="soon", dur=[1], name=5, pid={"a": 1}) for _ in range(3)]),
        "nan.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": NaN, "dur": 1}]}',
        "huge-ts.json": _doc([_event(ts=1e308, dur=1e308), _event(ts=1e30, dur=5.0)]),
        "string-ts.json": _doc([_event(ts="100", dur="10") for _ in range(5)]),
        "deep-top.json": _nested(DEEP),
        "deep-args.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, '
        b'"ts": 1, "dur": 1, "args": ' + _nested(DEEP) + b"}]}",
        "deep-object.json": b'{"traceEvents": ['
        + orjson.dumps(_event())
        + b'], "meta": '
        + b'{"a": ' * DEEP
        + b"1"
        + b"}" * DEEP
        + b"}",
        # Ten members of 100 MiB of zeros: 1 GiB from ~1 MB, and not JSON at all.
        "bomb.json.gz": _gzip_of_repeated(b"", b"\x00", 100 << 20, b"") * 10,
        # One 1 GiB string inside valid JSON, from a 1 MB gzip: the token bound's case.
        "long-string.json.gz": _gzip_of_repeated(
            b'{"traceEvents": [{"ph": "X", "name": "', b"a", GIB, b'", "ts": 1, "dur": 1}]}'
        ),
    }
    for name, content in cases.items():
        (folder / name).write_bytes(content)
    names = list(cases)
    os.mkfifo(folder / "fifo.json")
    names.append("fifo.json")
    os.symlink("loop-a.json", folder / "loop-b.json")
    os.symlink("loop-b.json", folder / "loop-a.json")
    os.symlink("self.json", folder / "self.json")
    names += ["loop-a.json", "loop-b.json", "self.json"]
    os.symlink("nowhere.json", folder / "dangling.json")
    names.append("dangling.json")
    (folder / "dir.json").mkdir()
    names.append("dir.json")
    if os.geteuid() == 0:
        os.mknod(folder / "device.json", stat.S_IFCHR | 0o600, os.makedev(1, 3))  # like /dev/null
        names.append("device.json")
    sock_path = folder / "socket.json"
    if len(str(sock_path)) < 100:  # AF_UNIX paths are limited to 108 bytes
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(sock_path))
        s.close()  # the socket file stays
        names.append("socket.json")
    return names


def _multi_member(path: Path) -> None:
    """Rewrite a .json.gz as two gzip members (what `cat a.gz b.gz` writes)."""
    text = gzip.decompress(path.read_bytes())
    half = len(text) // 2
    path.write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path | list[str]]:
    root = tmp_path_factory.mktemp("corpus")
    good = write_run(root / "good", ranks=2)
    mixed = write_run(root / "mixed", ranks=2)
    _multi_member(mixed / "rank1.json.gz")
    bad_names = _write_bad_traces(mixed)
    only_bad = root / "bad"
    only_bad.mkdir()
    assert _write_bad_traces(only_bad) == bad_names
    on_disk = sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    assert on_disk < 20e6, on_disk  # small on disk: the bombs are compressed
    return {"good": good, "mixed": mixed, "bad": only_bad, "names": bad_names}


def _rss_mb(pid: int) -> float:
    """Resident MB of a process and its descendants (the watchdog's figure)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return total / 1024


def analyzer(*args: str) -> tuple[int, str, float]:
    """(exit code, stderr, peak RSS MB of the largest process) of ``analyzer ARGS``."""
    cmd = [sys.executable, "-c", _WRAPPER, str(Path(sys.executable).parent / "analyzer"), *args]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.monotonic() + TIMEOUT_S
    killed = None
    while proc.poll() is None:
        if _rss_mb(proc.pid) > KILL_RSS_MB:
            killed = f"over {KILL_RSS_MB} MB resident"
        elif time.monotonic() > deadline:
            killed = f"still running after {TIMEOUT_S} s"
        if killed:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    _out, err = proc.communicate()
    assert killed is None, f"analyzer {' '.join(args)}: killed, {killed}; stderr: {err[-2000:]}"
    lines = err.rstrip("\n").splitlines()
    peak_mb = int(lines[-1]) / 1024  # ru_maxrss is in KiB on Linux
    return proc.returncode, "\n".join(lines[:-1]), peak_mb


def _skipped_once_each(stderr: str, names: list[str]) -> None:
    skipped = [line for line in stderr.splitlines() if line.startswith("analyzer: skipped: ")]
    for name in names:
        mine = [line for line in skipped if line.startswith(f"analyzer: skipped: {name}: ")]
        assert len(mine) == 1, (name, mine, stderr[-3000:])
    assert len(skipped) == len(names), stderr[-3000:]


def _report_doc(path: Path, tmp_path: Path, *extra: str) -> tuple[int, str, float, dict | None]:
    out = tmp_path / f"{path.name}.json"
    code, err, peak = analyzer("report", str(path), "--no-cache", "--json", str(out), *extra)
    doc = json.loads(out.read_text()) if code == 0 else None
    if doc is not None:
        for key in ("path", "generator", "errors", "warnings"):
            doc.pop(key, None)
    return code, err, peak, doc


def test_report_on_good_ranks_with_bad_files(corpus, tmp_path: Path) -> None:
    code, err, peak, doc = _report_doc(corpus["mixed"], tmp_path)
    assert code == 0, err[-3000:]
    _skipped_once_each(err, corpus["names"])
    assert "Traceback" not in err and "Warning" not in err  # no raw Python/numpy/pandas warning
    good_code, good_err, _, good_doc = _report_doc(corpus["good"], tmp_path)
    assert good_code == 0 and "skipped" not in good_err
    assert doc == good_doc  # the two good ranks' numbers, unchanged (rank1 read through both gzip members)
    assert doc["run"]["n_ranks"] == 2
    assert peak < PEAK_RSS_BOUND_MB, peak


def test_report_on_only_bad_files(corpus) -> None:
    code, err, peak = analyzer("report", str(corpus["bad"]), "--no-cache")
    assert code == 2, err[-3000:]
    _skipped_once_each(err, corpus["names"])
    assert err.splitlines()[-1].startswith("analyzer: error: ")
    assert peak < PEAK_RSS_BOUND_MB, peak


@pytest.mark.parametrize("verb", ["compare", "check", "suggest"])
def test_other_verbs(corpus, verb: str) -> None:
    good, mixed, bad = (str(corpus[k]) for k in ("good", "mixed", "bad"))
    args = {"compare": [good, mixed], "check": ["--baseline", good, mixed], "suggest": [mixed]}[verb]
    code, err, peak = analyzer(verb, *args, *(["--no-cache"] if verb != "suggest" else []))
    assert code == 0, err[-3000:]  # check: the same good ranks on both sides, no regression
    _skipped_once_each(err, corpus["names"])
    assert peak < PEAK_RSS_BOUND_MB, peak
    args = {"compare": [good, bad], "check": ["--baseline", good, bad], "suggest": [bad]}[verb]
    code, err, peak = analyzer(verb, *args, *(["--no-cache"] if verb != "suggest" else []))
    assert code == 2, err[-3000:]
    _skipped_once_each(err, corpus["names"])
    assert peak < PEAK_RSS_BOUND_MB, peak


# ---------------------------------------------------------------- metrics lines


def _metrics_line(step: int) -> dict:
    return {
        "step": step,
        "rank": 0,
        "loss": 5.0,
        "step_time_ms": 100.0 + (step % 3),
        "data_wait_ms": 1.0,
        "forward_ms": 30.0,
        "backward_ms": 60.0,
        "optimizer_ms": 5.0,
        "grad_sync_ms": 0.0,
        "comm_ms": 0.0,
        "tokens": 512,
        "tokens_per_s": 5000.0,
        "mfu": 0.25,
        "hfu": 0.25,
        "mem_bytes": 1 << 28,
        "mem_kind": "cpu_rss",
        "profiled": False,
        "time_ns": 1_700_000_000_000_000_000 + step,
    }


def _metrics_run(folder: Path, bad_lines: list[dict]) -> Path:
    """A reftrain run directory with 54 good metrics lines (steps 0-53) on rank 0 and ``bad_lines`` among them."""
    lines = [_metrics_line(s) for s in range(54)]
    for i, bad in enumerate(bad_lines):
        lines.insert(10 + i, {**_metrics_line(99), **bad})
    (folder / "metrics").mkdir(parents=True)
    (folder / "metrics" / "rank0.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))
    manifest = {
        "schema": "reftrain.run/1",
        "run_id": folder.name,
        "status": "completed",
        "world_size": 1,
        "steps": 54,
        "start_step": 0,
        "warmup_steps": 2,
        "profiled_steps": [],
        "tokens_per_step": 512,
        "flops": {"per_token": 1e6, "per_token_hardware": 1e6},
        "peak_flops": {"per_s": 2.048e10},  # MFU ~0.25
        "files": {
            "config": "config.yaml",
            "metrics": ["metrics/rank0.jsonl"],
            "collectives": [],
            "telemetry": [],
            "traces": [],
            "checkpoints": [],
        },
        "schemas": {
            "metrics": "reftrain.metrics/1",
            "collectives": "reftrain.collectives/1",
            "telemetry": "reftrain.telemetry/1",
        },
    }
    (folder / "run.json").write_bytes(orjson.dumps(manifest))
    return folder


def test_one_corrupt_metrics_line_does_not_disable_the_gate(tmp_path: Path) -> None:
    """The defect: step 1e308, step_time_ms -5, mfu 1e308 on one line made the
    report count 55 steps, not 54, and `check` exit 2 ("MFU must be positive")."""
    clean = _metrics_run(tmp_path / "clean", [])
    corrupt = _metrics_run(tmp_path / "corrupt", [{"step": 1e308, "step_time_ms": -5, "mfu": 1e308}])
    from analyzer.ingest.rundir import read_run_dir

    rd = read_run_dir(corrupt)
    assert len(rd.metrics) == 54 and rd.metrics["step"].tolist() == list(range(54))
    assert rd.warnings == [
        "metrics/rank0.jsonl: 1 line with out-of-range values dropped "
        "(first: line 11, step 1e+308 is outside [0, 9.22337e+18])"
    ]
    code, err, _ = analyzer("check", "--baseline", str(clean), str(corrupt), "--no-cache")
    assert code == 0, err[-3000:]
    assert "1 line with out-of-range values dropped" in err
    _, _, _, doc = _report_doc(corrupt, tmp_path)
    _, _, _, clean_doc = _report_doc(clean, tmp_path)
    doc["run"].pop("run_id"), clean_doc["run"].pop("run_id")
    assert doc == clean_doc  # 54 steps, the clean numbers


@pytest.mark.parametrize(
    "bad, first",
    [
        ({"step": -1}, "step -1 is outside [0, 9.22337e+18]"),
        ({"step": 3.5}, "step 3.5 is not an integer"),
        ({"step": True}, "step True is not an integer"),
        ({"step_time_ms": 0}, "step_time_ms 0 is outside (0, 8.64e+07]"),
        ({"step_time_ms": "fast"}, "step_time_ms 'fast' is not a number"),
        ({"tokens": -5}, "tokens -5 is outside [0, 9.22337e+18]"),
        ({"comm_ms": -1.0}, "comm_ms -1.0 is outside [0, 8.64e+07]"),
    ],
)
def test_metrics_ranges(tmp_path: Path, bad: dict, first: str) -> None:
    from analyzer.ingest.rundir import read_run_dir

    rd = read_run_dir(_metrics_run(tmp_path / "run", [bad, bad]))
    assert len(rd.metrics) == 54
    assert rd.warnings == [f"metrics/rank0.jsonl: 2 lines with out-of-range values dropped (first: line 11, {first})"]


@pytest.mark.parametrize(
    "bad, first",
    [
        ({"mfu": 1e308}, "mfu 1e+308 is outside (0, 10]"),
        ({"mfu": -0.1}, "mfu -0.1 is outside (0, 10]"),
        ({"hfu": 640.0}, "hfu 640.0 is outside (0, 10]"),
        ({"tokens_per_s": -5.0}, "tokens_per_s -5.0 is outside [0, 1e+15]"),
    ],
)
def test_a_derived_ratio_out_of_range_is_withheld_and_the_step_kept(tmp_path: Path, bad: dict, first: str) -> None:
    """A peak measured 1000x low (a CPU peak taken on a loaded machine) puts
    every line's mfu above 10: dropping those lines lost every step of the
    run. The ratio is withheld (null), the two steps stay."""
    from analyzer.ingest.rundir import read_run_dir

    rd = read_run_dir(_metrics_run(tmp_path / "run", [bad, bad]))
    assert len(rd.metrics) == 56 and rd.metrics["step"].tolist().count(99) == 2
    field = next(iter(bad))
    assert rd.metrics.loc[rd.metrics["step"] == 99, field].isna().all()
    assert rd.metrics.loc[rd.metrics["step"] != 99, field].notna().all()
    assert rd.warnings == [f"metrics/rank0.jsonl: {field} withheld on 2 lines, steps kept (first: line 11, {first})"]


def test_integral_floats_are_integers(tmp_path: Path) -> None:
    """json.dumps writes a float count as 400000000.0: an integer, kept."""
    from analyzer.ingest.rundir import read_run_dir

    rd = read_run_dir(_metrics_run(tmp_path / "run", [{"step": 54.0, "mem_bytes": 4e8, "tokens": 512.0}]))
    assert rd.warnings == [] and len(rd.metrics) == 55 and rd.metrics["mem_bytes"].dtype == "int64"


def test_a_fifo_in_a_run_directory_is_named(tmp_path: Path) -> None:
    run = _metrics_run(tmp_path / "run", [])
    manifest = orjson.loads((run / "run.json").read_bytes())
    manifest["files"]["metrics"] = []  # listed from disk, as for a run that failed early
    (run / "run.json").write_bytes(orjson.dumps(manifest))
    os.mkfifo(run / "metrics" / "rank1.jsonl")
    (run / "traces").mkdir()
    os.symlink("rank0.json", run / "traces" / "rank0.json")
    from analyzer.ingest.rundir import read_run_dir

    rd = read_run_dir(run)  # reading the FIFO would block for ever
    assert rd.errors == ["metrics/rank1.jsonl: a FIFO (named pipe), not a regular file; not read"]
    code, err, _ = analyzer("report", str(run), "--no-cache")
    assert code == 0, err
    assert "analyzer: skipped: rank0.json: a symlink loop (too many levels of symbolic links)" in err.splitlines()


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("runs as root, who reads a chmod 000 file: an unreadable file cannot be made here")
    from analyzer.ingest.load import load_traces

    write_run(tmp_path / "t", ranks=2)
    (tmp_path / "t" / "rank1.json.gz").chmod(0)
    ts = load_traces(tmp_path / "t", cache=False)
    assert [str(e) for e in ts.errors] == ["rank1.json.gz: cannot read file: permission denied"]


def test_unreadable_file_line_as_root_simulated(tmp_path: Path, monkeypatch) -> None:
    """The root-proof stand-in for the test above: the access check answers
    "no" for one file, as the kernel does for other users (its line and the
    other ranks' load are what is checked; the real case needs a non-root run)."""
    from analyzer.ingest import locate
    from analyzer.ingest.load import load_traces

    folder = write_run(tmp_path / "t", ranks=2)
    target = folder / "rank1.json.gz"
    real_access = os.access
    monkeypatch.setattr(locate.os, "access", lambda p, mode: False if Path(p) == target else real_access(p, mode))
    ts = load_traces(folder, cache=False)
    assert [str(e) for e in ts.errors] == ["rank1.json.gz: cannot read file: permission denied"]
    assert sorted(ts.ranks) == [0]
