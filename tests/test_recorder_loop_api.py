"""The recorder's options for a trainer that does more itself (reftrain is one; docs/record.md,
"A trainer of your own"): a launcher's run directory, the loop's own phase timing, extra step
fields, step listeners, asynchronous saves, its own preemption handling, fields of run.json.

Times are checked by inequalities that sleeps make exact (a sleep lasts at least its duration,
however busy the machine), never by the machine being quiet.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

import recorder
from analyzer.ingest.formats import Flops, Inject, MetricsLine, PeakFlops, RunManifest
from recorder import ProfileSchedule, RecorderError
from tests.recorder_loops import TOKENS, TinyLM, batch

DATA_S, GRAD_SYNC_S, LISTENER_S = 0.03, 0.02, 0.2
NO_PROFILER = ProfileSchedule(enabled=False)
GIVEN = {"flops": Flops(per_token=1.0e6, formula="test"), "peak_flops_per_s": 1.0e12}


def _manifest(run_dir: Path) -> RunManifest:
    return RunManifest.from_json(json.loads((run_dir / "run.json").read_text()))


def _lines(run_dir: Path) -> list[MetricsLine]:
    rel = run_dir / "metrics" / "rank0.jsonl"
    return [MetricsLine.from_json(json.loads(line)) for line in rel.read_text().splitlines()]


def _prepared(runs: Path, name: str = "launched") -> Path:
    """A run directory as a launcher makes it: the folder and its config.yaml."""
    run_dir = runs / name
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("model: tiny\nsteps: 3\n")
    return run_dir


def _own_phases_loop(rec: recorder.Recorder, model: TinyLM, opt: torch.optim.Optimizer, steps: int) -> list[dict]:
    """A loop timing its own phases: the batch fetch (a sleep) as data, forward, backward, a
    gradient sync (a sleep) and the optimizer; returns what step_end returned."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        rec.step_start()
        with rec.phase("data", host_clock=True):
            time.sleep(DATA_S)
            x, y = batch(gen)
        with rec.phase("forward"):
            loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 64), y.reshape(-1))
        with rec.phase("backward"):
            loss.backward()
        with rec.phase("grad_sync"):
            time.sleep(GRAD_SYNC_S)
        with rec.phase("optimizer"):
            opt.step()
            opt.zero_grad()
        out.append(rec.step_end(tokens=TOKENS, loss=loss, extra={"injected_ms": 1.5, "injected_cpu_ms": None}))
    return out


def test_a_launchers_run_directory_and_the_loops_own_phases(tmp_path):
    run_dir = _prepared(tmp_path)
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with recorder.open(
        tmp_path, "launched", model=model, optimizer=opt, existing=True, phase_hooks=False, profile=NO_PROFILER, **GIVEN
    ) as rec:
        returned = _own_phases_loop(rec, model, opt, 3)
    assert rec.run_dir == run_dir
    assert (run_dir / "config.yaml").read_text() == "model: tiny\nsteps: 3\n"  # the launcher's, untouched
    man = _manifest(run_dir)
    assert man.status == "completed" and man.config == {"model": "tiny", "steps": 3}
    lines = _lines(run_dir)
    assert [line.to_json() for line in lines] == returned  # step_end returns the line it wrote
    for line in lines:
        # The data blocks are data wait, the loop's grad_sync block its own phase; each at least its sleep.
        assert line.data_wait_ms >= DATA_S * 1e3 and line.grad_sync_ms >= GRAD_SYNC_S * 1e3
        assert line.forward_ms > 0 and line.backward_ms > 0 and line.optimizer_ms > 0
        assert line.injected_ms == 1.5 and line.injected_cpu_ms is None
        assert line.step_time_ms >= line.data_wait_ms + line.grad_sync_ms + line.forward_ms


def test_without_phase_hooks_the_model_runs_untimed(tmp_path):
    """phase_hooks=False: the model's forward (which sleeps 20 ms) is no phase unless the loop times it."""
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    with recorder.open(
        tmp_path, "p", model=model, optimizer=opt, phase_hooks=False, profile=NO_PROFILER, **GIVEN
    ) as rec:
        for _ in range(2):
            x, y = batch(gen)
            with rec.step(tokens=TOKENS) as s:
                loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 64), y.reshape(-1))
                loss.backward()
                opt.step()
                s.loss = loss
    assert [(r.forward_ms, r.backward_ms, r.optimizer_ms) for r in _lines(rec.run_dir)] == [(0.0, 0.0, 0.0)] * 2


def test_misuse_of_the_loop_options_is_one_error_or_one_line(tmp_path, capsys):
    with pytest.raises(RecorderError, match=r"existing=True\) needs the run directory's name"):
        recorder.open(tmp_path, existing=True)
    with pytest.raises(RecorderError, match=r"nothing: no config.yaml \(not a prepared run directory\)"):
        recorder.open(tmp_path, "nothing", existing=True)
    with pytest.raises(RecorderError, match=r"run_json=\.\.\.\): status not settable"):
        recorder.open(tmp_path, "r", run_json={"status": "completed"})
    assert not (tmp_path / "r").exists()
    with recorder.open(tmp_path, "q", profile=NO_PROFILER, **GIVEN) as rec:
        with pytest.raises(RecorderError, match=r"Recorder.phase\('compute'\): not one of data, forward"):
            rec.phase("compute")
        rec.step_start()
        record = rec.step_end(tokens=TOKENS, extra={"bogus_ms": 1.0})
    assert record is not None and "bogus_ms" not in record
    err = capsys.readouterr().err
    assert "recorder: step_end(extra={'bogus_ms': ...}): not one of injected_ms" in err


