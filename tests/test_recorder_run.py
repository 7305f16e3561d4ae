"""The recorder on a plain loop: the run directory it writes, and the analyzer reading it unchanged."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.api import analyze
from analyzer.ingest.formats import MetricsLine, RunManifest
from recorder import ProfileSchedule
from tests.recorder_loops import DATA_SLEEP_S, FLOPS_PER_TOKEN, FORWARD_SLEEP_S, PEAK, TOKENS, train

STEPS = 10
REPO = Path(__file__).resolve().parent.parent


def _lines(path: Path) -> list[MetricsLine]:
    return [MetricsLine.from_json(json.loads(line)) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("runs")
    # The profiler's window: steps 2 (warm-up) and 3-4 (traced), written to traces/step4/.
    rec = train(runs, STEPS, profile=ProfileSchedule(wait=2, warmup=1, active=2, repeat=1))
    return rec.run_dir


def test_the_run_directory_has_every_file_the_format_names(run_dir):
    man = RunManifest.from_json(json.loads((run_dir / "run.json").read_text()))
    assert man.status == "completed" and man.error is None
    assert man.run_id == "plain" and man.world_size == 1 and man.steps == STEPS and man.start_step == 0
    assert man.tokens_per_step == TOKENS
    assert man.config == {"lr": 0.1, "steps": STEPS}
    assert (run_dir / "config.yaml").read_text() == "lr: 0.1\nsteps: 10\n"
    assert man.params is not None and man.params.total == 64 * 16 + 16 * 64 + 64
    assert man.params.embedding == 64 * 16
    assert man.files.metrics == ["metrics/rank0.jsonl"]
    assert man.files.collectives == []  # one process: no collectives, no file
    assert man.files.traces == ["traces/step4/rank0.pt.trace.json.gz"]
    assert (run_dir / "traces/step4/rank0.pt.trace.json.gz").is_file()
    assert man.profiled_steps == [2, 3, 4]
    assert man.collective_timing == "none: not a distributed run"
    assert [a.status for a in man.attempts] == ["completed"]
    beat = json.loads((run_dir / "heartbeat/rank0.json").read_text())
    assert (beat["schema"], beat["step"], beat["phase"]) == ("reftrain.heartbeat/1", STEPS - 1, "done")


def test_each_step_has_one_record_with_its_phases(run_dir):
    lines = _lines(run_dir / "metrics/rank0.jsonl")
    assert [r.step for r in lines] == list(range(STEPS))
    for r in lines:
        assert r.tokens == TOKENS and r.rank == 0 and r.attempt == 0
        assert r.loss is not None and r.lr == 0.1
        # Sleeps give lower bounds whatever the machine's load: the forward pass sleeps, and
        # (from the second step on) the loop sleeps before the step's compute starts.
        assert r.forward_ms >= FORWARD_SLEEP_S * 1e3
        assert r.backward_ms > 0 and r.optimizer_ms > 0
        # The phases are disjoint parts of the step, measured on one clock.
        assert r.data_wait_ms + r.forward_ms + r.backward_ms + r.optimizer_ms <= r.step_time_ms
        assert r.tokens_per_s == pytest.approx(TOKENS / (r.step_time_ms / 1e3))
        assert r.mfu == pytest.approx(TOKENS * FLOPS_PER_TOKEN / (r.step_time_ms / 1e3 * PEAK))
        assert r.mem_kind == "cpu_rss" and r.mem_bytes > 0
        assert r.profiled == (r.step in (2, 3, 4))
    assert all(r.data_wait_ms >= DATA_SLEEP_S * 1e3 for r in lines[1:])


def test_the_analyzer_reads_it_unchanged(run_dir):
    run = analyze(run_dir, cache=False)
    assert run.kind == "reftrain" and run.errors == []
    lines = [r for r in _lines(run_dir / "metrics/rank0.jsonl") if r.step >= 3 and r.step not in (2, 3, 4)]
    assert run.mfu.source == "manifest"
    expected = statistics.median(TOKENS * FLOPS_PER_TOKEN / (r.step_time_ms / 1e3 * PEAK) for r in lines)
    assert run.mfu.median == pytest.approx(expected)
    good = run.goodput()
    assert good is not None and good.attempts == 1
    assert good.productive_s + sum(good.lost_s.values()) == pytest.approx(good.wall_s)
    # Data wait is the loop's sleep before each step after the first, at least.
    assert good.lost_s["data_wait"] >= (STEPS - 1) * DATA_SLEEP_S


@pytest.mark.parametrize(
    "verb",
    [
        ["report"],
        ["suggest"],
        ["check", "{run}", "--baseline", "{run}"],
        ["history"],
        ["export", "--to", "csv", "{tmp}/export"],
    ],
)
def test_every_analyzer_command_reads_it(run_dir, tmp_path, verb):
    args = [a.format(run=run_dir, tmp=tmp_path) for a in verb]
    target = [str(run_dir.parent)] if verb == ["history"] else ([] if "check" in verb else [str(run_dir)])
    done = subprocess.run(
        [sys.executable, "-m", "analyzer.cli", args[0], *target, *args[1:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    if verb == ["report"]:
        assert "MFU:" in done.stdout and "source: manifest" in done.stdout
    if verb == ["history"]:
        assert "plain" in done.stdout


def test_the_loop_in_docs_record_md_runs_as_written(tmp_path, monkeypatch):
    """docs/record.md's first example, executed with a tiny model: what it tells a user to add works."""
    import re

    import torch

    from tests.recorder_loops import TinyLM, batch

    text = (REPO / "docs" / "record.md").read_text()
    example = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = TinyLM()
    names = {
        "cfg": {"lr": 0.1},
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "loader": [batch(gen) for _ in range(4)],
        "loss_fn": lambda logits, y: torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()),
        "torch": torch,
    }
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "docs/record.md", "exec"), names)
    (run_dir,) = (tmp_path / "runs").iterdir()
    man = RunManifest.from_json(json.loads((run_dir / "run.json").read_text()))
    assert man.status == "completed" and man.steps == 4 and man.tokens_per_step == 32
    assert [r.step for r in _lines(run_dir / "metrics/rank0.jsonl")] == [0, 1, 2, 3]
    assert analyze(run_dir, cache=False).errors == []


