"""Bad input to `reftrain`: one line on stderr naming the problem, exit status 1, nothing created.

These fail in the command line before any rank starts (the config module does
not import torch), so each case costs one short Python start-up.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def reftrain(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reftrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("reftrain: error: ")
    return lines[0].removeprefix("reftrain: error: ")


def test_unknown_key_in_set(tmp_path: Path) -> None:
    msg = one_error_line(reftrain("--nproc", "2", "--runs-dir", "runs", "--set", "model.depth=3", cwd=tmp_path))
    assert msg.startswith("--set model.depth=3: unknown config key 'model.depth'")
    assert "n_layers" in msg  # lists the known keys
    assert not (tmp_path / "runs").exists()


def test_unknown_key_in_config_file(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("train:\n  steps: 5\n  stpes: 7\n")
    msg = one_error_line(reftrain("--config", "c.yaml", "--runs-dir", "runs", cwd=tmp_path))
    assert msg.startswith("c.yaml: unknown config key 'train.stpes'")


def test_unknown_section_in_toml(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text("[trainer]\nsteps = 5\n")
    msg = one_error_line(reftrain("--config", "c.toml", cwd=tmp_path))
    assert msg.startswith("c.toml: unknown config section 'trainer'")


def test_wrong_type(tmp_path: Path) -> None:
    msg = one_error_line(reftrain("--set", "train.steps=many", cwd=tmp_path))
    assert msg == "--set train.steps=many: train.steps='many' is not an integer"


def test_heads_not_dividing_width(tmp_path: Path) -> None:
    msg = one_error_line(reftrain("--nproc", "2", "--set", "model.d_model=100", "--set", "model.n_heads=3",
                                  "--runs-dir", "runs", cwd=tmp_path))
    assert msg == "config: model.d_model=100 is not divisible by model.n_heads=3"
    assert not (tmp_path / "runs").exists()


def test_missing_data_file(tmp_path: Path) -> None:
    msg = one_error_line(reftrain("--nproc", "2", "--data", "nowhere/tokens.bin", "--runs-dir", "runs", cwd=tmp_path))
    assert msg == "data.path: nowhere/tokens.bin: no such file"


def test_unwritable_runs_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    msg = one_error_line(reftrain("--nproc", "2", "--runs-dir", str(blocker / "runs"), cwd=tmp_path))
    assert msg == f"run.runs_dir: cannot create {blocker / 'runs'}: Not a directory"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_runs_dir(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    runs.chmod(0o500)
    try:
        msg = one_error_line(reftrain("--nproc", "2", "--runs-dir", str(runs), cwd=tmp_path))
    finally:
        runs.chmod(0o700)
    assert msg == f"run.runs_dir: {runs} is not writable"


def test_existing_run_dir_is_never_overwritten(tmp_path: Path) -> None:
    existing = tmp_path / "runs" / "mine"
    existing.mkdir(parents=True)
    (existing / "run.json").write_text("{}")
    msg = one_error_line(reftrain("--nproc", "2", "--runs-dir", "runs", "--run-name", "mine", cwd=tmp_path))
    assert msg == (f"run directory {Path('runs') / 'mine'} already exists; "
                   "reftrain never overwrites a run (choose another --run-name)")
    assert (existing / "run.json").read_text() == "{}" and sorted(existing.iterdir()) == [existing / "run.json"]


def test_slow_rank_outside_world(tmp_path: Path) -> None:
    msg = one_error_line(reftrain("--nproc", "2", "--inject-slow-rank", "2", "--inject-delay-ms", "10",
                                  "--runs-dir", "runs", cwd=tmp_path))
    assert msg == "config: inject.slow_rank=2 but the world has 2 ranks"


def test_unknown_flag(tmp_path: Path) -> None:
    msg = one_error_line(reftrain("--nprocs", "2", cwd=tmp_path))
    assert msg.startswith("unrecognized arguments: --nprocs 2")


def test_resume_without_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    msg = one_error_line(reftrain("--resume", str(run), cwd=tmp_path))
    assert msg.startswith(f"--resume {run}: no complete checkpoint under")