def test_step_listeners_get_each_record_outside_every_steps_clock(tmp_path):
    """Each listener sleeps LISTENER_S. The steps' windows are disjoint within the loop's wall time and
    hold no listener, so their sum is at most that wall time less every listener's sleep; with the
    listeners inside the steps it would exceed it (by all but the last listener)."""
    seen: list[dict] = []

    def listener(record: dict) -> None:
        seen.append(record)
        time.sleep(LISTENER_S)

    steps = 3
    with recorder.open(tmp_path, "l", profile=NO_PROFILER, on_step=[listener], **GIVEN) as rec:
        t0 = time.perf_counter()
        for i in range(steps):
            rec.step_start()
            rec.step_end(tokens=TOKENS, loss=float(i))
        wall_ms = (time.perf_counter() - t0) * 1e3
    assert [r["loss"] for r in seen] == [0.0, 1.0, 2.0]
    assert sum(r["step_time_ms"] for r in seen) <= wall_ms - steps * LISTENER_S * 1e3


def test_an_asynchronous_save_is_recorded_when_its_write_completes(tmp_path):
    polls: list[bool] = []
    complete = {"now": False}

    def done(wait: bool) -> bool:
        polls.append(wait)
        return wait or complete["now"]

    with recorder.open(tmp_path, "a", profile=NO_PROFILER, **GIVEN) as rec:
        for i in range(4):
            rec.step_start()
            rec.step_end(tokens=TOKENS)
            if i == 0:
                with rec.saving():
                    time.sleep(0.01)
                    rec.save_pending(done)
            if i == 1:
                assert not _manifest(rec.run_dir).checkpoint_saves  # still writing: not recorded
                complete["now"] = True  # the write completes during step 2: recorded after it
            if i == 2:
                saves = _manifest(rec.run_dir).checkpoint_saves
                assert [(s.step, s.mode) for s in saves] == [(1, "async")]
                assert saves[0].complete_s >= saves[0].stall_s >= 0.01
    assert polls == [False, False]  # after steps 1 and 2; never waited for, nor polled again once recorded


def test_the_next_save_and_close_wait_for_the_one_in_flight(tmp_path):
    waited: list[int] = []

    def pending(step: int):
        return lambda wait: wait and not waited.append(step)

    with recorder.open(tmp_path, "w", profile=NO_PROFILER, **GIVEN) as rec:
        for i in range(2):
            rec.step_start()
            rec.step_end(tokens=TOKENS)
            with rec.saving():
                rec.save_pending(pending(i + 1))
            assert waited == list(range(1, i + 1))  # the previous save was waited for on entering
    assert waited == [1, 2]  # close waited for the last
    assert [(s.step, s.mode) for s in _manifest(rec.run_dir).checkpoint_saves] == [(1, "async"), (2, "async")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_loop_that_handles_the_stop_itself(tmp_path, sig):
    """exit_on_preempt=False: the recorder saves through on_preempt, closes the run preempted with what
    on_preempt said it saved, and returns; the loop sees rec.closed. SIGINT too when asked for."""
    saved: list[int] = []

    def final_save(steps_done: int) -> str:
        saved.append(steps_done)
        return f"checkpoint ckpt{steps_done}"

    previous = signal.getsignal(sig)
    rec = recorder.open(
        tmp_path,
        "stop",
        profile=NO_PROFILER,
        on_preempt=final_save,
        exit_on_preempt=False,
        preempt_signals=(signal.SIGTERM, signal.SIGINT),
        **GIVEN,
    )
    ran = 0
    for i in range(6):
        rec.step_start()
        if i == 2:
            os.kill(os.getpid(), sig)  # no KeyboardInterrupt for SIGINT: the recorder's handler has it
        rec.step_end(tokens=TOKENS)
        ran += 1
        if rec.closed:
            break
    assert signal.getsignal(sig) is previous
    assert ran == 3 and saved == [3] and rec.status == "preempted"
    man = _manifest(rec.run_dir)
    assert man.status == "preempted" and [s.step for s in man.checkpoint_saves] == [3]
    last = man.attempts[-1]
    name = signal.Signals(sig).name
    assert (last.status, last.cause, last.exit_codes) == (
        "preempted",
        f"preempted: {name} received; stopped after step 2 with checkpoint ckpt3",
        [0],
    )


def test_run_json_fields_from_the_loop_a_typed_peak_and_no_telemetry(tmp_path):
    peak = PeakFlops(per_s=2.5e12, source="table", detail="a datasheet", dtype="bf16")
    inject = Inject(slow_rank=None, delay_ms=None, slowdown=1.5)
    with recorder.open(
        tmp_path,
        "fields",
        steps=12,
        flops=GIVEN["flops"],
        peak_flops_per_s=peak,
        telemetry_interval_ms=None,
        profile=ProfileSchedule(wait=5, warmup=1, active=2, repeat=1),
        run_json={"command": ["trainer", "--fast"], "inject": inject, "tokens_per_step": 4096},
    ) as rec:
        opened = _manifest(rec.run_dir)
        rec.step_start()
        rec.step_end(tokens=TOKENS)
        inject.measured = {"injected_ms": [3.0]}
        rec.close(run_json={"inject": inject})
    assert opened.command == ["trainer", "--fast"] and opened.tokens_per_step == 4096
    assert opened.profiled_steps == [5, 6, 7]  # the planned window (warm-up and active), before any step
    assert opened.telemetry_note == "telemetry disabled (recorder.open(telemetry_interval_ms=None))"
    man = _manifest(rec.run_dir)
    assert man.peak_flops == peak
    assert man.inject is not None and man.inject.slowdown == 1.5 and man.inject.measured == {"injected_ms": [3.0]}
    assert man.profiled_steps == []  # closed after step 0: no step ran in the window