def test_reftrains_launcher_imports_the_recorder_without_torch():
    """reftrain's command line validates a config before any rank starts, without torch; it uses
    the recorder's torch-free modules (manifest, heartbeat, ranks), so importing them must not import torch."""
    code = (
        "import sys, reftrain.cli, recorder, recorder.manifest, recorder.heartbeat, recorder.ranks; "
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr[-2000:]


@pytest.mark.parametrize("ddp_comm_hook", [True, False])
def test_ddp_comm_hook_false_leaves_ddps_own_all_reduce(tmp_path, ddp_comm_hook):
    """`ddp_comm_hook=False` (docs/record.md, "Overhead"): no hook on the DDP model, its bucket
    all-reduces untimed, and run.json says so; with the default, each step's bucket is one record."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import recorder

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(8, 8))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        rec = recorder.open(
            tmp_path / "runs",
            name="ddp",
            model=model,
            optimizer=opt,
            profile=ProfileSchedule(enabled=False),
            peak_flops_per_s=PEAK,
            ddp_comm_hook=ddp_comm_hook,
        )
        with rec:
            for _ in range(3):
                with rec.step(tokens=4) as s:
                    s.loss = model(torch.ones(4, 8)).square().mean()
                    s.loss.backward()
                    opt.step()
                    opt.zero_grad()
        hook = model._get_ddp_logging_data().get("comm_hook")
    finally:
        dist.destroy_process_group()
    man = RunManifest.from_json(json.loads((rec.run_dir / "run.json").read_text()))
    records = [json.loads(line) for line in (rec.run_dir / "collectives" / "rank0.jsonl").read_text().splitlines()]
    bucket_steps = [r["step"] for r in records if r["kind"] == "all_reduce" and r["step"] >= 0]
    if ddp_comm_hook:
        assert man.collective_timing.startswith("DDP comm hook") and hook
        assert bucket_steps == [0, 1, 2]
    else:
        assert man.collective_timing.startswith("not DDP's bucket all-reduces (recorder.open(ddp_comm_hook=False)")
        assert not hook and bucket_steps == []
