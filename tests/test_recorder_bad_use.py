"""Bad use of the recorder is one clear line, and the run directory stays valid with the right status.

Each case: what the user sees (one line on stderr, or their own exception
unchanged), what run.json says, and that the analyzer still reads the run.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
import torch

import recorder
from analyzer.api import analyze
from analyzer.ingest.formats import RunManifest
from recorder import ProfileSchedule
from tests.recorder_loops import TOKENS, train


def _manifest(run_dir: Path) -> RunManifest:
    return RunManifest.from_json(json.loads((run_dir / "run.json").read_text()))


def _steps(run_dir: Path, rel: str = "metrics/rank0.jsonl") -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / rel).read_text().splitlines()]


def _recorder_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(("recorder:", "rank "))]


def test_a_step_started_twice_is_one_line_and_the_second_start_is_ignored(tmp_path, capsys):
    def twice(rec, i):
        if i == 2:
            rec.step_start()  # the loop's own `with rec.step()` starts step 2 again

    rec = train(tmp_path, 4, on_step=twice, profile=ProfileSchedule(enabled=False))
    lines = _recorder_lines(capsys.readouterr().err)
    assert lines == ["recorder: step_start called twice for step 2 (no step_end between): the second is ignored"]
    assert _steps(rec.run_dir) == [0, 1, 2, 3]
    assert _manifest(rec.run_dir).status == "completed"


def test_a_step_ended_without_a_start_is_one_line_and_ignored(tmp_path, capsys):
    def stray_end(rec, i):
        if i == 1:
            rec.step_end(tokens=TOKENS)

    rec = train(tmp_path, 3, on_step=stray_end, profile=ProfileSchedule(enabled=False))
    assert _recorder_lines(capsys.readouterr().err) == ["recorder: step_end without step_start (step 1): ignored"]
    assert _steps(rec.run_dir) == [0, 1, 2]


def test_a_step_never_ended_is_not_recorded_and_the_run_still_completes(tmp_path, capsys):
    model = torch.nn.Linear(4, 4)
    with recorder.open(tmp_path, name="open-step", model=model, profile=ProfileSchedule(enabled=False)) as rec:
        rec.step_start()
        rec.step_end(tokens=4, loss=1.0)
        rec.step_start()  # the loop stops here: the step has no end
    man = _manifest(rec.run_dir)
    assert man.status == "completed" and _steps(rec.run_dir) == [0]
    assert man.steps == 1
    assert analyze(rec.run_dir, cache=False).errors == []


def test_a_loop_that_marks_no_step_leaves_a_completed_empty_run(tmp_path):
    with recorder.open(tmp_path, name="no-steps", profile=ProfileSchedule(enabled=False)) as rec:
        pass
    man = _manifest(rec.run_dir)
    assert man.status == "completed" and man.files.metrics == ["metrics/rank0.jsonl"]
    assert (rec.run_dir / "metrics/rank0.jsonl").read_text() == ""


def test_the_users_loop_raising_fails_the_run_with_its_error_and_keeps_the_steps(tmp_path, capsys):
    def boom(rec, i):
        if i == 3:
            raise ValueError("bad batch 3")

    with pytest.raises(ValueError, match="bad batch 3"):  # the user's exception, unchanged
        train(tmp_path, 6, on_step=boom, profile=ProfileSchedule(enabled=False))
    run_dir = tmp_path / "plain"
    man = _manifest(run_dir)
    assert man.status == "failed"
    assert re.fullmatch(r"ValueError: bad batch 3 \(test_recorder_bad_use\.py:\d+\)", man.error)
    assert man.attempts[-1].status == "failed"
    assert _steps(run_dir) == [0, 1, 2]
    assert analyze(run_dir, cache=False).run_manifest.status == "failed"


def test_a_step_raising_inside_the_step_block_fails_the_run(tmp_path):
    model = torch.nn.Linear(4, 4)
    with pytest.raises(RuntimeError, match="device lost"):
        with recorder.open(tmp_path, name="in-step", model=model, profile=ProfileSchedule(enabled=False)) as rec:
            with rec.step(tokens=4) as s:
                s.loss = model(torch.ones(1, 4)).sum()
            with rec.step(tokens=4):
                model(torch.ones(1, 4))
                raise RuntimeError("device lost")
    man = _manifest(rec.run_dir)
    assert man.status == "failed" and man.error.startswith("RuntimeError: device lost")
    assert _steps(rec.run_dir) == [0]


def test_sigterm_saves_the_final_checkpoint_and_ends_the_run_preempted(tmp_path, capsys):
    saved: list[int] = []

    def final_checkpoint(steps_done: int) -> None:
        torch.save({"steps": steps_done}, tmp_path / "ckpt.pt")
        saved.append(steps_done)

    def scheduler(rec, i):
        if i == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives before step 3; the loop stops after it

    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exited:
        train(tmp_path, 8, on_step=scheduler, on_preempt=final_checkpoint, profile=ProfileSchedule(enabled=False))
    assert exited.value.code == 0
    assert signal.getsignal(signal.SIGTERM) is previous  # the user's handler is back
    assert saved == [4] and torch.load(tmp_path / "ckpt.pt") == {"steps": 4}
    run_dir = tmp_path / "plain"
    man = _manifest(run_dir)
    assert man.status == "preempted"
    assert _steps(run_dir) == [0, 1, 2, 3]
    assert [(c.step, c.attempt) for c in man.checkpoint_saves] == [(4, 0)]
    assert man.checkpoint_saves[0].stall_s > 0
    assert man.attempts[-1].status == "preempted" and "SIGTERM" in man.attempts[-1].cause
    assert _recorder_lines(capsys.readouterr().err) == [
        "recorder: rank 0: SIGTERM received: stopping after this step with the final checkpoint"
    ]
    good = analyze(run_dir, cache=False).goodput()
    assert good.preempted and good.lost_s["checkpoint"] == pytest.approx(man.checkpoint_saves[0].stall_s)


def test_a_profiler_window_that_cannot_be_written_costs_the_window_not_the_run(tmp_path, capsys, monkeypatch):
    def disk_full(self, path):
        Path(path).write_bytes(b"\x1f\x8b partial")  # what a full disk leaves behind
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", disk_full)
    rec = train(tmp_path, 5, profile=ProfileSchedule(wait=1, warmup=1, active=1, repeat=1))
    trace = rec.run_dir / "traces/step2/rank0.pt.trace.json.gz"
    assert _recorder_lines(capsys.readouterr().err) == [
        f"rank 0: {trace}: cannot write the profiler trace: No space left on device"
    ]
    assert not trace.exists()
    man = _manifest(rec.run_dir)
    assert man.status == "completed" and man.files.traces == []
    assert _steps(rec.run_dir) == [0, 1, 2, 3, 4]
    run = analyze(rec.run_dir, cache=False)
    assert run.errors == [] and run.mfu.source == "manifest"


def test_an_existing_run_name_is_one_error_and_the_old_run_is_untouched(tmp_path):
    rec = train(tmp_path, 2, profile=ProfileSchedule(enabled=False))
    before = (rec.run_dir / "metrics/rank0.jsonl").read_bytes()
    with pytest.raises(recorder.RecorderError) as err:
        train(tmp_path, 2, profile=ProfileSchedule(enabled=False))
    assert str(err.value) == (
        f"run directory {rec.run_dir} already exists; the recorder never overwrites a run (choose another name=)"
    )
    assert (rec.run_dir / "metrics/rank0.jsonl").read_bytes() == before


def test_a_restarted_attempt_writes_its_own_files_into_the_same_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    first = train(tmp_path, 3, profile=ProfileSchedule(enabled=False))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    # The restarted loop resumes from a checkpoint taken after 2 steps and runs steps 2 and 3.
    second = train(tmp_path, 2, start_step=2, profile=ProfileSchedule(enabled=False))
    assert second.run_dir == first.run_dir
    man = _manifest(first.run_dir)
    assert [(a.attempt, a.status, a.resumed_from_step) for a in man.attempts] == [
        (0, "completed", 0),
        (1, "completed", 2),
    ]
    assert man.max_restarts == 2
    assert man.files.metrics == ["metrics/rank0.jsonl", "metrics/attempt1/rank0.jsonl"]
    assert _steps(first.run_dir, "metrics/attempt1/rank0.jsonl") == [2, 3]
    good = analyze(first.run_dir, cache=False).goodput()
    assert good.attempts == 2 and good.recomputed_steps == 1  # step 2 ran in both attempts


def test_a_ddp_model_with_its_own_comm_hook_keeps_it(tmp_path):
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = DDP(torch.nn.Linear(4, 4))
        model.register_comm_hook(dist.group.WORLD, allreduce_hook)
        with recorder.open(tmp_path, name="own-hook", model=model, profile=ProfileSchedule(enabled=False)) as rec:
            with rec.step(tokens=4) as s:
                s.loss = model(torch.ones(2, 4)).sum()
                s.loss.backward()
        man = _manifest(rec.run_dir)
        assert man.status == "completed"
        assert man.collective_timing == (
            "not DDP's bucket all-reduces (the model has its own comm hook, allreduce_hook); "
            "torch.distributed collective functions wrapped"
        )
        assert model._get_ddp_logging_data().get("comm_hook") == "allreduce_hook"
    finally:
        dist.destroy_process_group()


def test_a_full_disk_under_the_step_records_is_one_line_and_training_goes_on(tmp_path, capsys, monkeypatch):
    from recorder.instrument import JsonlWriter

    real_flush = JsonlWriter.flush
    trained: list[int] = []

    def disk_full_from_step_2(self):
        if self.path.name == "rank0.jsonl" and self.path.parent.name == "metrics" and len(trained) > 2:
            raise OSError(28, "No space left on device")
        real_flush(self)

    def count(rec, i):
        trained.append(i)

    monkeypatch.setattr(JsonlWriter, "flush", disk_full_from_step_2)
    rec = train(tmp_path, 5, on_step=count, profile=ProfileSchedule(enabled=False))
    assert trained == [0, 1, 2, 3, 4]  # every step of the user's loop ran
    assert _recorder_lines(capsys.readouterr().err) == [
        f"recorder: rank 0: {rec.run_dir / 'metrics/rank0.jsonl'}: cannot write the step records from step 2 on: "
        "No space left on device; training goes on unrecorded"
    ]
    monkeypatch.setattr(JsonlWriter, "flush", real_flush)
    assert _manifest(rec.run_dir).status == "completed"
