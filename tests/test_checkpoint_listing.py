"""run.json lists the complete checkpoints on disk however the run ended.

A run killed at step 432 with 21 complete checkpoints must not record
``files.checkpoints: []``: each save rewrites the list as it completes, and
the launcher's ``mark_failed`` lists what is on disk.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recorder import manifest

REPO = Path(__file__).resolve().parent.parent


def _process_tree(root: int) -> list[int]:
    """``root`` and all its descendants, from /proc (Linux).

    torchrun's agent starts each rank in a session of its own, so killing
    the launcher's process group leaves the ranks training: the tree has to
    be collected before the kill."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_bytes()
        except OSError:
            continue
        children.setdefault(int(stat[stat.rindex(b")") + 2 :].split()[1]), []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def _kill_tree(proc: subprocess.Popen) -> None:
    for pid in _process_tree(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def _running_manifest(run: Path) -> None:
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("run: {name: null}\n")
    manifest.write_json(
        run / "run.json",
        {
            "schema": manifest.SCHEMA,
            "run_id": run.name,
            "status": "running",
            "start_time": manifest.utc_now(),
            "files": {
                "config": "config.yaml",
                "metrics": ["metrics/rank0.jsonl"],
                "collectives": [],
                "telemetry": [],
                "traces": [],
                "checkpoints": [],
            },
            "schemas": manifest.SCHEMAS,
        },
    )


def _checkpoint(run: Path, step: int, complete: bool = True) -> None:
    d = run / "checkpoints" / f"step{step}"
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(b"x")
    if complete:
        (d / ".metadata").write_bytes(b"m")


def test_failed_run_lists_complete_checkpoints(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _running_manifest(run)
    for step in (20, 40, 100, 420):
        _checkpoint(run, step)
    _checkpoint(run, 440, complete=False)  # killed mid-save: no .metadata, never listed
    (run / "checkpoints" / "stepx").mkdir()  # not a checkpoint name: ignored, not a crash
    manifest.mark_failed(run, "rank 1 exited with signal 9", ["reftrain"], 2)
    m = json.loads((run / "run.json").read_text())
    assert m["status"] == "failed"
    # Sorted by step number, not text (step100 after step40).
    assert m["files"]["checkpoints"] == [
        "checkpoints/step20",
        "checkpoints/step40",
        "checkpoints/step100",
        "checkpoints/step420",
    ]
    assert m["files"]["metrics"] == ["metrics/rank0.jsonl"]  # the rest of files is kept


def test_record_checkpoints_rewrites_only_the_list(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _running_manifest(run)
    _checkpoint(run, 2)
    manifest.record_checkpoints(run)
    m = json.loads((run / "run.json").read_text())
    assert m["files"]["checkpoints"] == ["checkpoints/step2"] and m["status"] == "running"
    assert m["files"]["metrics"] == ["metrics/rank0.jsonl"]
    manifest.record_checkpoints(tmp_path / "no-manifest-yet")  # before rank 0 wrote run.json: nothing to do


@pytest.mark.slow
def test_sigkilled_run_lists_its_checkpoints(tmp_path: Path) -> None:
    """A real run killed with SIGKILL (nobody gets to mark it failed) lists the
    checkpoints it completed. The kill lands at an arbitrary point, possibly
    between a save's .metadata and its run.json update, so the newest
    complete checkpoint may be missing from the list; every older one must be
    there (on the old code the list is empty)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reftrain",
            "--nproc",
            "1",
            "--runs-dir",
            str(tmp_path),
            "--run-name",
            "killed",
            "--preset",
            "tiny",
            "--steps",
            "5000",
            "--checkpoint-every",
            "2",
            "--set",
            "profile.enabled=false",
            "--set",
            "telemetry.enabled=false",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    run = tmp_path / "killed"
    deadline = time.monotonic() + 600  # a loaded 2-core machine starts torch slowly; the wait ends as soon as it can
    try:
        while len(manifest.complete_checkpoints(run)) < 4:
            assert proc.poll() is None, f"reftrain ended early: {proc.stderr.read().decode()[-2000:]}"
            assert time.monotonic() < deadline, "no 4 checkpoints within 600 s"
            time.sleep(0.2)
    finally:
        _kill_tree(proc)
    on_disk = manifest.complete_checkpoints(run)
    listed = json.loads((run / "run.json").read_text())["files"]["checkpoints"]
    assert len(on_disk) >= 4
    assert listed in (on_disk, on_disk[:-1]), (listed, on_disk)
