"""The fault-injection flags in-process (no ranks): where each fires, when it is refused
or warned about, and that a repeated or resumed run does not re-arm it
(reftrain/faults.py, reftrain/cli.py; the jobs that really crash: tests/test_reftrain_restart.py)."""

from __future__ import annotations

import pytest

from reftrain import cli, faults, rundir
from reftrain.config import Config, apply_set, resolve
from reftrain.errors import ReftrainError


def tiny(*sets: str) -> Config:
    cfg = Config()
    for assignment in ("model.preset=tiny", "train.steps=6", "train.checkpoint_every=2", *sets):
        apply_set(cfg, assignment)
    return resolve(cfg, 2)


class Died(Exception):
    pass


@pytest.fixture
def no_exit(monkeypatch):
    """os._exit of the fault raises instead, with the exit status."""

    def fake_exit(code: int) -> None:
        raise Died(code)

    monkeypatch.setattr(faults.os, "_exit", fake_exit)


def test_crash_in_save_fires_in_the_save_of_its_step(no_exit) -> None:
    """--crash-step 4 --crash-in-save dies in the save of checkpoint step4 (the state after 4 steps), no other."""
    cfg = tiny("fault.crash_rank=1", "fault.crash_step=4", "fault.crash_in_save=true")
    f = faults.Faults(cfg.fault, rank=1)
    for step in range(7):
        f.step_start(step)  # a crash in the save is not one at a step's start
    f.in_save(2)
    f.in_save(6)
    with pytest.raises(Died) as died:
        f.in_save(4)
    assert died.value.args == (faults.CRASH_EXIT_CODE,)
    faults.Faults(cfg.fault, rank=0).in_save(4)  # another rank: nothing


@pytest.mark.parametrize(
    "sets, message",
    [
        (
            ("fault.crash_step=3",),
            "no checkpoint is saved at fault.crash_step=3 (train.checkpoint_every=2 saves steps 2, 4",
        ),
        (("fault.crash_step=4", "train.checkpoint_every=0"), "train.checkpoint_every=0 saves none"),
        (("fault.crash_step=0",), "no checkpoint is saved at fault.crash_step=0"),
    ],
)
def test_crash_in_save_at_a_step_without_a_save_is_refused(sets: tuple[str, ...], message: str) -> None:
    with pytest.raises(ReftrainError, match=message.replace("(", r"\(").replace(".", r"\.")):
        tiny("fault.crash_rank=1", "fault.crash_in_save=true", *sets)


def test_faults_that_cannot_fire_are_refused() -> None:
    with pytest.raises(ReftrainError, match=r"fault\.crash_step=7 cannot fire: the run ends at train\.steps=6"):
        tiny("fault.crash_rank=1", "fault.crash_step=7")
    with pytest.raises(ReftrainError, match=r"fault\.hang_step=9 cannot fire"):
        tiny("fault.hang_rank=0", "fault.hang_step=9")
    with pytest.raises(ReftrainError, match="fault.crash_in_save needs fault.crash_rank and fault.crash_step"):
        tiny("fault.crash_in_save=true")
    tiny("fault.crash_rank=1", "fault.crash_step=6")  # train.steps: after the last step, allowed


def test_a_fault_before_the_start_of_a_resumed_run_is_warned_about() -> None:
    cfg = tiny("fault.crash_rank=1", "fault.crash_step=2", "fault.hang_rank=1", "fault.hang_step=5")
    f = faults.Faults(cfg.fault, rank=1)
    assert f.unreachable(4) == ["fault.crash_step=2 cannot fire: this run starts at step 4"]
    assert f.unreachable(2) == []


def _fault_injected_run(tmp_path):
    """A run directory as a fault-injected run leaves it: config.yaml, run.json, one checkpoint."""
    cfg = tiny(
        "fault.crash_rank=1",
        "fault.crash_step=4",
        "fault.crash_in_save=true",
        f"run.runs_dir={tmp_path}",
        "run.name=crashed",
    )
    run = rundir.create_run_dir(cfg, 2)
    (run / "run.json").write_text("{}")
    (run / "checkpoints" / "step2").mkdir(parents=True)
    (run / "checkpoints" / "step2" / ".metadata").write_bytes(b"")
    return run


def _build(*argv: str) -> tuple[Config, list[str]]:
    notes: list[str] = []
    cfg, _, _ = cli.build_config(cli.build_parser().parse_args(list(argv)), None, notes)
    return cfg, notes


def test_resume_and_config_of_a_fault_injected_run_do_not_rearm_it(tmp_path) -> None:
    run = _fault_injected_run(tmp_path)
    assert "crash_rank: 1" in (run / "config.yaml").read_text()  # the run records what it injected
    for argv in (["--resume", str(run)], ["--config", str(run / "config.yaml")]):
        cfg, notes = _build(*argv)
        assert (cfg.fault.crash_rank, cfg.fault.crash_step, cfg.fault.crash_in_save) == (None, None, False)
        assert notes == [
            f"{' '.join(argv)}: the run's fault injection (fault.crash_rank=1, fault.crash_step=4, "
            "fault.crash_in_save=True) is not repeated; pass the flags again to inject it"
        ]
    # Flags on the command line inject again.
    cfg, _ = _build("--resume", str(run), "--crash-rank", "0", "--crash-step", "5")
    assert (cfg.fault.crash_rank, cfg.fault.crash_step, cfg.fault.crash_in_save) == (0, 5, False)


def test_a_users_own_config_file_keeps_its_faults(tmp_path) -> None:
    """A config written by hand (no run.json beside it) means what it says."""
    path = tmp_path / "recovery.yaml"
    path.write_text("fault:\n  hang_rank: 1\n  hang_step: 3\n")
    cfg, notes = _build("--config", str(path))
    assert (cfg.fault.hang_rank, cfg.fault.hang_step, notes) == (1, 3, [])


# ---------------------------------------------------------------------------
# The first failure: the rank whose process exited first
# ---------------------------------------------------------------------------


class _Failure:
    def __init__(self, pid: int) -> None:
        self.pid = pid


def test_failure_order_is_exit_order_then_rank() -> None:
    failures = {0: _Failure(100), 1: _Failure(101), 2: _Failure(102), 3: _Failure(103)}
    times = {100: 5.25, 101: 5.0, 103: 5.25}  # rank 2's exit was not seen
    assert cli.failure_order(failures, times.get) == [1, 0, 3, 2]
    assert cli.failure_order(failures, lambda pid: None) == [0, 1, 2, 3]


def test_exit_times_follow_the_order_children_exit(tmp_path) -> None:
    """Two real children; the second is killed only once the first's exit was recorded, so the
    order is fixed by construction, not by timing."""
    import subprocess
    import sys
    import time

    from reftrain.exits import ExitTimes

    watcher = ExitTimes(interval_s=0.01)
    assert watcher.supported, "this test needs Linux pidfds"
    watcher.start()
    first = subprocess.Popen([sys.executable, "-c", "pass"])
    second = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        deadline = time.monotonic() + 60
        while watcher.exit_time(first.pid) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watcher.exit_time(first.pid) is not None and watcher.exit_time(second.pid) is None
        killed_at = time.time()
        second.kill()
        while watcher.exit_time(second.pid) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watcher.exit_time(first.pid) < killed_at <= watcher.exit_time(second.pid)
    finally:
        watcher.stop()
        second.kill()
        first.wait()
        second.wait()
