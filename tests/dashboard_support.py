"""Runs folders for the dashboard tests (AppTest, browser, bench).

``build_runs_dir(dst)`` copies the committed example runs from ``traces/``
(real 2-rank reftrain runs on CPU: a normal one and one with rank 1 slowed
down) and adds the cases a runs folder meets in practice:

* ``gpu-traces``: a foreign folder of two synthetic GPU Kineto traces with
  exact timings (communication kernels, overlap, idle);
* ``bad-truncated``: a trace folder whose rank 1 trace is a cut-off gzip;
* ``bad-no-manifest``: a reftrain run directory without its run.json.

Always a copy: the analyzer writes its Parquet cache beside the traces, and
tests must not touch the repository's examples.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "traces"
GOOD_RUN = "example-ddp-w2"
SLOW_RUN = "example-ddp-w2-slow-rank1"
GPU_RUN = "gpu-traces"
TRUNCATED_RUN = "bad-truncated"
NO_MANIFEST_RUN = "bad-no-manifest"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def write_gpu_traces(folder: Path) -> None:
    """Two ranks, two ProfilerSteps of 1000 us each (synthetic, exact).

    Per step on each rank: a 600 us GEMM on stream 7 from the step start,
    an NCCL all-reduce on stream 20 from 400 to 800 us (200 us overlapped,
    200 us exposed), then idle. Rank 1's GEMM is 650 us long and its
    all-reduce starts 50 us later. So: HTA overlap 50% on rank 0 (200 of
    400 us) and 200/350 = 57.1% on rank 1; exposed communication 20% and
    15% of the step. Every kernel has its launch event, as in real traces.
    """
    from synth import KinetoTrace

    folder.mkdir(parents=True, exist_ok=True)
    for rank, gemm_us, comm_shift_us in ((0, 600, 0), (1, 650, 50)):
        t = KinetoTrace(rank=rank, world_size=2)
        for i, step in enumerate((3, 4)):
            base = 100 + 1000 * i
            t.step(step, base, 1000)
            t.kernel("sm90_xmma_gemm_bf16", base, gemm_us, launch_us=base - 20)
            t.kernel(
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                base + 400 + comm_shift_us,
                400 - comm_shift_us,
                stream=20,
                args=t.comm_args("allreduce", 1 << 20),
                launch_us=base + 300,
            )
        t.write(folder / f"rank{rank}.pt.trace.json.gz")


def build_runs_dir(dst: Path) -> Path:
    """A runs folder with the example runs and the bad cases (see module doc)."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in (GOOD_RUN, SLOW_RUN):
        shutil.copytree(EXAMPLES / name, dst / name, ignore=shutil.ignore_patterns(".analyzer-cache"))
    write_gpu_traces(dst / GPU_RUN)
    truncated = dst / TRUNCATED_RUN
    truncated.mkdir()
    for src in sorted((EXAMPLES / GOOD_RUN / "traces").glob("rank*.json.gz")):
        rank = src.name.split(".")[0]
        data = src.read_bytes()
        (truncated / f"{rank}.json.gz").write_bytes(data if rank == "rank0" else data[: len(data) // 3])
    shutil.copytree(
        EXAMPLES / GOOD_RUN, dst / NO_MANIFEST_RUN, ignore=shutil.ignore_patterns(".analyzer-cache", "run.json")
    )
    return dst


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dashboard_command(runs_dir: Path, port: int) -> list[str]:
    """The installed `dashboard` console script (falls back to the module)."""
    script = Path(sys.executable).parent / "dashboard"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "dashboard.cli"]
    return head + [str(runs_dir), "--port", str(port)]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    """Poll Streamlit's /_stcore/health until it answers ok."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dashboard exited with {proc.returncode} before becoming healthy")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=5) as resp:
                if resp.status == 200 and resp.read().strip() == b"ok":
                    return
        except OSError as exc:
            last = exc
        time.sleep(0.25)
    raise TimeoutError(f"dashboard not healthy at {url} after {timeout_s:.0f} s ({last})")


def start_dashboard(runs_dir: Path, log_path: Path, timeout_s: float = 120.0) -> tuple[subprocess.Popen, str]:
    """Start `dashboard RUNS_DIR --port P`, wait for health; returns (process, url)."""
    port = free_port()
    with open(log_path, "w") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            dashboard_command(runs_dir, port), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout_s)
    except BaseException:
        stop_dashboard(proc)
        raise
    return proc, url


def stop_dashboard(proc: subprocess.Popen) -> None:
    """Terminate the server we started (by its own pid) and reap it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


@pytest.fixture(autouse=True)
def fresh_caches():
    """Streamlit's caches emptied around each test (an autouse fixture for the dashboard test modules that import it)."""
    import streamlit as st

    st.cache_data.clear()
    st.cache_resource.clear()
    yield
    st.cache_data.clear()
    st.cache_resource.clear()


MANY_RANKS_RUN = "many-ranks"
MANY_WORLD = 96
MANY_STRAGGLER = 37
MANY_STEP_US, MANY_SLOW_STEP_US, MANY_PERIOD_US = 10_000, 13_000, 14_000


def write_many_rank_traces(folder: Path, world: int = MANY_WORLD, straggler: int = MANY_STRAGGLER) -> None:
    """`world` tiny synthetic GPU traces (six 10 ms steps each; exact, one common clock).

    Per step on every rank: a 6 ms GEMM on stream 7 from the step start and an
    NCCL all-reduce on stream 20 from 4 to 8 ms. Rank `straggler`'s steps are
    13 ms: its GEMM runs 9 ms and it joins the all-reduce 3 ms late, at 7 ms;
    the all-reduce ends at 8 ms on every rank (1 ms of transfer once all
    are there), so the others wait 3 ms at each collective and its step time
    is 1.3x the median. Steps start every 14 ms on every rank.
    """
    from synth import KinetoTrace

    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        slow = rank == straggler
        t = KinetoTrace(rank=rank, world_size=world)
        for i in range(6):
            base = 100 + MANY_PERIOD_US * i
            t.step(10 + i, base, MANY_SLOW_STEP_US if slow else MANY_STEP_US)
            t.kernel("sm90_xmma_gemm_bf16", base, 9_000 if slow else 6_000, launch_us=base - 20)
            start = base + (7_000 if slow else 4_000)
            t.kernel(
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                start,
                base + 8_000 - start,
                stream=20,
                args=t.comm_args("allreduce", 1 << 20),
                launch_us=start - 100,
            )
        t.write(folder / f"rank{rank}.pt.trace.json.gz")


# Runs that link outside the runs folder (docs/dashboard.md, "The runs folder is the boundary").
# Every outside file holds a marker that must appear nowhere on any page.
OUTSIDE_MARKER = "OUTSIDE_SECRET_5d1e"
PASSWD = Path("/etc/passwd")
LINKED_RUNS = {
    "link-trace": "rank1.pt.trace.json.gz",  # a trace folder whose rank 1 is an outside trace
    "link-passwd": "rank1.json",  # a trace folder whose rank 1 is /etc/passwd
    "link-manifest": "run.json",  # a reftrain run whose run.json is an outside JSON file
    "link-metrics": "metrics/rank0.jsonl",  # a reftrain run whose metrics file is outside
    "link-subfolder": "traces",  # a reftrain run whose traces folder is outside
    "link-deep": "checkpoints/step4/extra",  # a folder three levels down
}


def build_linked_runs(runs: Path, outside: Path) -> dict[str, Path]:
    """The runs of :data:`LINKED_RUNS` in `runs` (the value: the path below the run that links out),
    linking into `outside` (made here) and to /etc/passwd; returns the outside file each run's link reaches."""
    from synth import KinetoTrace

    outside.mkdir(parents=True)
    secret = KinetoTrace(rank=1, world_size=2)
    secret.step(3, 100, 1000)
    secret.kernel(f"{OUTSIDE_MARKER}_kernel", 100, 600, launch_us=80)
    secret.write(outside / "secret.pt.trace.json.gz")
    (outside / "secret.json").write_text(
        json.dumps({"schema": "reftrain.run/1", f"{OUTSIDE_MARKER}_key": OUTSIDE_MARKER})
    )
    (outside / "metrics").mkdir()
    (outside / "metrics" / "rank0.jsonl").write_text(json.dumps({"step": 1, f"{OUTSIDE_MARKER}_metric": 1.0}) + "\n")
    (outside / "traces").mkdir()
    secret.write(outside / "traces" / "rank1.step7.json.gz")
    (outside / "notes.json").write_text(json.dumps({OUTSIDE_MARKER: 1}))

    for name in ("link-trace", "link-passwd"):
        write_gpu_traces(runs / name)
        (runs / name / "rank1.pt.trace.json.gz").unlink()
    (runs / "link-trace" / "rank1.pt.trace.json.gz").symlink_to(outside / "secret.pt.trace.json.gz")
    (runs / "link-passwd" / "rank1.json").symlink_to(PASSWD)
    for name in ("link-manifest", "link-metrics", "link-subfolder", "link-deep"):
        shutil.copytree(EXAMPLES / GOOD_RUN, runs / name, ignore=shutil.ignore_patterns(".analyzer-cache"))
    (runs / "link-manifest" / "run.json").unlink()
    (runs / "link-manifest" / "run.json").symlink_to(outside / "secret.json")
    (runs / "link-metrics" / "metrics" / "rank0.jsonl").unlink()
    (runs / "link-metrics" / "metrics" / "rank0.jsonl").symlink_to(outside / "metrics" / "rank0.jsonl")
    shutil.rmtree(runs / "link-subfolder" / "traces")
    (runs / "link-subfolder" / "traces").symlink_to(outside / "traces")
    (runs / "link-deep" / "checkpoints" / "step4").mkdir(parents=True)
    (runs / "link-deep" / "checkpoints" / "step4" / "extra").symlink_to(outside)
    return {
        "link-trace": outside / "secret.pt.trace.json.gz",
        "link-passwd": PASSWD,
        "link-manifest": outside / "secret.json",
        "link-metrics": outside / "metrics" / "rank0.jsonl",
        "link-subfolder": outside / "traces" / "rank1.step7.json.gz",
        "link-deep": outside / "notes.json",
    }
