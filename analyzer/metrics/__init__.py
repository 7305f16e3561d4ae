"""Pure metric functions over the ingest tables: MFU and FLOPs, hardware peaks, breakdown, overlap, kernels, stragglers, throughput, timeline (docs/metrics.md)."""
