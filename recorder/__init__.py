"""Record any PyTorch training loop into a run directory (docs/record.md, docs/rundir.md)."""
