"""Record any PyTorch training loop into a run directory (docs/record.md, docs/rundir.md).

    rec = recorder.open("runs", config=cfg, model=model, optimizer=opt)
    for batch in loader:
        with rec.step(tokens=batch.numel()) as s:
            loss = train_step(batch)
            s.loss = loss
    rec.close()

The names below come from recorder.run, imported on first use: the torch-free
modules (recorder.manifest, recorder.heartbeat, recorder.ranks) are imported by
reftrain's launcher, which must not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recorder.errors import RecorderError

if TYPE_CHECKING:
    from recorder.run import ProfileSchedule, Recorder, Step, open

__all__ = ["ProfileSchedule", "Recorder", "RecorderError", "Step", "open"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from recorder import run

        return getattr(run, name)
    raise AttributeError(f"module 'recorder' has no attribute {name!r}")
