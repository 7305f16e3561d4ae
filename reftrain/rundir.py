"""reftrain's run directory: its default name and its creation from the config (recorder.manifest writes it)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from recorder import manifest
from reftrain.config import Config, to_yaml


def default_run_name(cfg: Config, world_size: int) -> str:
    """`YYYYmmdd-HHMMSS-<preset>-<strategy>-w<world>` (local time)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{cfg.model.preset}-{cfg.parallel.strategy}-w{world_size}"


def create_run_dir(cfg: Config, world_size: int) -> Path:
    """Create RUNS_DIR/<name>/ with config.yaml; never reuses an existing directory.

    An explicit `run.name` that exists is an error; a generated one gets a `-2`,
    `-3`, ... suffix. config.yaml stores `run.name: null`, so `reftrain --config`
    on it repeats the run into a new directory.
    """
    saved = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, name=None))
    return manifest.create_run_dir(
        Path(cfg.run.runs_dir),
        cfg.run.name or default_run_name(cfg, world_size),
        explicit=cfg.run.name is not None,
        config_yaml=to_yaml(saved),
        runs_label="run.runs_dir",
        writer="reftrain",
        name_option="--run-name",
    )
