"""Record any PyTorch training loop into a run directory (docs/record.md, docs/rundir.md).

    rec = recorder.open("runs", config=cfg, model=model, optimizer=opt)
    for batch in loader:
        with rec.step(tokens=batch.numel()) as s:
            loss = train_step(batch)
            s.loss = loss
    rec.close()
"""
from recorder.errors import RecorderError
from recorder.run import ProfileSchedule, Recorder, Step, open

__all__ = ["ProfileSchedule", "Recorder", "RecorderError", "Step", "open"]
