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
    return subprocess.run(
        [sys.executable, "-m", "reftrain", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


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
    msg = one_error_line(
        reftrain(
            "--nproc", "2", "--set", "model.d_model=100", "--set", "model.n_heads=3", "--runs-dir", "runs", cwd=tmp_path
        )
    )
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
    assert msg == (
        f"run directory {Path('runs') / 'mine'} already exists; "
        "reftrain never overwrites a run (choose another --run-name)"
    )
    assert (existing / "run.json").read_text() == "{}" and sorted(existing.iterdir()) == [existing / "run.json"]


def test_slow_rank_outside_world(tmp_path: Path) -> None:
    msg = one_error_line(
        reftrain(
            "--nproc", "2", "--inject-slow-rank", "2", "--inject-delay-ms", "10", "--runs-dir", "runs", cwd=tmp_path
        )
    )
    assert msg == "config: inject.slow_rank=2 but the world has 2 ranks"


def test_unknown_flag(tmp_path: Path) -> None:
    msg = one_error_line(reftrain("--nprocs", "2", cwd=tmp_path))
    assert msg.startswith("unrecognized arguments: --nprocs 2")


def test_resume_without_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    msg = one_error_line(reftrain("--resume", str(run), cwd=tmp_path))
    assert msg.startswith(f"--resume {run}: no complete checkpoint under")


# ------------------------------------------- repeated configs repeat the world size
EXAMPLE_RUN = Path(__file__).resolve().parent.parent / "traces" / "example-ddp-w2"


def _planned(monkeypatch, capsys, *argv: str, environ: dict | None = None) -> tuple[str, int | None, str]:
    """Run reftrain's main() up to the launch: ("launch", nproc) or ("here", world size), and stderr.

    ``_launch`` (torch.distributed.run) and ``train.run`` are replaced by
    recorders, so nothing trains; everything before them is the real CLI.
    """
    from reftrain import cli, train

    seen: list = []
    monkeypatch.setattr(cli, "_launch", lambda cfg, nproc, *rest: seen.append(("launch", nproc)) or 0)
    monkeypatch.setattr(train, "run", lambda cfg, *rest: seen.append(("here", cfg.parallel.world_size)))
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in (environ or {}).items():
        monkeypatch.setenv(key, value)
    assert cli.main(list(argv)) == 0, capsys.readouterr().err
    assert len(seen) == 1
    return seen[0][0], seen[0][1], capsys.readouterr().err


def test_repeated_config_of_a_two_rank_run_starts_two_ranks(monkeypatch, capsys, tmp_path: Path) -> None:
    """The issue's case: ``--config RUN/config.yaml`` of a 2-rank run trained 1 rank, silently.

    The example run's config.yaml predates ``parallel.world_size``: the
    world comes from its run.json (``world_size: 2``).
    """
    if not EXAMPLE_RUN.is_dir():
        pytest.skip(f"{EXAMPLE_RUN} not in this checkout")
    how, nproc, err = _planned(
        monkeypatch, capsys, "--config", str(EXAMPLE_RUN / "config.yaml"), "--runs-dir", str(tmp_path)
    )
    assert (how, nproc) == ("launch", 2)
    assert "starting 2 local ranks, the config's parallel.world_size" in err


def test_world_size_is_saved_and_repeated(monkeypatch, capsys, tmp_path: Path) -> None:
    from reftrain.config import Config, apply_set, resolve, to_yaml

    cfg = Config()
    apply_set(cfg, "model.preset=tiny")
    resolve(cfg, 3)  # what the launcher does before writing config.yaml
    assert "world_size: 3" in to_yaml(cfg)
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))
    config = str(tmp_path / "config.yaml")
    assert _planned(monkeypatch, capsys, "--config", config)[:2] == ("launch", 3)
    how, nproc, err = _planned(monkeypatch, capsys, "--config", config, "--nproc", "1")
    assert (how, nproc) == ("launch", 1) and "--nproc 1 replaces the config's parallel.world_size=3" in err
    # Under torchrun the job's WORLD_SIZE wins, said once by rank 0.
    how, world, err = _planned(monkeypatch, capsys, "--config", config, environ={"RANK": "0", "WORLD_SIZE": "4"})
    assert (how, world) == ("here", 4) and "torchrun started 4 ranks" in err
    # A config that never recorded a world (hand-written) still trains one rank here, without a note.
    plain = tmp_path / "plain.yaml"
    plain.write_text("model: {preset: tiny}\n")
    assert _planned(monkeypatch, capsys, "--config", str(plain)) == ("here", 1, "")


def test_print_config_shows_the_recorded_world_size(tmp_path: Path) -> None:
    if not EXAMPLE_RUN.is_dir():
        pytest.skip(f"{EXAMPLE_RUN} not in this checkout")
    proc = reftrain("--config", str(EXAMPLE_RUN / "config.yaml"), "--print-config", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "  world_size: 2\n" in proc.stdout


def test_world_size_below_one_is_an_error(tmp_path: Path) -> None:
    assert one_error_line(reftrain("--set", "parallel.world_size=0", "--print-config", cwd=tmp_path)) == (
        "config: parallel.world_size=0 must be > 0"
    )
